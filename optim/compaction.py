"""Twin-guided compaction: take GPUs away from a twin-accepted placement while the twin agrees.

Greedy packs with a surrogate trained on a grid of slot counts (Amax 8, 16, 32, 64, ...) whose
starvation classifier is cautious near the 90 % line, so an accepted placement can often lose a
GPU: 32 rank-32 adapters at high rates starve (surrogate) at Amax 16 and 32 and take two GPUs,
while the twin serves them on one at Amax 21-32; the 64 adapters of
``paper-llama-rlow-qmixed-n64`` fit one GPU at Amax 23-26 only.

One attempt with ``k`` GPUs (the types of the placement's first ``k``):

1. the adapters are spread load-balanced over the ``k`` GPUs (largest offered load first onto the
   least-loaded GPU, ``balance.balanced_members``); when that spread fails and the adapters have
   several ranks (GPUs of one profile), steps 2-4 are tried again on a spread in rank tiers
   (``balance.rank_tiered_members``: the high-rank adapters on as few GPUs as their load needs,
   filled with the heaviest smallest-rank adapters, each GPU's share of the load in proportion to
   the twin's saturated throughput at its rank), since a server pays for its largest rank on
   every slot (``instances/small/small-18``: 2 GPUs that way, none load-balanced);
2. each GPU's Amax is searched over every integer 1..min(adapters + 1, the largest Amax its rank
   starts with) by ``amax_search.twin_best_amax`` (coarse scan, then integer refinement around
   the best probe), all with the workload that GPU draws in verification (seed = instance seed +
   GPU index); it keeps the Amax of highest twin throughput when the twin accepts it there;
3. a GPU with no accepted Amax whose best score is below ``REBALANCE_FROM`` ends the attempt;
   where the rejected GPUs are all near acceptance and the GPUs' scores average at least 1,
   light adapters move from the worst GPU to the best-scoring ones while that raises the worse
   of the two (``_rebalance``: an even spread of the load is not always the feasible one);
4. the whole placement is verified again (``optim.verify``) and taken when accepted.

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

from .amax_search import twin_best_amax, twin_best_score
from .balance import balanced_members, rank_tiered_members
from .capacity import lora_max_throughput
from .feasibility import lora_gpu_lower_bound, raise_bound_to
from .instance import Instance
from .placement import GpuPlan, Placement, plan_gpu
from .verify import verify


REBALANCE_FROM = 0.97        # a balanced attempt is rebalanced when no GPU scores below this
REBALANCE_ADAPTERS = 6       # lightest adapters of the worst GPU tried per move ...
REBALANCE_RECEIVERS = 2      # ... each onto the best-scoring GPUs
REBALANCE_MAX_SEARCHES = 48  # Amax searches one rebalancing may run


def _spreads(inst: Instance, p: Placement, k: int) -> list[tuple[str, list[list[int]]]]:
    """The spreads an attempt with ``k`` GPUs tries, in order (module docstring, step 1): by
    load, then (mixed ranks on GPUs of one profile) by load within rank tiers."""
    out = [("load-balanced", [m for m in balanced_members(inst, inst.adapters, k) if m])]
    profiles = {g.profile for g in p.gpus[:k]}
    if len(profiles) == 1:
        prof = next(iter(profiles))

        def cap(rank: int) -> float:
            return lora_max_throughput(prof, rank, inst.lengths)
        tiers = rank_tiered_members(inst, inst.adapters, k, cap)
        if tiers is not None:
            tiers = [m for m in tiers if m]
            if sorted(map(sorted, tiers)) != sorted(map(sorted, out[0][1])):
                out.append(("load-balanced within rank tiers", tiers))
    return out


def _attempt(inst: Instance, p: Placement, k: int, duration_s: float,
             workers: int | None) -> tuple[Placement, int, str] | None:
    """The placement on ``k`` GPUs of the kinds of ``p``'s first ``k`` (module docstring, one
    attempt, each spread with its rebalancing), verified and accepted, with the adapters its
    rebalancing moved and the spread's name; or None."""
    seen: dict[tuple[int, tuple[int, ...]], tuple[GpuPlan | None, float]] = {}

    def search(g: int, mem: list[int]) -> tuple[GpuPlan | None, float]:
        """GPU ``g`` (of ``p``'s kind at that index) holding ``mem`` at its best Amax, with the
        workload GPU ``g`` draws in verification (seed + index): (the accepted plan or None,
        the best score); shared by the spreads."""
        key = (g, tuple(sorted(mem)))
        if key not in seen:
            ads = [(inst.adapters[i], 1.0) for i in mem]
            draft = plan_gpu(p.gpus[g].gpu_type, p.gpus[g].profile, 1, ads, inst.mean_tokens,
                             max(a.rank for a, _ in ads))
            best, _, score = twin_best_score(inst, draft, inst.seed + g, duration_s, workers)
            seen[key] = (best, score)
        return seen[key]

    for how, members in _spreads(inst, p, k):    # fewer adapters than GPUs: the empty ones go
        got = _try_spread(inst, p, members, search, duration_s, workers)
        if got is not None:
            return got[0], got[1], how
    return None


def _try_spread(inst: Instance, p: Placement, members: list[list[int]], search,
                duration_s: float, workers: int | None) -> tuple[Placement, int] | None:
    """One spread (steps 2-4): each GPU at its best Amax, rebalanced when near, verified."""
    found = []
    for g, mem in enumerate(members):
        best, score = search(g, mem)
        if best is None and score < REBALANCE_FROM:
            return None                  # far from accepted: the spread ends here
        found.append((best, score))
    moves = 0
    if any(b is None for b, _ in found):
        got = _rebalance(inst, members, found, search)
        if got is None:
            return None
        found, moves = got
    cand = verify(p.with_(gpus=tuple(b for b, _ in found)), inst, duration_s=duration_s,
                  workers=workers)
    return (cand, moves) if cand.verdict == "accepted" else None


def _rebalance(inst: Instance, members: list[list[int]], found: list, search
               ) -> tuple[list, int] | None:
    """Move adapters off the rejected GPUs of a balanced attempt until every GPU is accepted:
    (each GPU's accepted plan and score, the moves made), or None when that does not happen
    within ``REBALANCE_MAX_SEARCHES`` Amax searches.

    An even spread of the load need not be the best one: GPUs of different adapters carry
    different loads (``instances/small/small-16``: 48 rank-32 adapters split evenly by load
    score 1.005 and 0.996 at their best Amax; one light adapter moved from the second to the
    first and both are accepted, 2 GPUs where greedy had 3). Only where the GPUs' scores
    average at least 1 (their spare capacity covers the shortfall) and none is below
    ``REBALANCE_FROM``. Each move takes one of the ``REBALANCE_ADAPTERS`` lightest adapters of
    the worst GPU onto one of the ``REBALANCE_RECEIVERS`` best-scoring others, the first move
    that raises the smaller score of the two GPUs above the worst one's (first improvement);
    moves that keep the receiver's rank are tried before those that raise it (lightest adapter
    first, then best-scoring receiver)."""
    scores = [s for _, s in found]
    if sum(scores) < len(scores):
        return None
    members = [list(m) for m in members]
    found = list(found)
    budget, moves = REBALANCE_MAX_SEARCHES, 0
    while any(b is None for b, _ in found):
        w = min(range(len(found)), key=lambda g: (found[g][1], g))
        receivers = sorted((g for g in range(len(found)) if g != w),
                           key=lambda g: (-found[g][1], g))[:REBALANCE_RECEIVERS]
        light = sorted(members[w], key=lambda i: (inst.load_tps(inst.adapters[i]), i))
        top = {g: max(inst.adapters[j].rank for j in members[g]) for g in receivers}
        # moves that keep the receiver's rank first (a higher rank costs it every slot)
        tries = sorted(((i, g) for i in (light[:REBALANCE_ADAPTERS]
                                         if len(members[w]) > 1 else [])
                        for g in receivers),
                       key=lambda ig: inst.adapters[ig[0]].rank > top[ig[1]])
        moved = False
        for i, g in tries:
            if budget < 2:
                return None
            budget -= 2
            rest, more = [j for j in members[w] if j != i], members[g] + [i]
            fw, fg = search(w, rest), search(g, more)
            if min(fw[1], fg[1]) > found[w][1]:
                members[w], members[g], found[w], found[g] = rest, more, fw, fg
                moved, moves = True, moves + 1
                break
        if not moved:
            return None
    return found, moves


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
            got = _attempt(inst, p, p.n_gpus - 1, dur, workers)
            if got is not None:
                smaller, moves, spread = got
                how = (f"{spread} then {moves} light adapter(s) moved off rejected GPUs"
                       if moves else spread)
                changes.append(f"compaction: {p.n_gpus} -> {smaller.n_gpus} GPU(s), {how}, "
                               "each GPU's Amax chosen by the twin "
                               f"({', '.join(str(g.max_loras) for g in smaller.gpus)})")
                p = smaller.with_(repairs=tuple(changes))
                continue
            if p.n_gpus > DRAIN_MAX_GPUS:
                break
            light = sorted((i for i in range(p.n_gpus)
                            if p.gpus[i].n_adapters <= DRAIN_MAX_ADAPTERS),
                           key=lambda i: (p.gpus[i].offered_tps, i))
            smaller = None                  # no GPU light enough: nothing to drain
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
