"""First-fit decreasing with the twin as the judge of every GPU, at each GPU's best integer Amax.

Greedy packs with a surrogate's verdict on grid Amax values (``optim.greedy``); under a latency
SLO its count-aware capacity table is a prediction, and repair and compaction then move
adapters of that packing. Where the result stays above the twin lower bound, this packing asks
the twin itself: adapters in decreasing load (then rank), each to the first open GPU whose
replay with it added is still accepted at some integer Amax, with the workload verification
draws for that GPU (seed = instance seed + GPU index), else to a new GPU. Measured on
``paper-llama-rhigh-qhigh-n64`` under the loose SLO (p99 TTFT 10 s, p99 ITL 200 ms, 600 s
window): 3 GPUs, the twin lower bound, where greedy's packing, repaired and compacted, took 4.
Greedy runs it under an SLO only: on ``paper-llama-rlow-qhigh-n160`` under the 90 % rule
(3,600 s) it takes greedy's 5 GPUs.

**Checks.** A check first replays the GPU at the Amax that last accepted it and one above
(the GPU only grew by one adapter); only when both are rejected does it search every integer
1..min(adapters + 1, largest startable) (``integer_search.search_max``: coarse scan, then
refinement; replays certain to be rejected stop early). So a rejection is a local verdict, and
a GPU that rejected an adapter is not offered another adapter of the same load and rank: its
content only grows. Both are heuristics of the packing, not of the verdict: the placement is
verified as a whole afterwards (``optim.verify``), as every candidate is.

**Budget.** The packing stops (returns None) once its replays have simulated more than
``max_requests`` requests (expected arrivals of the replayed GPUs over the window: a
deterministic cost, the same on every machine), so it runs on the points where it is
affordable and is skipped elsewhere with a note; and once it needs more GPUs than
``max_gpus`` (greedy passes one fewer than its placement has: only a smaller fleet is of use).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .amax_search import amax_upper, twin_scores
from .instance import Instance
from .integer_search import search_max
from .placement import GpuPlan, Placement, plan_gpu

MAX_REQUESTS = 40_000_000    # simulated requests a packing may spend (1-2 min on one core)


@dataclass
class _Gpu:
    """An open GPU: its adapters, the Amax that last accepted them, the (load, rank) kinds it
    rejected."""

    adapters: list
    amax: int = 1
    rejected: set = field(default_factory=set)


class BudgetSpent(Exception):
    """The packing's replays reached ``max_requests``."""


def twin_first_fit(inst: Instance, duration_s: float | None = None, workers: int | None = None,
                   max_requests: float = MAX_REQUESTS, max_gpus: int | None = None
                   ) -> Placement | None:
    """The twin's first-fit decreasing placement of ``inst`` (module docstring), not yet
    verified, or None when its budget ran out, it needs more than ``max_gpus`` GPUs (a caller
    that has a placement on ``max_gpus + 1`` stops it there) or an adapter is rejected on a GPU
    of its own. One GPU type, whole adapters (``max_homes`` 1) only: None otherwise."""
    if len(inst.gpu_types) != 1 or inst.max_homes != 1 or not inst.adapters:
        return None
    t0 = time.perf_counter()
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    gt = inst.gpu_types[0]
    spent = [0.0]

    def plan(adapters: list, amax: int) -> GpuPlan:
        return plan_gpu(gt.name, gt.profile, amax, [(a, 1.0) for a in adapters],
                        inst.mean_tokens)

    def scores(p: GpuPlan, amaxes: list[int], seed: int) -> list[float]:
        spent[0] += len(amaxes) * sum(a.rate for a, _ in p.adapters) * dur
        if spent[0] > max_requests:
            raise BudgetSpent
        return [s for s, _ in twin_scores(inst, p, amaxes, seed, dur, workers, stop_below=1.0)]

    def accepts(g: int, gpu: _Gpu, adapters: list) -> int | None:
        """An Amax at which GPU ``g`` holding ``adapters`` is accepted, else None."""
        p = plan(adapters, gpu.amax)
        top = amax_upper(p)
        first = [a for a in dict.fromkeys((gpu.amax, gpu.amax + 1)) if 1 <= a <= top]
        seen = dict(zip(first, scores(p, first, inst.seed + g)))
        for a in first:
            if seen[a] >= 1.0:
                return a

        def score(xs: list[int]) -> list[float]:        # the two replayed above are reused
            new = [x for x in xs if x not in seen]
            seen.update(zip(new, scores(p, new, inst.seed + g) if new else []))
            return [seen[x] for x in xs]
        best, s, _ = search_max(score, top)
        return best if s >= 1.0 else None

    order = sorted(inst.adapters, key=lambda a: (-inst.load_tps(a), -a.rank, a.id))
    gpus: list[_Gpu] = []
    try:
        for a in order:
            kind = (round(inst.load_tps(a), 9), a.rank)
            for g, gpu in enumerate(gpus):
                if kind in gpu.rejected:
                    continue
                got = accepts(g, gpu, gpu.adapters + [a])
                if got is not None:
                    gpu.adapters.append(a)
                    gpu.amax = got
                    break
                gpu.rejected.add(kind)
            else:
                if max_gpus is not None and len(gpus) >= max_gpus:
                    return None
                gpu = _Gpu([a])
                got = accepts(len(gpus), gpu, [a])
                if got is None:
                    return None
                gpu.amax = got
                gpus.append(gpu)
    except BudgetSpent:
        return None
    plans = tuple(plan(g.adapters, g.amax) for g in gpus)
    wall = time.perf_counter() - t0
    return Placement(inst.name, "greedy", "solved", plans, wall_time_s=wall,
                     params={"packing": "twin first-fit", "twin_first_fit_requests": spent[0],
                             "placement_wall_s": wall})


__all__ = ["MAX_REQUESTS", "twin_first_fit"]
