"""Single-GPU Maxpack search: the most adapters of a given mix one GPU serves without starving.

The rule is the one the shared max-search runs use (data README, ``maxsearch_optimum``): for each
slot value Amax, walk the served-adapter count N upward over the grid (N >= Amax) while the 90 %
rule holds and keep the last passing point; then take the Amax whose kept point has the highest
throughput. A memory error at (Amax, max rank) removes that Amax.

``rule="strict"`` (default, what placement needs) keeps only non-starving points.
``rule="shared"`` reproduces how ``maxsearch_optimum_<model>.csv`` was computed: the first point
of each walk (N = Amax) is kept even when it starves (two of the nine shared optima are such
points, e.g. rates 3.2/1.6/0.025 at N = Amax = 32, which starves).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .lengths import LengthModel
from .metrics import RunMetrics
from .profile import GpuProfile
from .server import ServerConfig, simulate_server
from .workload import Adapter, adapters_from_counts

N_GRID = (8, 16, 32, 64, 96, 128, 160, 192, 256, 320, 384)
AMAX_GRID = (16, 32, 64, 96, 128, 160, 192, 256, 320, 384)


def mix_adapters(n: int, rates: Sequence[float], ranks: Sequence[int], seed: int = 0
                 ) -> list[Adapter]:
    """``n`` adapters with rates and ranks each cycled over their lists, paired at random
    (the shared benchmark shuffles the two cyclic assignments independently)."""
    rank_counts = Counter(ranks[i % len(ranks)] for i in range(n))
    rate_counts = Counter(rates[i % len(rates)] for i in range(n))
    return adapters_from_counts(dict(rank_counts), dict(rate_counts), seed=seed)


@dataclass(frozen=True)
class MaxpackPoint:
    max_loras: int
    served_adapters: int
    metrics: RunMetrics


@dataclass(frozen=True)
class MaxpackResult:
    """Best point and every point evaluated (for tables and plots)."""

    served_adapters: int
    max_loras: int
    throughput_tps: float
    points: tuple[MaxpackPoint, ...] = field(default_factory=tuple)



def check_mix(profile: GpuProfile, rates: Sequence[float], ranks: Sequence[int], who: str) -> None:
    """An adapter mix (rates and ranks cycled over the adapters) ``profile`` can serve:
    ``ValueError`` naming ``who`` when either list is empty or a rank is not supported."""
    if not rates or not ranks:
        raise ValueError(f"{who}: rates and ranks must not be empty")
    unsupported = sorted(set(ranks) - set(profile.supported_ranks))
    if unsupported:
        raise ValueError(f"{who}: rank {unsupported[0]} not supported by profile "
                         f"'{profile.name}' (supported: "
                         f"{', '.join(map(str, profile.supported_ranks))})")


def maxpack_search(profile: GpuProfile, rates: Sequence[float], ranks: Sequence[int],
                   lengths: LengthModel | None = None, duration_s: float = 3600.0,
                   n_grid: Sequence[int] = N_GRID, amax_grid: Sequence[int] = AMAX_GRID,
                   seed: int = 0, client_max_waiting: int | None = None,
                   rule: str = "strict",
                   evaluate: Callable[[int, int], RunMetrics] | None = None,
                   on_point: Callable[[MaxpackPoint], None] | None = None) -> MaxpackResult:
    """Run the search; ``evaluate(amax, n)`` may replace the twin (e.g. by a surrogate).
    ``client_max_waiting`` is passed to :class:`ServerConfig` (the load generator's cap);
    ``on_point`` is called after each evaluated point (progress bars).

    Every rank must be supported by the profile (``ValueError`` otherwise: an unsupported rank
    would make every Amax look like a memory error and the answer 0 adapters)."""
    check_mix(profile, rates, ranks, "maxpack")
    max_rank = max(ranks)

    def twin_eval(amax: int, n: int) -> RunMetrics:
        adapters = mix_adapters(n, rates, ranks, seed=seed)
        cfg = ServerConfig(max_loras=amax, max_lora_rank=max_rank,
                           client_max_waiting=client_max_waiting)
        return simulate_server(profile, adapters, cfg, duration_s, lengths=lengths, seed=seed)

    if rule not in ("strict", "shared"):
        raise ValueError(f"rule must be 'strict' or 'shared', got {rule!r}")
    ev = evaluate or twin_eval
    points: list[MaxpackPoint] = []
    best: MaxpackPoint | None = None
    for amax in amax_grid:
        if profile.kv_tokens(amax, max_rank) is None:
            continue
        kept: MaxpackPoint | None = None
        for n in (x for x in n_grid if x >= amax):
            m = ev(amax, n)
            p = MaxpackPoint(amax, n, m)
            points.append(p)
            if on_point is not None:
                on_point(p)
            if m.memory_error:
                break
            if m.starved:
                if rule == "shared" and kept is None:
                    kept = p
                break
            kept = p
        if kept is not None and (best is None
                                 or kept.metrics.throughput_tps > best.metrics.throughput_tps):
            best = kept
    if best is None:
        return MaxpackResult(0, 0, 0.0, tuple(points))
    return MaxpackResult(best.served_adapters, best.max_loras, best.metrics.throughput_tps,
                         tuple(points))
