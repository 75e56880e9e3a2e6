"""Twin verification: replay every GPU of a placement in the fleet twin and give the verdict.

All GPUs are simulated in parallel (``twin.fleet.simulate_fleet``: local processes by default,
or Ray tasks with ``backend="ray"``, on a local Ray instance or the cluster at ``address``; GPU
``g`` draws its workload with seed ``instance.seed + g`` on either backend, so the verdicts
agree). A GPU that starves (throughput below the instance's threshold x offered) or cannot
start (memory error) makes the placement ``rejected``; otherwise it is ``accepted``. The
placement's shares are checked first: every adapter of the instance must be routed with shares
summing to 1.
"""

from __future__ import annotations

import time
from dataclasses import replace

from twin.fleet import simulate_fleet

from .instance import Instance
from .placement import GpuMetrics, Placement, shares_consistent


def verify(placement: Placement, inst: Instance, duration_s: float | None = None,
           workers: int | None = None, seed: int | None = None, backend: str | None = None,
           address: str | None = None) -> Placement:
    """Return ``placement`` with per-GPU twin metrics, the verdict and the verification time.

    ``duration_s`` defaults to the instance's, ``seed`` to the instance's; ``workers`` processes
    (default: all cores) or, with ``backend="ray"``, Ray tasks (``address``: a cluster; default a
    local Ray instance of ``workers`` CPUs). A placement without GPUs is returned unchanged.
    """
    if not placement.gpus:
        return placement
    problems = shares_consistent(placement.gpus, inst.adapters)
    if problems:
        raise ValueError(f"placement of '{placement.instance}' by {placement.method}: "
                         + "; ".join(problems[:5]))
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    jobs = [g.twin_assignment(inst.judging)
            for g in placement.gpus]
    t0 = time.perf_counter()
    result = simulate_fleet(jobs, duration_s=dur, lengths=inst.lengths,
                            seed=inst.seed if seed is None else seed, workers=workers,
                            backend=backend, address=address)
    wall = time.perf_counter() - t0
    gpus = tuple(replace(g, verified=GpuMetrics.from_run(m))
                 for g, m in zip(placement.gpus, result.per_gpu))
    params = placement.params
    if inst.slo is not None:            # what the verdict judged, for the table and the claim
        params = {**params, "slo": inst.slo.describe(),
                  "slo_bounds": list(inst.slo.judged_bounds())}
    if inst.headroom:                   # twin.headroom: judged with the measured headroom
        params = {**params, "headroom": "the twin's measured headroom (twin.headroom)"}
    if inst.starvation_threshold != 0.9:   # twin.headroom: the headroom verdict's threshold
        params = {**params, "starvation_threshold": inst.starvation_threshold}
    return placement.with_(gpus=gpus, verdict="accepted" if result.feasible else "rejected",
                           verify_wall_s=wall, verify_duration_s=dur, params=params)
