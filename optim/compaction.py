"""Twin-guided compaction: take GPUs away from a twin-accepted placement while the twin agrees.

Greedy packs with a surrogate trained on a grid of slot counts (Amax 8, 16, 32, 64, ...) whose
starvation classifier is cautious near the 90 % line, so an accepted placement can often lose a
GPU: 32 rank-32 adapters at high rates starve (surrogate) at Amax 16 and 32 and take two GPUs,
while the twin serves them on one at Amax 21-32; the 64 adapters of
``paper-llama-rlow-qmixed-n64`` fit one GPU at Amax 23-26 only.

One attempt with ``k`` GPUs (the types of the placement's first ``k``):

1. the adapters are spread load-balanced over the ``k`` GPUs (largest offered load first onto the
   least-loaded GPU, ``balance.balanced_members``);
2. each GPU's Amax is searched over every integer 1..min(adapters + 1, the largest Amax its rank
   starts with) by ``amax_search.twin_best_amax`` (coarse scan, then integer refinement around
   the best probe), all with the workload that GPU draws in verification (seed = instance seed +
   GPU index); it keeps the Amax of highest twin throughput when the twin accepts it there;
3. the first GPU with no accepted Amax ends the attempt; otherwise the whole placement is
   verified again (``optim.verify``) and taken when accepted.

Attempts go from ``n - 1`` GPUs down and stop at the first failure or at the twin lower bound
(``feasibility.lora_gpu_lower_bound``, twin-sound): a placement with that many GPUs is optimal
for the twin.

Where the load-balanced spread fails — under a latency SLO the GPUs differ in what they can
carry (many light adapters cost slots and per-adapter work; a p99 ITL bound binds on them long
before the load does), so an even spread of the load is the wrong shape — a *drain* takes one GPU
away at a time instead (placements of at most ``DRAIN_MAX_GPUS`` GPUs; the ``DRAIN_CANDIDATES``
least-loaded GPUs of at most ``DRAIN_MAX_ADAPTERS`` adapters tried in turn; all drains of one
compaction replay at most ``DRAIN_MAX_REQUESTS`` simulated requests, so their cost is bounded
and the same on every machine):

1. the drained GPU's adapters, heaviest first, each move onto another GPU — the
   ``DRAIN_RECEIVERS`` least-loaded ones tried in turn — where the twin accepts it with its new
   adapter at some Amax (searched as in step 2, with the draw of that GPU's index once the
   drained one is gone);
2. every other GPU whose index shifts is searched again at its new index (its draw changes);
3. the whole placement is verified and taken when accepted; drains go on from the result.

Every taken step is recorded in ``Placement.repairs``.
"""

from __future__ import annotations

from .amax_search import twin_best_amax
from .balance import balanced_members
from .feasibility import lora_gpu_lower_bound, raise_bound_to
from .instance import Instance
from .placement import GpuPlan, Placement, plan_gpu
from .verify import verify


def _attempt(inst: Instance, p: Placement, k: int, duration_s: float,
             workers: int | None) -> Placement | None:
    """The placement on ``k`` GPUs of the kinds of ``p``'s first ``k`` (module docstring, one
    attempt), verified and accepted, or None."""
    members = balanced_members(inst, inst.adapters, k)
    plans: list[GpuPlan] = []
    for base, mem in zip(p.gpus[:k], members):
        if not mem:                       # fewer adapters than GPUs
            continue
        ads = [(inst.adapters[i], 1.0) for i in mem]
        rank = max(a.rank for a, _ in ads)
        draft = plan_gpu(base.gpu_type, base.profile, 1, ads, inst.mean_tokens, rank)
        # this GPU's index in the placement is len(plans): verification draws seed + index
        best, _ = twin_best_amax(inst, draft, inst.seed + len(plans), duration_s, workers)
        if best is None:
            return None
        plans.append(best)
    cand = verify(p.with_(gpus=tuple(plans)), inst, duration_s=duration_s, workers=workers)
    return cand if cand.verdict == "accepted" else None


DRAIN_MAX_GPUS = 32       # drains only on placements of at most this many GPUs
DRAIN_MAX_ADAPTERS = 16   # ... and of GPUs holding at most this many adapters
DRAIN_CANDIDATES = 4      # least-loaded GPUs a drain round tries to empty
DRAIN_RECEIVERS = 6       # least-loaded GPUs tried for each moved adapter
DRAIN_MAX_REQUESTS = 2e7  # simulated requests all drains of one compaction may replay


class _Budget:
    """Simulated requests the drains may still replay (a deterministic cap on their cost:
    twin replays of big GPUs over long windows take minutes each)."""

    def __init__(self, requests: float) -> None:
        self.left = float(requests)

    def search(self, inst: Instance, plan: GpuPlan, seed: int, duration_s: float,
               workers: int | None) -> GpuPlan | None:
        """``twin_best_amax`` charged to the budget; None once it is spent."""
        if self.left <= 0:
            return None
        best, runs = twin_best_amax(inst, plan, seed, duration_s, workers)
        self.left -= runs * duration_s * plan.offered_tps / inst.mean_tokens   # requests replayed
        return best


def _drain(inst: Instance, p: Placement, g: int, duration_s: float, workers: int | None,
           budget: _Budget) -> Placement | None:
    """``p`` without GPU ``g`` (module docstring, the drain), verified and accepted, or None."""
    others = [i for i in range(p.n_gpus) if i != g]
    plans = {i: p.gpus[i] for i in others}
    index = {i: k for k, i in enumerate(others)}            # each GPU's index once g is gone
    searched: set[int] = set()
    for a, share in sorted(p.gpus[g].adapters, key=lambda x: (-x[0].rate * x[1], x[0].id)):
        for i in sorted(others, key=lambda i: (plans[i].offered_tps, i))[:DRAIN_RECEIVERS]:
            b = plans[i]
            draft = plan_gpu(b.gpu_type, b.profile, 1, b.adapters + ((a, share),),
                             inst.mean_tokens)
            best = budget.search(inst, draft, inst.seed + index[i], duration_s, workers)
            if best is not None:
                plans[i] = best
                searched.add(i)
                break
        else:
            return None
    for i in others:
        if i not in searched and index[i] != i:
            best = budget.search(inst, plans[i], inst.seed + index[i], duration_s, workers)
            if best is None:
                return None
            plans[i] = best
    cand = verify(p.with_(gpus=tuple(plans[i] for i in others)), inst, duration_s=duration_s,
                  workers=workers)
    return cand if cand.verdict == "accepted" else None


def compact(inst: Instance, placement: Placement, duration_s: float | None = None,
            workers: int | None = None) -> Placement:
    """``placement`` (twin-accepted) with as few GPUs as the attempts of the module docstring
    reach; ``params`` gain ``lower_bound`` (twin-sound, for the window ``duration_s``; where the
    result is one GPU above it, raised by the exclusion checks when they succeed,
    ``feasibility.raise_bound_to``) and ``compaction_attempts``. A placement that is not
    accepted, or splits an adapter over GPUs, is returned unchanged apart from ``params``."""
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    lb = lora_gpu_lower_bound(inst, dur, workers)
    p, tries = placement, 0
    splits = any(share < 1.0 for g in placement.gpus for _, share in g.adapters)
    if placement.verdict == "accepted" and not splits:
        changes = list(placement.repairs)
        budget = _Budget(DRAIN_MAX_REQUESTS)
        while p.n_gpus - 1 >= lb:
            tries += 1
            smaller = _attempt(inst, p, p.n_gpus - 1, dur, workers)
            if smaller is not None:
                changes.append(f"compaction: {p.n_gpus} -> {smaller.n_gpus} GPU(s), "
                               "load-balanced, each GPU's Amax chosen by the twin "
                               f"({', '.join(str(g.max_loras) for g in smaller.gpus)})")
                p = smaller.with_(repairs=tuple(changes))
                continue
            if p.n_gpus > DRAIN_MAX_GPUS:
                break
            light = sorted((i for i in range(p.n_gpus)
                            if p.gpus[i].n_adapters <= DRAIN_MAX_ADAPTERS),
                           key=lambda i: (p.gpus[i].offered_tps, i))
            for g in light[:DRAIN_CANDIDATES]:
                smaller = _drain(inst, p, g, dur, workers, budget)
                if smaller is not None:
                    break
            if smaller is None:
                break
            changes.append(f"compaction: {p.n_gpus} -> {smaller.n_gpus} GPU(s), GPU {g}'s "
                           f"{p.gpus[g].n_adapters} adapter(s) moved onto others, each "
                           "receiving GPU's Amax chosen by the twin")
            p = smaller.with_(repairs=tuple(changes))
    if p.verdict == "accepted" and not splits and p.n_gpus == lb + 1:
        lb = raise_bound_to(inst, lb, p.n_gpus, dur, workers)   # certify where one step is left
    return p.with_(params={**p.params, "lower_bound": lb, "compaction_attempts": tries})


__all__ = ["compact"]
