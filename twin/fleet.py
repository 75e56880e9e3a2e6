"""Simulate a placement: several GPUs, each its own server, simulated in parallel processes.

An adapter may sit on several GPUs with a routing split ``share`` (fractions summing to 1 over
its GPUs). Routing each request independently at random splits a Poisson stream into independent
Poisson streams of rate ``share x rate``, so every GPU can be simulated on its own.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Sequence

from .cli_support import progress
from .lengths import LengthModel
from .metrics import RunMetrics
from .profile import GpuProfile, load_profile
from .server import ServerConfig, simulate_server
from .workload import Adapter


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU of a placement: its profile, server configuration and (adapter, share) pairs."""

    profile: str
    config: ServerConfig
    adapters: tuple[tuple[Adapter, float], ...]


@dataclass(frozen=True)
class FleetResult:
    """Per-GPU metrics and the placement's verdict (feasible = no GPU starves or fails memory)."""

    per_gpu: tuple[RunMetrics, ...]

    @property
    def feasible(self) -> bool:
        return not any(m.starved or m.memory_error for m in self.per_gpu)

    @property
    def throughput_tps(self) -> float:
        return sum(m.throughput_tps for m in self.per_gpu)

    @property
    def offered_tps(self) -> float:
        return sum(m.offered_tps for m in self.per_gpu)


def check_shares(gpus: Sequence[GpuAssignment], tol: float = 1e-6) -> None:
    """Every adapter's shares must be positive and sum to 1 over the GPUs that serve it."""
    total: dict[str, float] = {}
    for g, gpu in enumerate(gpus):
        if not gpu.adapters:
            raise ValueError(f"gpu {g}: no adapters assigned")
        for a, share in gpu.adapters:
            if not 0.0 < share <= 1.0:
                raise ValueError(f"gpu {g}, adapter '{a.id}': share must be in (0, 1], got {share}")
            total[a.id] = total.get(a.id, 0.0) + share
    for aid, s in total.items():
        if abs(s - 1.0) > tol:
            raise ValueError(f"adapter '{aid}': routing shares sum to {s:.6f}, not 1")


# set by command lines (``optim solve`` without --quiet): a progress bar over simulated GPUs
show_progress = False


def _simulate_one(args: tuple) -> RunMetrics:
    profile, gpu, duration_s, lengths, seed = args
    prof = profile if isinstance(profile, GpuProfile) else load_profile(profile)
    adapters = [replace(a, rate=a.rate * share) for a, share in gpu.adapters]
    return simulate_server(prof, adapters, gpu.config, duration_s, lengths=lengths, seed=seed)


def simulate_fleet(gpus: Sequence[GpuAssignment], duration_s: float = 3600.0,
                   lengths: LengthModel | None = None, seed: int = 0,
                   workers: int | None = None, pool: Executor | None = None,
                   check_routing: bool = True, seeds: Sequence[int] | None = None
                   ) -> FleetResult:
    """Simulate every GPU (GPU ``g`` uses seed ``seed + g``, or ``seeds[g]`` when given) in
    ``workers`` processes (default: all cores; 1 = in this process). Pass ``pool`` to reuse an
    executor across many calls (e.g. a search that verifies one placement after another).
    ``check_routing=False`` runs the GPUs as independent what-if replays (an adapter may then
    appear on several GPUs with any shares); ``seeds`` lets such replays draw the workload a
    given GPU of a placement would see."""
    if check_routing:
        check_shares(gpus)
    if seeds is not None and len(seeds) != len(gpus):
        raise ValueError(f"seeds: {len(seeds)} given for {len(gpus)} GPUs")
    jobs = [(gpu.profile, gpu, duration_s, lengths, seed + g if seeds is None else int(seeds[g]))
            for g, gpu in enumerate(gpus)]
    def shown(results):
        return tuple(progress(results, total=len(jobs), desc="twin replay", unit="GPU",
                              quiet=not show_progress))

    if pool is not None:
        return FleetResult(shown(pool.map(_simulate_one, jobs)))
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(jobs) == 1:
        return FleetResult(shown(_simulate_one(j) for j in jobs))
    ex = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), initializer=_leave_ctrl_c_to_parent)
    try:
        return FleetResult(shown(ex.map(_simulate_one, jobs)))
    finally:   # on Ctrl-C: drop the GPUs not started, wait only for the running ones
        ex.shutdown(wait=True, cancel_futures=True)


def _leave_ctrl_c_to_parent() -> None:
    """Worker start-up: Ctrl-C reaches the parent, which stops the fleet; a worker interrupted
    inside the compiled kernel would print a traceback of its own."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
