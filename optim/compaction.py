"""Twin-guided compaction: take GPUs away from a twin-accepted placement while the twin agrees.

Greedy packs with a surrogate trained on a grid of slot counts (Amax 8, 16, 32, 64, ...) whose
starvation classifier is cautious near the 90 % line, so an accepted placement can often lose a
GPU: 32 rank-32 adapters at high rates starve (surrogate) at Amax 16 and 32 and take two GPUs,
while the twin serves them on one at Amax 21-32.

One attempt with ``k`` GPUs (the types of the placement's first ``k``):

1. the adapters are spread load-balanced over the ``k`` GPUs (largest offered load first onto the
   least-loaded GPU, ``greedy.balanced_members``);
2. each GPU is replayed in the twin at ``AMAX_PROBES`` slot counts, log-spaced from
   ``Amax_hi / 32`` to ``Amax_hi`` = min(its adapter count, the largest Amax its rank starts
   with), all with the workload that GPU draws in verification (seed = instance seed + GPU
   index); it keeps the accepted candidate of highest throughput (smaller Amax on ties);
3. the first GPU with no accepted candidate ends the attempt; otherwise the whole placement is
   verified again (``optim.verify``) and taken when accepted.

Attempts go from ``n - 1`` GPUs down and stop at the first failure or at the twin lower bound
(``feasibility.lora_gpu_lower_bound``): a placement with that many GPUs is optimal for the twin.
Every taken step is recorded in ``Placement.repairs``.
"""

from __future__ import annotations

import numpy as np

from twin.fleet import simulate_fleet

from .capacity import max_startable_amax
from .feasibility import lora_gpu_lower_bound
from .greedy import balanced_members
from .instance import Instance
from .placement import GpuPlan, Placement, plan_gpu
from .verify import verify

AMAX_PROBES = 10


def amax_probes(n_adapters: int, amax_hi: int, k: int = AMAX_PROBES) -> list[int]:
    """Up to ``k`` distinct slot counts, log-spaced over [max(1, hi // 32), hi] with
    hi = min(n_adapters, amax_hi), both ends included (empty when hi < 1)."""
    hi = min(int(n_adapters), int(amax_hi))
    if hi < 1:
        return []
    lo = max(1, hi // 32)
    return sorted({int(round(v)) for v in np.geomspace(lo, hi, num=k)} | {hi})


def _probe_gpu(inst: Instance, plan: GpuPlan, seed: int, duration_s: float,
               workers: int | None) -> GpuPlan | None:
    """``plan`` with the Amax the twin accepts at the highest throughput, or None."""
    amaxes = amax_probes(len(plan.adapters), max_startable_amax(plan.profile, plan.max_lora_rank))
    cands = [plan_gpu(plan.gpu_type, plan.profile, a, plan.adapters, inst.mean_tokens,
                      plan.max_lora_rank) for a in amaxes]
    if not cands:
        return None
    jobs = [c.twin_assignment(inst.starvation_threshold) for c in cands]
    res = simulate_fleet(jobs, duration_s=duration_s, lengths=inst.lengths, workers=workers,
                         check_routing=False, seeds=[seed] * len(jobs))
    ok = [(m.throughput_tps, -c.max_loras, j) for j, (c, m) in enumerate(zip(cands, res.per_gpu))
          if not (m.starved or m.memory_error)]
    return cands[max(ok)[2]] if ok else None


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
        best = _probe_gpu(inst, draft, inst.seed + len(plans), duration_s, workers)
        if best is None:
            return None
        plans.append(best)
    cand = verify(p.with_(gpus=tuple(plans)), inst, duration_s=duration_s, workers=workers)
    return cand if cand.verdict == "accepted" else None


def compact(inst: Instance, placement: Placement, duration_s: float | None = None,
            workers: int | None = None) -> Placement:
    """``placement`` (twin-accepted) with as few GPUs as the attempts of the module docstring
    reach; ``params`` gain ``lower_bound`` and ``compaction_attempts``. A placement that is not
    accepted, or splits an adapter over GPUs, is returned unchanged apart from ``params``."""
    lb = lora_gpu_lower_bound(inst)
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    p, tries = placement, 0
    splits = any(share < 1.0 for g in placement.gpus for _, share in g.adapters)
    if placement.verdict == "accepted" and not splits:
        changes = list(placement.repairs)
        while p.n_gpus - 1 >= lb:
            tries += 1
            smaller = _attempt(inst, p, p.n_gpus - 1, dur, workers)
            if smaller is None:
                break
            changes.append(f"compaction: {p.n_gpus} -> {smaller.n_gpus} GPU(s), load-balanced, "
                           "each GPU's Amax chosen by the twin "
                           f"({', '.join(str(g.max_loras) for g in smaller.gpus)})")
            p = smaller.with_(repairs=tuple(changes))
    return p.with_(params={**p.params, "lower_bound": lb, "compaction_attempts": tries})


__all__ = ["AMAX_PROBES", "amax_probes", "compact"]
