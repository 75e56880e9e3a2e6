"""A lower bound on GPUs from the adapters every GPU must hold, for placements under a latency SLO.

Under a latency SLO each adapter a server holds costs latency, not only throughput: the client
sees token delivery delays that grow with the adapters the server serves (``twin.latency_tail``)
and every distinct adapter of a step adds LoRA work. So a GPU holding many light adapters meets
a p99 ITL bound at a far smaller load than one holding a few heavy ones: on
``paper-llama-rmixed-qmixed-n128`` under p99 TTFT 500 ms / ITL 50 ms one rank-8 adapter carries
about 6,300 tok/s, while every GPU of greedy's accepted placement (7-16 adapters) carries
2,200-2,500. The one-adapter and count-aware caps (``feasibility.count_cap``) let each GPU
concentrate its load on the fewest heavy adapters and leave the light ones to nobody; this bound
makes every adapter sit somewhere.

Soundness. Let ``x_1 >= ... >= x_N`` be the instance's adapter loads. The sorted loads of any
``n`` of them lie in the box ``x_(N-n+i) <= v_i <= x_i``; among the vectors of that box with
total ``E``, ``box_loads`` (every entry at its floor, then the top entries raised to their caps
in turn) is the most concentrated (it majorises each of them), and by the premise of
``count_cap`` it costs the twin least (fewest distinct adapters per step, fewest LoRA tiles,
least slot contention; a second premise: raising a load never costs less). So a GPU of ``n``
adapters carrying ``E`` is accepted only if ``box_loads`` of ``n`` and ``E`` is, at some Amax:
``E <= K(n)``, the largest such load (measured like the carry limits: per verification seed,
bisected over the load with every Amax 1..min(n + 1, largest startable) tried, then the
largest per-seed value or the mean plus ``SPREAD_SIGMAS`` standard deviations, the deviation at
least the one-adapter limit's relative one), at the smallest rank of the instance (a larger
rank only adds work). Fewer adapters carry more: for ``g <= n`` the box vector of ``g`` and ``E``
(zeros added: an adapter without load is no adapter) majorises that of ``n`` and ``E`` (its
floors are lower and it has fewer entries), so ``K(n) <= K(g)`` wherever ``K(g)`` is below
``S(g)``, the ``g`` heaviest loads (the SLO, not the box, set it). A GPU also carries at most
``S(n)`` and at most the one-adapter carry limit. Any placement on ``k`` GPUs holding
``n_1 + ... + n_k = N`` adapters therefore has ``L <= max sum_g cap(n_g)`` over count vectors;
``partition_bound`` finds the least ``k`` for which that maximum (a knapsack over counts)
reaches the load ``L``.
``tests/test_count_bound.py`` checks the premises on sampled GPUs and the knapsack against
brute force.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from twin.lengths import LengthModel
from twin.profile import GpuProfile
from twin.slo import Slo
from twin.workload import Adapter

from .capacity import (BOUND_SEEDS, COUNT_SEEDS, SLO_BRACKET_STEP, SPREAD_SIGMAS, Judging,
                       _cache as _limit_cache, _disk_get, _disk_put, _measurement_pool,
                       _profile, carry_limit, max_startable_amax, slo_key,
                       smallest_startable_rank, twin_fingerprint)

COUNT_BOUND_GRID = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64, 80, 96,
                    128)
COUNT_BOUND_RTOL = 0.005        # bisection resolution of K(n) (relative)
_VERSION = 3                    # bump when the measurement changes (disk cache)
SOLVE_SIM_BUDGET_S = 10_200.0   # a solve measures K(n) anew only where (n + 1) x window <= this


def solve_count_max(duration_s: float) -> int:
    """The largest count whose ``K`` a solve measures anew (its Amax scan replays n + 1
    configurations of the window per probe): 16 at a 600 s window, 1 at 3,600 s; larger
    counts come from the cache only (the studies measure them), so a first solve under an SLO
    stays quick and its bound only weaker."""
    return max(1, int(SOLVE_SIM_BUDGET_S // max(float(duration_s), 1.0)) - 1)


@dataclass(frozen=True)
class CountLimit:
    """``K(n)``: the largest load (tok/s) at which ``n`` adapters with the most concentrated
    loads of their box (``box_loads``) are accepted, per seed and with the spread margin;
    ``box_tps`` is the largest total of the box (the ``n`` heaviest loads)."""

    n_adapters: int
    rank: int
    box_tps: float
    per_seed_tps: tuple[float, ...]
    spread_tps: float
    limit_tps: float


def box_loads(total: float, upper: Sequence[float], lower: Sequence[float]
              ) -> list[float] | None:
    """The most concentrated vector with ``lower[i] <= v[i] <= upper[i]`` (both sorted
    descending, ``lower[i] <= upper[i]``) summing to ``total``: every entry at its floor, then
    the entries from the top raised to their caps in turn; None when no vector of the box sums
    to ``total``. Its every prefix sum is the largest any vector of the box with that total
    has (it majorises them)."""
    lo, up = [float(x) for x in lower], [float(x) for x in upper]
    base, top = sum(lo), sum(up)
    tol = 1e-9 * max(1.0, top)
    if not lo or len(lo) != len(up) or total < base - tol or total > top + tol:
        return None
    out, rest = list(lo), total - base
    for i in range(len(out)):
        x = min(up[i] - lo[i], max(rest, 0.0))
        out[i] += x
        rest -= x
    return out


def _key(prof: GpuProfile, rank: int, upper: Sequence[float], lower: Sequence[float],
         lengths: LengthModel, duration_s: float, seeds: tuple[int, ...], threshold: float,
         slo: Slo | None) -> str:
    blob = json.dumps({"kind": "box", "v": _VERSION, "profile": prof.to_dict(),
                       "rank": rank, "upper": [round(x, 6) for x in upper],
                       "lower": [round(x, 6) for x in lower],
                       "lengths": lengths.to_dict(), "duration_s": float(duration_s),
                       "seeds": list(seeds), "threshold": float(threshold),
                       "sigmas": SPREAD_SIGMAS, "rtol": COUNT_BOUND_RTOL,
                       "twin": twin_fingerprint(prof),
                       "slo": None if slo is None else slo_key(prof, slo)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _accepted_at(prof: GpuProfile, rank: int, loads: Sequence[float], amaxes: Sequence[int],
                 lengths: LengthModel, duration_s: float, seed: int, threshold: float,
                 slo: Slo | None, pool) -> int | None:
    """The first of ``amaxes`` at which a GPU with adapters of these ``loads`` (rank ``rank``)
    is accepted by the twin with workload ``seed``, or None."""
    from twin.fleet import GpuAssignment, simulate_fleet
    per = lengths.mean_input + lengths.mean_output
    ads = tuple((Adapter(f"k{i}", rank, x / per), 1.0) for i, x in enumerate(loads))
    step = 1 if pool is None else 2 * max(1, getattr(pool, "_max_workers", 2) or 2)
    for i in range(0, len(amaxes), step):       # in small batches: stop at the first accepted
        chunk = list(amaxes[i:i + step])
        gpus = [GpuAssignment(prof, Judging(threshold, slo).server_config(int(a), rank), ads)
                for a in chunk]
        res = simulate_fleet(gpus, duration_s=duration_s, lengths=lengths, workers=1,
                             pool=pool, check_routing=False, seeds=[seed] * len(chunk),
                             stop_below=1.0)     # a replay certain to starve stops early
        for a, m in zip(chunk, res.per_gpu):
            if m.accepted:
                return int(a)
    return None


def _seed_limit(prof: GpuProfile, rank: int, upper: Sequence[float], lower: Sequence[float],
                hi: float, lengths: LengthModel, duration_s: float, seed: int, threshold: float,
                slo: Slo | None, pool) -> float:
    """Largest load up to ``hi`` at which the concentrated vector is accepted with ``seed``:
    ``hi`` itself, else bracketed downwards by ``SLO_BRACKET_STEP``, bisected to
    ``COUNT_BOUND_RTOL`` and checked 1 % above (as the carry limits). Where every load tried
    down to the box's floor is rejected, the lowest of them: by the second premise (raising
    a load never costs less) no larger one is accepted. The Amax that last accepted is tried
    first."""
    n = len(upper)
    top = min(n + 1, max_startable_amax(prof, rank))
    order = list(range(1, top + 1))

    def ok(total: float) -> bool:
        loads = box_loads(total, upper, lower)
        if loads is None:                       # outside the box's totals: no such GPU
            return False
        got = _accepted_at(prof, rank, loads, order, lengths, duration_s, seed, threshold,
                           slo, pool)
        if got is not None:                     # the winner first next time
            order.remove(got)
            order.insert(0, got)
        return got is not None

    if ok(hi):
        return hi
    # bracket downwards: at tiny loads a GPU can miss a TTFT bound again (each adapter's
    # first request is a cold start, and few requests make them a large share), so the
    # accepted loads need not reach down to the box's floor
    lo, probe = 0.0, hi
    while lo == 0.0:
        probe /= SLO_BRACKET_STEP
        if probe < sum(lower):
            return hi                           # nothing accepted: the lowest rejected load
        if ok(probe):
            lo = probe
        else:
            hi = probe
    for _ in range(3):                          # bisection, then a check 1 % above
        while hi / lo > 1 + COUNT_BOUND_RTOL:
            mid = math.sqrt(lo * hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        if not ok(lo * 1.01):
            break
        lo, hi = lo * 1.01, hi * 1.25
        while ok(hi):
            lo, hi = hi, hi * 1.25
    return lo


def count_limit(profile: GpuProfile | str, rank: int, n: int, loads_desc: Sequence[float],
                lengths: LengthModel, duration_s: float, seeds: Sequence[int],
                threshold: float, slo: Slo | None, workers: int | None = None,
                measure: bool = True) -> CountLimit | None:
    """``K(n)`` (module docstring) for the instance whose loads, sorted descending, are
    ``loads_desc`` (the box of ``n`` of them: caps the ``n`` heaviest, floors the ``n``
    lightest), measured on the first ``COUNT_SEEDS`` of ``seeds`` and cached on disk beside
    the carry limits (keyed by everything it depends on). ``measure=False``: the cached value
    or None."""
    prof = _profile(profile)
    seeds = tuple(int(s) for s in seeds)
    xs = [float(x) for x in loads_desc]
    if not 1 <= n <= len(xs):
        raise ValueError(f"count_limit: n must be in 1..{len(xs)} (got {n})")
    upper, lower = xs[:n], xs[len(xs) - n:]
    key = _key(prof, rank, upper, lower, lengths, duration_s, seeds, threshold, slo)
    if key in _limit_cache:
        return _limit_cache[key]
    hit = _disk_get(key)
    if hit is not None:
        out = CountLimit(**{**hit, "per_seed_tps": tuple(hit["per_seed_tps"])})
        _limit_cache[key] = out
        return out
    if not measure:
        return None
    one = carry_limit(prof, rank, 1, lengths, duration_s, seeds, threshold, workers, slo)
    box = sum(upper)
    hi = min(box, one.limit_tps)
    with _measurement_pool(workers or os.cpu_count() or 1) as pool:
        per_seed = [_seed_limit(prof, rank, upper, lower, hi, lengths, duration_s, s,
                                threshold, slo, pool) for s in seeds[:COUNT_SEEDS]]
    spread = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    spread = max(spread, one.spread_tps / one.limit_tps * float(np.mean(per_seed)))
    limit = min(hi, max(max(per_seed), float(np.mean(per_seed)) + SPREAD_SIGMAS * spread))
    out = CountLimit(int(n), int(rank), float(box), tuple(map(float, per_seed)), spread,
                     float(limit))
    _limit_cache[key] = out
    _disk_put(key, {**out.__dict__, "per_seed_tps": list(out.per_seed_tps)})
    return out


def caps_by_count(loads_desc: Sequence[float], limit_of: Callable[[int], float],
                  grid: Sequence[int] = COUNT_BOUND_GRID) -> np.ndarray:
    """``cap[n]`` for n = 0..N (cap[0] = 0): ``S(n)``, the ``n`` heaviest of ``loads_desc``,
    and at most every measured ``K(g)``, g <= n, that the SLO set (``K(g) < S(g)``;
    ``limit_of(g)`` gives the measured value): module docstring. A ``K(g) = S(g)`` (the ``g``
    heaviest accepted together) says nothing of larger counts."""
    n_total = len(loads_desc)
    pts = sorted(g for g in grid if g <= n_total)
    heavy = np.concatenate([[0.0], np.cumsum(np.asarray(loads_desc, float))])
    cap = heavy.copy()
    bound, j = np.inf, 0
    for n in range(1, n_total + 1):
        while j < len(pts) and pts[j] <= n:
            k = float(limit_of(pts[j]))
            if k < heavy[pts[j]] * (1 - 1e-9):  # the SLO, not the loads, set it
                bound = min(bound, k)
            j += 1
        cap[n] = min(cap[n], bound)
    return cap


def partition_bound(load: float, cap: np.ndarray, k_from: int = 1, k_max: int | None = None,
                    rtol: float = 1e-9) -> int:
    """max(``k_from``, least ``k`` such that some counts ``n_1 + ... + n_k = N`` (each >= 1,
    N = ``len(cap) - 1``) have ``sum cap[n_g] >= load``); ``k_max`` + 1 (default N + 1) when
    no k up to it has. ``F_k(m) = max_n F_(k-1)(m - n) + cap[n]`` over the counts (a
    knapsack), for k = 1, 2, ... ."""
    n_total = len(cap) - 1
    k_max = n_total if k_max is None else min(k_max, n_total)
    need = load * (1 - rtol)
    f = np.full(n_total + 1, -np.inf)
    f[1:] = cap[1:]                              # k = 1: one GPU holds all m adapters
    k = 1
    while True:
        if f[n_total] >= need:
            return max(k, k_from)
        if k >= k_max:
            return k_max + 1
        g = np.full(n_total + 1, -np.inf)
        for n in range(1, n_total + 1):          # the k-th GPU holds n adapters
            cand = f[:n_total + 1 - n] + cap[n]
            np.maximum(g[n:], cand, out=g[n:])
        f, k = g, k + 1


def _limit_source(inst, duration_s: float, workers: int | None, measure_max: int | None
                  ) -> tuple[list[float], Callable[[int], float | None]] | None:
    """(the instance's loads, descending; ``K`` of a count: measured, or from the cache only
    above ``measure_max``, None when not cached) under its SLO at its smallest startable rank;
    None without an SLO, with several GPU types or no startable rank."""
    if inst.slo is None or len(inst.gpu_types) != 1:
        return None
    prof = inst.gpu_types[0].load_profile()
    rank = smallest_startable_rank(prof, min(a.rank for a in inst.adapters))
    if rank is None:
        return None
    loads = sorted((inst.load_tps(a) for a in inst.adapters), reverse=True)
    seeds = tuple(inst.seed + g for g in range(BOUND_SEEDS))

    def limit_of(g: int) -> float | None:
        got = count_limit(prof, rank, g, loads, inst.lengths, duration_s, seeds,
                          inst.starvation_threshold, inst.slo, workers,
                          measure=measure_max is None or g <= measure_max)
        return None if got is None else got.limit_tps
    return loads, limit_of


def adapter_count_bound(inst, duration_s: float, workers: int | None = None, k_from: int = 1,
                        k_max: int | None = None, max_count: int | None = None,
                        measure_max: int | None = None) -> tuple[int, list[tuple[int, float]]]:
    """The count-partition bound of ``inst`` under its SLO (module docstring): (the least GPU
    count >= ``k_from`` not excluded, ``k_max`` + 1 when every count up to ``k_max`` is; the
    measured (count, K) points). ``K`` is measured at the grid counts in ascending order, up
    to ``max_count`` (default: twice the adapters per GPU at ``k_from``), stopping once every
    count up to ``k_max`` is excluded: each measured point can only lower the caps, so a
    partial grid gives a weaker bound, never an unsound one. Counts above ``measure_max``
    (default: none) are taken from the cache only. One GPU type only (``k_from`` and no points
    otherwise)."""
    src = _limit_source(inst, duration_s, workers, measure_max)
    if src is None:
        return k_from, []
    loads, limit_of = src
    n_total = len(loads)
    k_max = n_total if k_max is None else min(int(k_max), n_total)
    top = max_count if max_count is not None else 2 * math.ceil(n_total / max(1, k_from))
    grid = [g for g in COUNT_BOUND_GRID if g <= min(n_total, top)]
    points: dict[int, float] = {}
    k = k_from
    for g in grid:
        got = limit_of(g)
        if got is None:
            continue
        points[g] = got
        cap = caps_by_count(loads, points.__getitem__, grid=sorted(points))
        k = partition_bound(inst.total_load_tps, cap, k_from, k_max)
        if k > k_max:
            break
    return k, sorted(points.items())


def count_caps(inst, duration_s: float, workers: int | None = None,
               max_count: int | None = None, grid: Sequence[int] = COUNT_BOUND_GRID,
               measure_max: int | None = None) -> np.ndarray | None:
    """``caps_by_count`` of ``inst`` under its SLO with ``K`` measured at every ``grid`` count
    up to ``max_count`` (default: all adapters): ``cap[n]`` bounds the load of any accepted
    GPU holding ``n`` of its adapters; counts above ``measure_max`` (default: none) from the
    cache only. None without an SLO or with several GPU types."""
    src = _limit_source(inst, duration_s, workers, measure_max)
    if src is None:
        return None
    loads, limit_of = src
    top = len(loads) if max_count is None else min(len(loads), int(max_count))
    got = {g: limit_of(g) for g in grid if g <= top}
    points = {g: v for g, v in got.items() if v is not None}
    return caps_by_count(loads, points.__getitem__, grid=sorted(points))


__all__ = ["COUNT_BOUND_GRID", "CountLimit", "box_loads", "count_limit",
           "caps_by_count", "partition_bound", "adapter_count_bound", "count_caps",
           "solve_count_max"]
