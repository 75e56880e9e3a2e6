"""Infeasibility pre-checks: reasons why an instance cannot be served at all, as a report.

The checks are necessary conditions only (passing them does not prove feasibility). A GPU
starves when throughput < threshold x offered, and no GPU serves more than its backbone maximum
throughput ``C`` (LoRA only adds work), so a GPU can carry at most ``C / threshold`` offered
tokens/s. Checks, each producing a ``Reason`` with a machine-readable ``code``:

* ``rank_unsupported`` — an adapter's rank is in no GPU type's ``supported_ranks`` (or no
  configuration with that rank starts on any type);
* ``adapter_overload`` — an adapter alone offers more than the largest single-GPU limit
  ``max_t C_t / threshold`` (unless ``allow_split``: methods that split an adapter's traffic
  over GPUs are then bounded by the total only);
* ``pool_capacity`` — the total offered load exceeds ``sum_t count_t x C_t / threshold``;
* ``gpu_budget`` — the latency objective's GPU budget is below the capacity lower bound
  ``ceil(total x threshold / max_t C_t)``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from twin.workload import Adapter

from .capacity import (BOUND_SEEDS, CarryLimit, backbone_max_throughput, carry_limit,
                       max_startable_amax, smallest_startable_rank)
from .count_bound import adapter_count_bound, count_caps, solve_count_max
from .feasibility_report import FeasibilityReport, Reason
from .instance import Instance


def _listing(items: list[str], k: int = 5) -> str:
    return ", ".join(items[:k]) + (f" (+{len(items) - k} more)" if len(items) > k else "")


def _count_bound(load_tps: float, cap_tps: float) -> int:
    """ceil(load / per-GPU cap), at least 1."""
    return max(1, math.ceil(load_tps / cap_tps - 1e-9))


def type_capacity_tps(inst: Instance, t) -> float:
    """Most tokens/s one GPU of type ``t`` serves: the type's constant capacity when the
    instance gives one (``capacity_tps`` is the offered load it sustains, so it serves
    threshold x that), else the profile's backbone throughput (LoRA only adds work)."""
    if t.constant_capacity:
        return inst.starvation_threshold * float(t.capacity_tps)
    return backbone_max_throughput(t.profile, inst.lengths)


def gpu_lower_bound(inst: Instance) -> int:
    """Capacity lower bound on the GPU count: ceil(threshold x total load / best GPU capacity)."""
    return _count_bound(inst.starvation_threshold * inst.total_load_tps,
                        max(type_capacity_tps(inst, t) for t in inst.gpu_types))


COUNT_BOUND_FROM = 0.85     # measure count-aware caps only where they may raise the bound
MAX_FULLEST_STEPS = 2       # fullest/busiest-GPU steps per bound (each up to hundreds of replays)
COUNT_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
              1024, 1536, 2048)
COUNT_REFINE_STEPS = 4     # integer bisection steps between the grid points around the crossing


@dataclass(frozen=True)
class TwinBound:
    """Twin-sound lower bounds on the GPU count of any twin-accepted placement of an instance,
    for a twin window ``duration_s`` (see ``twin_lower_bound``).

    ``one_adapter`` = ceil(load / ``gpu_cap_tps``), ``gpu_cap_tps`` being the largest one-adapter
    carry limit over the GPU types; ``by_count`` = ceil(load / ``count_cap_tps``), the cap of a
    GPU that must hold several adapters because no adapter offers more than
    ``max_adapter_tps``; ``one_gpu_excluded``: every adapter on one GPU starves at every Amax
    (``one_gpu_excluded``); ``fullest_excluded_to``: no placement with 2..that many GPUs is
    accepted, because its fullest GPU must swap and fails (``fullest_gpu_excluded``; 0: not
    shown); ``busiest_excluded_to``: likewise because its busiest GPU fails
    (``busiest_gpu_excluded``); ``two_gpus_excluded``: no split over two GPUs is accepted (``two_gpus_excluded``);
    ``by_packing``: the Martello–Toth L2 bound of the adapters' loads packed into bins of
    ``count_cap_tps`` (``packing_bound``: hot adapters that no GPU carries two of);
    ``by_adapters``: under a latency SLO, the least count whose GPUs can hold every adapter
    within their count-dependent SLO limits (``optim.count_bound``; 0: not measured);
    ``best`` = the largest GPU count these leave. ``count_limits`` lists
    the (adapters, carry limit) points measured for ``by_count``."""

    instance: str
    duration_s: float
    load_tps: float
    max_adapter_tps: float
    gpu_cap_tps: float
    count_cap_tps: float
    one_adapter: int
    by_count: int
    count_limits: tuple[tuple[int, float], ...] = ()
    one_gpu_excluded: bool = False
    fullest_excluded_to: int = 0
    two_gpus_excluded: bool = False
    busiest_excluded_to: int = 0
    by_packing: int = 0
    by_adapters: int = 0

    @property
    def best(self) -> int:
        return max(self.one_adapter, self.by_count, self.by_packing, self.by_adapters,
                   2 if self.one_gpu_excluded else 1,
                   self.fullest_excluded_to + 1, self.busiest_excluded_to + 1,
                   3 if self.two_gpus_excluded else 1)

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in ("instance", "duration_s", "load_tps",
                                                  "max_adapter_tps", "gpu_cap_tps",
                                                  "count_cap_tps", "one_adapter", "by_count",
                                                  "one_gpu_excluded", "fullest_excluded_to",
                                                  "busiest_excluded_to", "two_gpus_excluded",
                                                  "by_packing", "by_adapters")},
                "best": self.best, "count_limits": [list(x) for x in self.count_limits]}


PACKING_SCALE = 1e6         # packing_bound: the cap in integer units


def packing_bound(loads_tps: Sequence[float], cap_tps: float) -> int:
    """Fewest bins of capacity ``cap_tps`` that hold ``loads_tps`` whole, bounded below by
    Martello–Toth L2 (``exact.bounds.martello_toth_l2``; 0 when some load exceeds the cap or
    there is none).

    A twin-sound GPU bound for placements that keep each adapter whole when ``cap_tps`` is a
    load no accepted GPU exceeds (the count-aware cap, ``count_cap``): every accepted placement
    is then a packing of the loads into that many bins. L1 (load / cap) is ``one_adapter`` /
    ``by_count`` already; L2 adds that adapters above half the cap need a GPU each. Loads are
    rounded down and the cap up to integers (``PACKING_SCALE`` units per cap), which only
    relaxes the packing."""
    from .exact.bounds import martello_toth_l2
    loads = [float(x) for x in loads_tps]
    if not loads or cap_tps <= 0 or max(loads) > cap_tps:
        return 0
    scale = PACKING_SCALE / float(cap_tps)
    return martello_toth_l2([math.floor(x * scale) for x in loads],
                            math.ceil(float(cap_tps) * scale))


def _bound_seeds(inst: Instance) -> tuple[int, ...]:
    return tuple(inst.seed + g for g in range(BOUND_SEEDS))


def _smallest_rank(inst: Instance) -> int:
    return min(a.rank for a in inst.adapters)


def _type_rank(inst: Instance, t, rank: int | None = None) -> int | None:
    """Smallest startable rank >= ``rank`` (default: the instance's smallest adapter rank) on GPU
    type ``t``."""
    return smallest_startable_rank(t.load_profile(),
                                   _smallest_rank(inst) if rank is None else rank)


def count_cap(limit_of, one: float, max_adapter_tps: float, grid: tuple[int, ...] = COUNT_GRID,
              ceiling: float = np.inf, refine: int = COUNT_REFINE_STEPS
              ) -> tuple[float, list[tuple[int, float]]]:
    """Largest load ``E`` one GPU can carry when no adapter offers more than ``max_adapter_tps``
    (``l``), given ``limit_of(n)`` = carry limit of ``n`` equal-rate adapters (``one`` = n = 1).

    Soundness. A GPU carrying ``E`` holds at least ceil(E / l) adapters with load. Among load
    vectors with that total and every entry <= l, the most concentrated one (entries l, ..., l,
    remainder) is the one that costs the twin least (fewest distinct adapters per step, fewest
    LoRA tiles, least slot contention), and it is itself less concentrated than ``j(E)`` =
    max(1, ceil(E / l) - 1) equal adapters carrying E. So ``E`` is carried only if
    E <= C(j(E)), with C(n) = ``limit_of(n)`` non-increasing in n (more equal adapters cost more
    per step). Both assumptions are empirical; ``tests/test_bounds_twin.py`` checks them on
    sampled GPUs. For measured counts p_1 = 1 < p_2 < ... < p_K, a load in (p_k l, p_(k+1) l]
    has j(E) >= p_k, so the cap is max over k of min(C(p_k), p_(k+1) l) (and C(p_K) beyond).

    Which counts are measured: ``grid`` around the crossing of C(g) and g x l (C <= ``one``
    everywhere), then up to ``refine`` integer bisection steps between the grid points that
    bracket it (the crossing n* = smallest n with C(n) < (n + 1) l; converged, the cap is
    max(n* l, C(n*)), the value over every integer count). ``ceiling``: no GPU carries more
    (the instance's whole load), which spares measurements beyond it. Returns (cap, measured
    points)."""
    l = float(max_adapter_tps)
    one = min(one, ceiling)
    if l <= 0:
        return one, []
    g = list(grid)
    # first index whose next grid point x l exceeds `one`: no crossing can lie after it
    top = next((i for i in range(len(g) - 1) if g[i + 1] * l > one), len(g) - 1)
    if top == 0:
        return one, [(1, one)]
    measured: dict[int, float] = {1: one}

    def C(n: int) -> float:
        if n not in measured:
            measured[n] = min(limit_of(n), one)             # one <= ceiling
        return measured[n]

    i = top                                     # crossing: smallest i with C(g_i) < g_(i+1) l
    while i > 0 and C(g[i - 1]) < g[i] * l:
        i -= 1
    C(g[i])
    # integer refinement: lo has C(lo) >= (lo + 1) l; every n >= hi has C(n) < (n + 1) l
    # (hi = g_(i+1): C(hi) <= C(g_i) < g_(i+1) l), so n* lies in (lo, hi]
    lo = g[i - 1] if i > 0 else 1
    hi = g[i + 1] if i + 1 < len(g) else g[i]
    if C(g[i]) < (g[i] + 1) * l:
        hi = g[i]
    else:
        lo = g[i]
    for _ in range(max(0, int(refine))):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        if C(mid) < (mid + 1) * l:
            hi = mid
        else:
            lo = mid
    pts = sorted(measured.items())
    cap = pts[-1][1]                            # beyond the last measured count
    for (n, c), (n2, _) in zip(pts, pts[1:]):
        cap = max(cap, min(c, n2 * l))
    return float(cap), pts


def twin_lower_bound(inst: Instance, duration_s: float | None = None,
                     workers: int | None = None, pair_checks: int = 0,
                     full_counts: bool = False) -> TwinBound:
    """Twin-sound lower bounds on the GPUs of any placement of ``inst`` that verification (window
    ``duration_s``, default the instance's; GPU ``g`` drawing seed ``inst.seed + g``) accepts.

    Every GPU serving adapters runs with LoRA on and ``max_lora_rank`` at least the instance's
    smallest adapter rank ``r``. ``capacity.carry_limit`` measures, with that window and the
    seeds of the first ``BOUND_SEEDS`` GPUs, the largest expected load a GPU carries unstarved
    in its least-work configuration (one adapter of rank ``r``, Amax 1 or 2), plus a margin of
    ``SPREAD_SIGMAS`` standard deviations of the per-seed limits: no accepted GPU carries more,
    so any placement needs ``one_adapter`` = ceil(load / that) GPUs. A GPU that must hold many
    adapters carries less (``count_cap``): ``by_count``, measured only when the load per GPU at
    the one-adapter bound exceeds ``COUNT_BOUND_FROM`` x the one-adapter cap (the limits of many
    adapters measured on the H100 profiles are >= 0.9 of it, so below that the count-aware cap
    cannot raise the bound; skipping it is sound, it only forgoes tightness; under a latency SLO
    it is always measured, as is the busiest-GPU check below: there the premise fails, more
    adapters per batch cost latency long before throughput). When both leave one
    GPU possible for a load above that share, or one GPU would have to swap adapters at every
    Amax (those limits are measured with every adapter resident), ``one_gpu_excluded`` replays
    the one-GPU placement at every Amax. With k >= 2 GPUs left, where the fullest GPU must swap
    at every Amax even with the lightest adapters at the smallest rank,
    ``fullest_gpu_excluded`` replays that GPU; else, where L / k is above ``COUNT_BOUND_FROM`` x
    the one-adapter cap, ``busiest_gpu_excluded`` replays the least-work GPU carrying L / k (at
    most ``MAX_FULLEST_STEPS`` values of k in all); under a latency SLO these steps start from
    the count-partition bound (every adapter sits on some GPU, and a GPU's SLO limit falls with
    the adapters it holds: ``count_bound.adapter_count_bound``, a knapsack over per-GPU
    adapter counts with the limits of the most concentrated loads; ``full_counts``: its limits
    measured at every count, as the studies do, else the cached ones only: a solve measures
    them in ``raise_bound_to``, where they can certify its placement). When
    two GPUs are left and the fuller must swap, ``two_gpus_excluded`` checks every split of
    adapters and load with up to ``pair_checks`` GPU checks (0, the default: skipped; each check
    of a GPU holding hundreds of adapters replays every Amax, minutes on two cores). A twin-accepted placement with ``best`` GPUs is optimal in the twin
    (among placements that keep each adapter whole, as the fullest-GPU checks assume)."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    seeds = _bound_seeds(inst)
    thr = inst.starvation_threshold
    total = inst.total_load_tps
    lmax = max(inst.load_tps(a) for a in inst.adapters)
    best_one, best_count, points = 0.0, 0.0, []
    for t in inst.gpu_types:
        r = _type_rank(inst, t)
        if r is None:
            continue
        prof = t.load_profile()

        def limit_of(n: int, prof=prof, r=r) -> float:
            return carry_limit(prof, r, n, inst.lengths, dur, seeds, thr, workers,
                               inst.slo).limit_tps

        one = limit_of(1)
        per_gpu = total / _count_bound(total, one)
        # under a latency SLO many adapters can cost far more than one (the shortcut's
        # premise, many-adapter limits >= 0.9 of the one-adapter one, is about throughput)
        if per_gpu > COUNT_BOUND_FROM * one or inst.slo is not None:
            cap, pts = count_cap(limit_of, one, lmax, ceiling=total)
        else:                               # the count-aware cap cannot raise the bound
            cap, pts = one, []
        if cap > best_count:
            best_count, points = cap, pts
        best_one = max(best_one, one)
    if best_one <= 0:
        raise ValueError(f"{inst.name}: no GPU type starts a LoRA configuration of rank >= "
                         f"{_smallest_rank(inst)}")
    lb_one, lb_count = _count_bound(total, best_one), _count_bound(total, best_count)
    lb_pack = packing_bound([inst.load_tps(a) for a in inst.adapters], best_count)
    # under a latency SLO a GPU's limit falls with the adapters it holds, and every adapter
    # sits on some GPU: the count-partition bound (optim.count_bound)
    lb_adapters = 0
    if inst.slo is not None and len(inst.gpu_types) == 1:
        lb_adapters, _ = adapter_count_bound(
            inst, dur, workers, k_from=max(lb_one, lb_count, lb_pack),
            k_max=inst.total_gpus_available,
            measure_max=None if full_counts else 0)       # a solve: cached limits only
    # one GPU for everything: exact check of every Amax, where the caps leave it possible —
    # near the one-adapter cap, or where one GPU would have to swap adapters at every Amax
    # (more adapters than any type starts slots for: the many-adapter limits behind the
    # COUNT_BOUND_FROM shortcut are measured with every adapter resident)
    excluded = (max(lb_one, lb_count, lb_pack, lb_adapters) == 1
                and (total > COUNT_BOUND_FROM * best_one or _swaps_on_one_gpu(inst))
                and one_gpu_excluded(inst, dur, workers))
    # k >= 2 GPUs: the fullest holds ceil(adapters / k); where even the lightest such set at
    # the smallest rank must swap on one GPU, replay it (fullest_gpu_excluded)
    # or where the busiest GPU, carrying at least L / k, is near the cap: replay the least-work
    # such GPU (busiest_gpu_excluded)
    k = max(lb_one, lb_count, lb_pack, lb_adapters, 2 if excluded else 1)
    r0 = _smallest_rank(inst)
    fullest = busiest = 0
    for _ in range(MAX_FULLEST_STEPS):
        if k < 2:
            break
        if (_must_swap(inst, math.ceil(len(inst.adapters) / k), r0)
                and fullest_gpu_excluded(inst, k, dur, workers)):
            fullest = k
        elif ((total / k > COUNT_BOUND_FROM * best_one or inst.slo is not None)
              and busiest_gpu_excluded(inst, k, dur, workers)):
            busiest = k
        else:
            break
        k += 1
    # two GPUs left where the fuller one must swap: every split of the adapters and the load
    pair = (pair_checks > 0 and k == 2
            and _must_swap(inst, math.ceil(len(inst.adapters) / 2), r0)
            and two_gpus_excluded(inst, dur, workers, pair_checks))
    return TwinBound(inst.name, dur, total, lmax, best_one, best_count, lb_one, lb_count,
                     tuple((int(n), float(v)) for n, v in points), excluded, fullest, pair,
                     busiest, lb_pack, lb_adapters)


def _must_swap(inst: Instance, n: int, rank: int) -> bool:
    """``n`` adapters on one GPU at ``max_lora_rank`` ``rank`` do not fit its slots at any
    startable Amax of any type (every such GPU swaps adapters)."""
    return n > max(max_startable_amax(t.load_profile(), rank) for t in inst.gpu_types)


def _swaps_on_one_gpu(inst: Instance) -> bool:
    """Every adapter on one GPU would not fit its slots at any startable Amax of any type."""
    return _must_swap(inst, len(inst.adapters), max(a.rank for a in inst.adapters))


GX_MARGIN_VERSION = 3  # gpu_excluded's spread: 1 the scores at seed 0's best Amax, 2-3 each
                       # bound seed's own best (bump when the margin changes: keys the cache)


def _gpu_key(inst: Instance, adapters: Sequence[Adapter], rank: int, duration_s: float,
             what: str = "gpu_excluded") -> str:
    """Disk-cache key of :func:`gpu_excluded` (or of another check named ``what``): everything its
    replays depend on (the adapters in order, the rank, lengths, window, seeds, threshold, every
    type's profile and twin fingerprint)."""
    from .capacity import SPREAD_SIGMAS, slo_key, twin_fingerprint
    types = []
    for t in inst.gpu_types:
        prof = t.load_profile()
        types.append([t.name, prof.to_dict(), twin_fingerprint(prof)])
    key = {"v": 4, "what": what, "duration_s": float(duration_s),
           "adapters": [[a.rank, float(a.rate)] for a in adapters], "rank": rank,
           "lengths": inst.lengths.to_dict(), "seed": inst.seed,
           "bound_seeds": list(_bound_seeds(inst)), "sigmas": SPREAD_SIGMAS,
           "threshold": float(inst.starvation_threshold), "types": types}
    if inst.slo is not None:                # the verdict judges the SLO too
        key["slo"] = [slo_key(t.load_profile(), inst.slo) for t in inst.gpu_types]
    if what != "one_gpu_excluded":          # exact: no margin; every other check rests on
        key["margin"] = GX_MARGIN_VERSION   # gpu_excluded's spread margin
    blob = json.dumps(key, sort_keys=True, default=str)
    return f"{what}:" + hashlib.sha256(blob.encode()).hexdigest()


def gpu_excluded(inst: Instance, adapters: Sequence[Adapter], rank: int, duration_s: float,
                 workers: int | None = None) -> bool:
    """True when one GPU holding ``adapters`` with ``max_lora_rank`` ``rank`` cannot be
    twin-accepted with window ``duration_s`` on any type of ``inst`` at any Amax (cached on
    disk with the carry limits: up to a few hundred hour-long replays for many adapters).

    What remains free is the GPU type, Amax and the adapters' order. More slots than
    adapters + 1 only add work per step and take KV cache (``capacity`` module docstring), so
    every Amax 1..min(adapters + 1, largest startable) is replayed (the integer search first,
    every other Amax only if it finds nothing). The order and the GPU's index change the
    workload draw, so the GPU counts as failing only when its best score (throughput /
    (threshold x realised offered)) stays below 1 - ``SPREAD_SIGMAS`` x the larger of two
    spreads: the relative spread of the one-adapter carry limit and the standard deviation of
    each bound seed's own best score (``_seed_bests``: a GPU that swaps varies more from draw
    to draw); the mean of those best scores must stay below it too."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    from .capacity import _disk_get, _disk_put
    key = _gpu_key(inst, adapters, rank, duration_s)
    hit = _disk_get(key)
    if hit is not None:
        return bool(hit["excluded"])
    out = _gpu_excluded(inst, adapters, rank, duration_s, workers)
    _disk_put(key, {"excluded": out, "instance": inst.name, "adapters": len(adapters),
                    "rank": rank, "duration_s": float(duration_s)}, durable=True)
    return out


def check_floor(inst: Instance, t, duration_s: float, workers: int | None = None
                ) -> tuple[CarryLimit, float] | None:
    """GPU type ``t``'s one-adapter carry limit for ``inst`` (at its rank, under its SLO, over
    the bound seeds) and the score below which ``gpu_excluded`` may call a GPU of that type
    failing whatever the GPU's own spread: 1 - ``SPREAD_SIGMAS`` x the limit's relative spread.
    None where the type serves none of ``inst``'s ranks."""
    from .capacity import SPREAD_SIGMAS
    r = _type_rank(inst, t)
    if r is None:
        return None
    one = carry_limit(t.load_profile(), r, 1, inst.lengths, duration_s, _bound_seeds(inst),
                      inst.starvation_threshold, workers, inst.slo)
    return one, 1.0 - SPREAD_SIGMAS * one.spread_tps / float(np.mean(one.per_seed_tps))


def _gpu_excluded(inst: Instance, adapters: Sequence[Adapter], rank: int, duration_s: float,
                  workers: int | None) -> bool:
    from .amax_search import amax_upper, twin_scores
    from .integer_search import search_max
    from .placement import plan_gpu
    from .capacity import SPREAD_SIGMAS
    pairs = [(a, 1.0) for a in adapters]
    seeds = _bound_seeds(inst)
    for t in inst.gpu_types:
        if _type_rank(inst, t) is None or max_startable_amax(t.load_profile(), rank) < 1:
            continue
        need = check_floor(inst, t, duration_s, workers)[1]
        plan = plan_gpu(t.name, t.profile, 1, pairs, inst.mean_tokens, rank)
        top = amax_upper(plan)

        def score(xs: list[int], plan=plan, stop_below: float | None = None) -> list[float]:
            return [v for v, _ in twin_scores(inst, plan, xs, inst.seed, duration_s, workers,
                                              stop_below=stop_below)]

        _, best, seen = search_max(score, top)
        if best >= need:
            return False
        exact = dict(seen)
        rest = [a for a in range(1, top + 1) if a not in seen]
        if rest:
            # only "does some Amax reach need?" is asked: a replay stops once it cannot (its
            # score is then an upper bound, below need)
            vals = score(rest, stop_below=need if 0 < need <= 1 else None)
            if max(vals) >= need:
                return False
            seen.update(zip(rest, vals))
        # the draw's spread on this GPU (swapping GPUs spread more than one adapter does): each
        # bound seed's own best score, searched from the Amax within SEED_BEST_BAND of seed 0's
        # best (the curve has several humps); mean + SPREAD_SIGMAS sd must stay below 1. Seed
        # 0 is replayed exactly wherever it may come within the band of its best (a stopped
        # replay's upper bound below the band cannot)
        loose = [a for a in rest if seen[a] >= best - SEED_BEST_BAND]
        if loose:
            exact.update(zip(loose, score(loose)))
        top0 = max(exact.values())
        cands = sorted((a for a, v in exact.items() if v >= top0 - SEED_BEST_BAND),
                       key=lambda a: (-exact[a], a))[:SEED_BEST_STARTS]
        per_seed = _seed_bests(inst, plan, cands, top, seeds, duration_s, workers,
                               known={inst.seed: exact})
        if not all(np.isfinite(per_seed)):
            return False
        sd = float(np.std(per_seed, ddof=1))
        need = min(need, 1.0 - SPREAD_SIGMAS * sd)
        if max(per_seed[seeds.index(inst.seed)], float(np.mean(per_seed))) >= need:
            return False
    return True


SEED_BEST_BAND = 0.05   # _gpu_excluded: the Amax scoring within this of seed 0's best (at
SEED_BEST_STARTS = 12   # most this many, the highest) start each bound seed's search (the
                        # curve has several humps) ...
SEED_CLIMB_BAND = 0.025  # ... which replays every Amax within SEED_BEST_HALF of any Amax
SEED_BEST_HALF = 2       # scoring within SEED_CLIMB_BAND of that seed's best so far


def _seed_bests(inst: Instance, plan, starts: Sequence[int], top: int, seeds: Sequence[int],
                duration_s: float, workers: int | None,
                known: dict[int, dict[int, float]] | None = None) -> list[float]:
    """Each seed's best twin score of ``plan`` over Amax 1..``top``: every seed replays
    ``starts`` and the coarse probes (``integer_search.coarse_probes``), then every Amax within
    ``SEED_BEST_HALF`` of any Amax scoring within ``SEED_CLIMB_BAND`` of its best so far, until
    there is none left (a climb on every hump near the top, over dents of one Amax); a seed
    whose best stays more than ``SEED_BEST_BAND`` below the median seed's replays every Amax.
    One parallel fleet run per step for all seeds. ``known``: exact scores already replayed,
    by seed.

    Why not the scores at the first seed's best Amax: the best Amax moves from draw to draw
    (paper-llama-rlow-qhigh-n160's GPU ``[8, 0, 27, 5, 1]`` scores 0.946 at Amax 21 with one
    seed and 0.879 with another, and its curve has a second hump at Amax 31 where every seed
    scores 0.957-0.972), and verification takes each draw at its own best; the fixed-Amax
    scores mix that move into the draw's spread."""
    from .amax_search import twin_scores
    from .integer_search import coarse_probes
    seen = [dict((known or {}).get(s, {})) for s in seeds]

    def climb(d: dict[int, float]) -> list[int]:
        if not d:
            return []
        top_v = max(d.values())
        near = [a for a, v in d.items() if v >= top_v - SEED_CLIMB_BAND]
        return sorted({x for a in near
                       for x in range(max(1, a - SEED_BEST_HALF), min(top, a + SEED_BEST_HALF) + 1)
                       if x not in d})

    def run(todo: list[list[int]]) -> None:
        jobs = [(i, a) for i, xs in enumerate(todo) for a in xs]
        res = twin_scores(inst, plan, [a for _, a in jobs], [seeds[i] for i, _ in jobs],
                          duration_s, workers)
        for (i, a), (v, _) in zip(jobs, res):
            seen[i][a] = float(v)

    first = {int(a) for a in starts if 1 <= a <= top} | set(coarse_probes(top))
    todo = [sorted(first - set(d)) for d in seen]
    while any(todo):
        run(todo)
        todo = [climb(d) for d in seen]
    # a seed far below the others may have its best on a hump the climb never reached (an
    # underestimate widens the spread): every Amax replayed for it
    bests = [max(d.values()) for d in seen]
    mid = float(np.median(bests))
    low = [i for i, b in enumerate(bests) if b < mid - SEED_BEST_BAND]
    if low:
        run([[a for a in range(1, top + 1) if a not in seen[i]] if i in low else []
             for i in range(len(seeds))])
    return [max(d.values()) for d in seen]


def one_gpu_excluded(inst: Instance, duration_s: float, workers: int | None = None) -> bool:
    """True when no one-GPU placement of ``inst`` is twin-accepted with window ``duration_s``.

    Exact in the twin, without a margin: a one-GPU placement holds every adapter, verification
    gives its only GPU the seed ``inst.seed`` and the twin takes a GPU's adapters in id order
    (``GpuPlan.twin_assignment``), so its draw is fixed and what remains free is the GPU type,
    ``max_lora_rank`` (every supported rank >= the largest adapter rank is replayed) and Amax.
    Every Amax 1..min(adapters + 1, largest startable) is replayed (the integer search first,
    the others only if it finds nothing): more slots than adapters + 1 are never filled and only
    add work per step and take KV cache (``capacity`` module docstring). A power cap only slows
    a GPU. Cached on disk."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    from .capacity import _disk_get, _disk_put
    top_rank = max(a.rank for a in inst.adapters)
    key = _gpu_key(inst, inst.adapters, top_rank, duration_s, what="one_gpu_excluded")
    hit = _disk_get(key)
    if hit is not None:
        return bool(hit["excluded"])
    out = not _one_gpu_accepted(inst, duration_s, workers)
    _disk_put(key, {"excluded": out, "instance": inst.name, "adapters": len(inst.adapters),
                    "duration_s": float(duration_s)}, durable=True)
    return out


def _one_gpu_accepted(inst: Instance, duration_s: float, workers: int | None) -> bool:
    """Some (type, max_lora_rank, Amax) serves every adapter of ``inst`` on one GPU unstarved
    in its verification draw (``one_gpu_excluded``)."""
    return _gpu_accepted(inst, inst.adapters, inst.seed, duration_s, workers)


def _gpu_accepted(inst: Instance, adapters: Sequence[Adapter], seed: int, duration_s: float,
                  workers: int | None) -> bool:
    """Some (type, max_lora_rank, Amax) serves ``adapters`` on one GPU unstarved in the draw of
    ``seed`` (every supported rank >= theirs, every Amax 1..min(adapters + 1, startable))."""
    from .amax_search import amax_upper, twin_scores
    from .integer_search import search_max
    from .placement import plan_gpu
    pairs = [(a, 1.0) for a in adapters]
    need_rank = max(a.rank for a in adapters)
    for t in inst.gpu_types:
        prof = t.load_profile()
        for rank in sorted(x for x in prof.supported_ranks if x >= need_rank):
            if max_startable_amax(prof, rank) < 1:
                continue
            plan = plan_gpu(t.name, t.profile, 1, pairs, inst.mean_tokens, rank)
            top = amax_upper(plan)

            def score(xs: list[int], plan=plan) -> list[float]:
                # only "does some Amax reach 1?" is asked: a replay stops once it cannot
                return [v for v, _ in twin_scores(inst, plan, xs, seed, duration_s,
                                                  workers, stop_below=1.0)]

            _, best, seen = search_max(score, top)
            if best >= 1.0:
                return True
            rest = [a for a in range(1, top + 1) if a not in seen]
            if rest and max(score(rest)) >= 1.0:
                return True
    return False


def one_adapter_caps(inst: Instance, duration_s: float, workers: int | None = None
                     ) -> dict[str, float]:
    """Per GPU type that starts a LoRA configuration for ``inst``, the one-adapter carry limit
    (``capacity.carry_limit`` at the type's smallest rank, the bound's seeds, threshold and
    ``inst.slo``): no GPU of that type carrying more is accepted (the bound's premise)."""
    out = {}
    for t in inst.gpu_types:
        r = _type_rank(inst, t)
        if r is not None:
            out[t.name] = carry_limit(t.load_profile(), r, 1, inst.lengths, duration_s,
                                      _bound_seeds(inst), inst.starvation_threshold, workers,
                                      inst.slo).limit_tps
    return out


SPLIT_MAX_ADAPTERS = 20    # two_gpu_splits_excluded: most adapters enumerated (2^(n-1) splits)
SPLIT_MAX_CHECKS = 1024    # ... most distinct (GPU sequence, seed) replays (4 per split x 256)


def two_gpu_splits(inst: Instance, cap_tps: float, caps_by_n: np.ndarray | None = None
                   ) -> list[tuple[int, ...]] | None:
    """Every split of ``inst``'s adapters over two non-empty GPUs (the first GPU's adapter
    indices; the last adapter always on the second, so each unordered split once) in which
    neither GPU offers more than ``cap_tps``, nor (``caps_by_n``: under a latency SLO,
    ``count_bound.count_caps``) more than ``caps_by_n[n]`` with ``n`` adapters; None when the
    instance has more than ``SPLIT_MAX_ADAPTERS`` adapters."""
    n = len(inst.adapters)
    if n < 2 or n > SPLIT_MAX_ADAPTERS:
        return None
    loads = np.array([inst.load_tps(a) for a in inst.adapters[:-1]])
    masks = np.arange(1, 1 << (n - 1), dtype=np.int64)
    bits = ((masks[:, None] >> np.arange(n - 1)) & 1).astype(np.uint8)
    first = bits @ loads
    total = inst.total_load_tps
    ok = (first <= cap_tps) & (total - first <= cap_tps)
    if caps_by_n is not None:
        k = bits.sum(axis=1).astype(np.int64)          # adapters on the first GPU
        ok &= (first <= caps_by_n[k]) & (total - first <= caps_by_n[n - k])
    return [tuple(int(i) for i in np.flatnonzero(b)) for b in bits[ok]]


def _split_groups(inst: Instance, first: Sequence[int]) -> tuple[list[Adapter], list[Adapter]]:
    """The two GPUs of a split, each its adapters in id order (the order the twin draws in)."""
    chosen = set(first)
    groups: tuple[list[Adapter], list[Adapter]] = ([], [])
    for i in sorted(range(len(inst.adapters)), key=lambda i: inst.adapters[i].id):
        groups[0 if i in chosen else 1].append(inst.adapters[i])
    return groups


def _draw_key(group: Sequence[Adapter]) -> tuple:
    return tuple((a.rank, a.rate) for a in group)


def split_gpus(inst: Instance, first: Sequence[int]) -> tuple[tuple, tuple]:
    """The two GPUs of a split as the twin draws them: each GPU's (rank, rate) in id order
    (adapter ``i`` of a GPU draws from child ``i`` of the GPU's seed), so two splits with equal
    keys are replayed alike whatever their adapters' ids."""
    x, y = _split_groups(inst, first)
    return _draw_key(x), _draw_key(y)


def split_checks(inst: Instance, splits: Sequence[Sequence[int]]) -> int:
    """Distinct GPU checks (GPU key, seed) that replaying ``splits`` both ways round needs."""
    s0, s1 = inst.seed, inst.seed + 1
    seen = set()
    for first in splits:
        x, y = split_gpus(inst, first)
        seen.update(((x, s0), (y, s1), (y, s0), (x, s1)))
    return len(seen)


def two_gpu_splits_excluded(inst: Instance, duration_s: float, workers: int | None = None,
                            full_counts: bool = False) -> bool | None:
    """True when no twin-accepted placement of ``inst`` uses exactly two GPUs, shown by
    replaying every split; None when there are too many to replay (more than
    ``SPLIT_MAX_ADAPTERS`` adapters, or more than ``SPLIT_MAX_CHECKS`` distinct GPU checks).

    Exact in the twin but for the load window: a GPU offering more than the one-adapter carry
    limit (the bound's cap, margin included) is not accepted, the premise of the bound itself;
    under a latency SLO neither is one of ``n`` adapters offering more than the count cap
    ``count_bound.count_caps`` gives ``n`` (the premises of that bound; ``full_counts`` as in
    ``twin_lower_bound``).
    Verification gives the two GPUs the seeds ``inst.seed`` and ``inst.seed + 1`` and takes
    each GPU's adapters in id order, so a split is accepted only if, for one of the two ways to
    order its GPUs, each GPU is accepted at some type, ``max_lora_rank`` and Amax with its seed
    (``_gpu_accepted``: every Amax). GPUs with the same (rank, rate) sequence in id order draw
    the same workload and are replayed once (``split_gpus``): thousands of splits of a few
    adapter kinds need a few dozen checks. Cached on disk."""
    if not 2 <= len(inst.adapters) <= SPLIT_MAX_ADAPTERS:
        return None                # too many to enumerate (one adapter: no split)
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    from .capacity import _disk_get, _disk_put
    by_count = inst.slo is not None and len(inst.gpu_types) == 1    # count caps apply
    key = _gpu_key(inst, inst.adapters, _smallest_rank(inst), duration_s,
                   what=f"two_gpu_splits_excluded/{SPLIT_MAX_ADAPTERS}/c{SPLIT_MAX_CHECKS}"
                   + ("/by-count" if by_count else ""))
    hit = _disk_get(key)
    if hit is not None:
        return None if hit["excluded"] is None else bool(hit["excluded"])
    # the count caps at every count (few adapters are enumerated); None without them
    caps_n = (count_caps(inst, duration_s, workers, grid=range(1, len(inst.adapters) + 1),
                         measure_max=None if full_counts else solve_count_max(duration_s))
              if by_count else None)
    splits = two_gpu_splits(inst, max(one_adapter_caps(inst, duration_s, workers).values(),
                                      default=0.0), caps_n)
    checks = None if splits is None else split_checks(inst, splits)
    out = (None if checks is None or checks > SPLIT_MAX_CHECKS
           else not _some_split_accepted(inst, splits, duration_s, workers))
    if out is None and caps_n is not None and not full_counts:
        return out               # too many with the caps a solve measures: not the last word
    _disk_put(key, {"excluded": out, "instance": inst.name, "adapters": len(inst.adapters),
                    "splits": None if splits is None else len(splits), "checks": checks,
                    "duration_s": float(duration_s)}, durable=True)
    return out


def _some_split_accepted(inst: Instance, splits: Sequence[tuple[int, ...]], duration_s: float,
                         workers: int | None) -> bool:
    memo: dict[tuple, bool] = {}

    def accepted(group: list[Adapter], seed: int) -> bool:
        k = (_draw_key(group), seed)
        if k not in memo:
            memo[k] = _gpu_accepted(inst, group, seed, duration_s, workers)
        return memo[k]

    s0, s1 = inst.seed, inst.seed + 1
    for first in splits:
        # the heavier GPU first: it is the likelier to fail
        a, b = sorted(_split_groups(inst, first),
                      key=lambda g: -sum(inst.load_tps(ad) for ad in g))
        for x, y in ((a, b), (b, a)):            # x takes seed s0, y seed s1
            if accepted(x, s0) and accepted(y, s1):
                return True
    return False


def fullest_gpu_excluded(inst: Instance, k: int, duration_s: float,
                         workers: int | None = None) -> bool:
    """True when no twin-accepted placement of ``inst`` uses ``k`` GPUs because of its fullest
    GPU: some GPU holds at least m = ceil(adapters / k) of them, and one GPU holding the m
    lightest adapters of the instance, all at its smallest rank, fails at every Amax
    (:func:`gpu_excluded`). Assumed, as for ``count_cap``, and checked on sampled GPUs by
    ``tests/test_bounds_twin.py``: fewer adapters, lower rates and a lower rank never turn an
    accepted GPU into a starving one."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    if k < 1:
        raise ValueError(f"fullest_gpu_excluded: k must be >= 1, got {k}")
    m = math.ceil(len(inst.adapters) / k)
    r = _smallest_rank(inst)
    light = sorted(inst.adapters, key=lambda a: (a.rate, a.rank, a.id))[:m]
    return gpu_excluded(inst, [Adapter(a.id, r, a.rate) for a in light], r, duration_s, workers)


PAIR_LOAD_RTOL = 0.005     # two_gpus_excluded: load bisection resolution (share of the total)
PAIR_MIN_SPAN = 16         # two_gpus_excluded: narrowest range of adapter counts split further


class _OutOfChecks(Exception):
    """two_gpus_excluded used its budget of GPU checks."""


def _adapters_for_load(inst: Instance, load_tps: float) -> int:
    """Fewest of ``inst``'s adapters that offer ``load_tps`` (the heaviest first)."""
    heavy = np.concatenate([[0.0], np.cumsum(sorted((inst.load_tps(a) for a in inst.adapters),
                                                    reverse=True))])
    return int(np.searchsorted(heavy, load_tps * (1 - 1e-12)))


def busiest_gpu_excluded(inst: Instance, k: int, duration_s: float,
                         workers: int | None = None) -> bool:
    """True when no twin-accepted placement of ``inst`` uses ``k`` GPUs because of its busiest
    GPU: some GPU carries at least L / k, on at least as many adapters as that load takes (the
    heaviest first, m of them), and ``canonical_gpu(m, L / k)`` — the least-work such GPU
    (load concentrated on the fewest adapters at the instance's largest rate, smallest rank) —
    fails at every Amax (:func:`gpu_excluded`, with its spread margin). Sharper than
    ``count_cap`` near a crossing: that cap measures equal adapters, one fewer than the load
    takes, each above the largest rate. Same assumptions as ``count_cap``."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    if k < 1:
        raise ValueError(f"busiest_gpu_excluded: k must be >= 1, got {k}")
    load = inst.total_load_tps / k
    m = max(1, _adapters_for_load(inst, load))
    return gpu_excluded(inst, canonical_gpu(inst, m, load), _smallest_rank(inst), duration_s,
                        workers)


def canonical_gpu(inst: Instance, m: int, load_tps: float) -> list[Adapter]:
    """The least-work GPU holding ``m`` of ``inst``'s adapters with ``load_tps`` in total:
    the lightest m - j - 1 adapters, j adapters at the instance's largest rate and one carrying
    the remainder (j the smallest count that reaches the load), all at the smallest rank.

    Any GPU holding m adapters of the instance with that load (each whole, at most the largest
    rate, the k lightest of them no lighter than the instance's k lightest) is turned into this
    one by moving load from lighter to heavier adapters and lowering rates and ranks — steps
    that never make a GPU starve (the assumptions of ``count_cap`` and
    ``fullest_gpu_excluded``). So if this GPU fails at every Amax, every such GPU does. A load
    above what m adapters can offer is capped there (j = m - 1)."""
    if m < 1:
        raise ValueError(f"canonical_gpu: m must be >= 1, got {m}")
    per = inst.mean_tokens
    rates = np.sort(np.array([a.rate for a in inst.adapters], float))
    top, r0 = float(rates[-1]), _smallest_rank(inst)
    cum = np.concatenate([[0.0], np.cumsum(rates)])
    need = load_tps / per
    light, rest = m - 1, 0.0
    for j in range(m):
        light = m - j - 1
        rest = need - cum[light] - j * top
        if rest <= top:
            break
    vec = list(rates[:light]) + [min(max(rest, 0.0), top)] + [top] * (m - 1 - light)
    return [Adapter(f"z{i:05d}", r0, float(q)) for i, q in enumerate(vec) if q > 0]


def two_gpus_excluded(inst: Instance, duration_s: float, workers: int | None = None,
                      max_checks: int = 64) -> bool:
    """True when no twin-accepted placement of ``inst`` (each adapter whole on one GPU) uses
    exactly two GPUs; False when that is not shown within ``max_checks`` GPU checks.

    Let the fuller GPU hold m >= n / 2 of the n adapters and the load E; the other holds n - m
    and the rest of the load L - E. For a range m in [a, b]: E_hi(a) is the smallest load
    (resolution ``PAIR_LOAD_RTOL`` x L, by bisection) at which ``canonical_gpu(a, E_hi)``
    fails at every Amax (:func:`gpu_excluded`, with its spread margin); a fuller GPU with
    E >= E_hi fails (it is no easier than that one: as many adapters or more, as much load or
    more), and with E < E_hi the other GPU carries more than L - E_hi on n - b .. n - a
    adapters, at least as many as that load takes (k0, the heaviest adapters first), so it
    fails if ``canonical_gpu(k0, L - E_hi)`` does (or no such GPU exists: k0 > n - a). A range not shown so is
    halved (down to ``PAIR_MIN_SPAN`` counts). E_hi is non-increasing in a (more adapters at
    the same load fail no later), so ranges are taken by increasing a and each bisection
    starts below the previous one's E_hi. Cached on disk (the key holds ``max_checks``)."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    from .capacity import _disk_get, _disk_put
    key = _gpu_key(inst, inst.adapters, _smallest_rank(inst), duration_s,
                   what=f"two_gpus_excluded/{int(max_checks)}")
    hit = _disk_get(key)
    if hit is not None:
        return bool(hit["excluded"])
    try:
        out = _two_gpus_excluded(inst, duration_s, workers, int(max_checks))
    except _OutOfChecks:
        out = False
    _disk_put(key, {"excluded": out, "instance": inst.name, "adapters": len(inst.adapters),
                    "duration_s": float(duration_s), "max_checks": int(max_checks)}, durable=True)
    return out


def _two_gpus_excluded(inst: Instance, duration_s: float, workers: int | None,
                       max_checks: int) -> bool:
    n, total = len(inst.adapters), inst.total_load_tps
    if n < 2:
        return True
    r0 = _smallest_rank(inst)
    loads = np.sort([inst.load_tps(a) for a in inst.adapters])
    cum = np.concatenate([[0.0], np.cumsum(loads)])
    used = 0

    def fails(m: int, load: float, m_max: int | None = None) -> bool:
        """Every GPU of m..``m_max`` adapters of the instance carrying ``load`` fails: one of
        them holds at least as many adapters as that load takes (the heaviest first)."""
        nonlocal used
        m = max(m, _adapters_for_load(inst, load))
        if m_max is not None and m > m_max:
            return True                         # no such GPU exists
        if m < 1 or load <= 0:
            return False
        used += 1
        if used > max_checks:
            raise _OutOfChecks
        return gpu_excluded(inst, canonical_gpu(inst, m, load), r0, duration_s, workers)

    e_hi: dict[int, float] = {}         # a -> smallest load shown failing (inf: none)
    e_ok: dict[int, float] = {}         # a -> largest load shown not failing

    def upper(a: int) -> float:
        """A load from which every GPU of ``a`` or more adapters fails (inf: not shown)."""
        if a in e_hi:
            return e_hi[a]
        top = float(total - cum[n - a])        # the most the fuller GPU can hold
        lo = max([float(cum[a])] + [v for k, v in e_ok.items() if k >= a])
        known = [v for k, v in e_hi.items() if k <= a]
        hi = min(known) if known else np.inf   # fails there already (monotone in a)
        if hi <= cum[a]:
            e_hi[a] = float(cum[a])
            return e_hi[a]
        if not np.isfinite(hi):
            guess = min(max(0.5 * total, lo), top)
            if fails(a, guess):
                hi = guess
            elif fails(a, top):
                lo, hi = guess, top
            else:
                e_hi[a] = np.inf
                return e_hi[a]
        if lo <= cum[a] and fails(a, lo):        # lo not known to pass: every load fails
            hi = lo
        while hi - lo > PAIR_LOAD_RTOL * total:
            mid = 0.5 * (lo + hi)
            if fails(a, mid):
                hi = mid
            else:
                lo = mid
        e_hi[a], e_ok[a] = hi, lo
        return hi

    todo = [(math.ceil(n / 2), n - 1)]
    while todo:
        a, b = todo.pop()
        e = upper(a)
        if e <= cum[a] or (np.isfinite(e) and fails(n - b, total - e, n - a)):
            continue
        if b - a < PAIR_MIN_SPAN:
            return False
        mid = (a + b) // 2
        todo += [(mid + 1, b), (a, mid)]
    return True


def _least_work_check(inst: Instance, duration_s: float, workers: int | None):
    """``check(test_loads, rank) -> excluded`` of the supply steps: one GPU holding adapters of
    the instance's smallest rank at ``test_loads`` (tok/s), at server rank ``rank`` (default
    that smallest rank), :func:`gpu_excluded`."""
    r0, per = _smallest_rank(inst), inst.mean_tokens

    def check(test_loads: np.ndarray, rank: int = r0) -> bool:
        ads = [Adapter(f"s{i:05d}", r0, float(q) / per)
               for i, q in enumerate(test_loads) if q > 0]
        return gpu_excluded(inst, ads, rank, duration_s, workers)
    return check


def _cached_exclusion(keys: Sequence[tuple[str, bool]]) -> bool | None:
    """The first verdict cached under ``keys`` (key, whether a "not shown" there stands too: an
    exclusion is a proof whatever search found it); None when none stands."""
    from .capacity import _disk_get
    for key, final in keys:
        hit = _disk_get(key)
        if hit is not None and (hit["excluded"] or final):
            return bool(hit["excluded"])
    return None


def _recorded_search(inst: Instance, key: str, desc: str, checks: int, record: dict,
                     search) -> bool:
    """``search(progress)`` with a progress bar of ``checks`` GPU checks, its verdict cached
    under ``key`` with ``record``."""
    from tqdm import tqdm

    from .capacity import _disk_put
    with tqdm(total=checks, desc=f"{inst.name}: {desc}", unit="check", leave=False) as bar:
        out = search(lambda _msg: bar.update(1))
    _disk_put(key, {"excluded": out, "instance": inst.name, "adapters": len(inst.adapters),
                    **record, "max_checks": checks}, durable=True)
    return out


def supply_gpus_excluded(inst: Instance, k: int, duration_s: float, workers: int | None = None,
                         max_checks: int | None = None) -> bool:
    """True when no twin-accepted placement of ``inst`` (each adapter whole on one GPU) uses
    ``k`` GPUs, shown by the supply of its heaviest adapters (``optim.supply_exclusion``: every
    GPU shape (adapters, how many of the heaviest) bounded by the least-work such GPU failing
    at every Amax, :func:`gpu_excluded` with its spread margin, and by the count-aware cap; the
    shapes of k GPUs cannot carry the load; with mixed ranks, each GPU is checked at the
    largest rank it holds, and the GPUs of each rank or above hold every adapter of those
    ranks). False when not shown within ``max_checks`` GPU checks (default
    ``supply_exclusion.SUPPLY_CHECKS``; 0: only a cached success of that default). Cached on
    disk."""
    from .supply_exclusion import (SUPPLY_CHECKS, SUPPLY_SOUND_VERSIONS, SUPPLY_VERSION,
                                   supply_excluded, top_group_size)
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    loads = [inst.load_tps(a) for a in inst.adapters]
    if k < 2 or not 1 <= top_group_size(loads) < len(loads):
        return False               # one GPU, or no adapter lighter than the heaviest
    checks = SUPPLY_CHECKS if max_checks is None else int(max_checks)
    r0 = _smallest_rank(inst)

    def key(version: int, budget: int) -> str:
        return _gpu_key(inst, inst.adapters, r0, duration_s,
                        what=f"supply_gpus_excluded/{version}/{int(k)}/{budget}")

    hit = _cached_exclusion([(key(version, budget), budget == checks and version == SUPPLY_VERSION)
                             for version in sorted(SUPPLY_SOUND_VERSIONS, reverse=True)
                             for budget in dict.fromkeys((SUPPLY_CHECKS, checks))])
    if hit is not None or checks <= 0:
        return bool(hit)
    cap = twin_lower_bound(inst, duration_s, workers).count_cap_tps
    check = _least_work_check(inst, duration_s, workers)
    return _recorded_search(
        inst, key(SUPPLY_VERSION, checks), f"supply checks, {k} GPUs", checks,
        {"k": int(k), "duration_s": float(duration_s)},
        lambda progress: supply_excluded(loads, k, inst.total_load_tps, cap, check, checks,
                                         progress=progress,
                                         ranks=[a.rank for a in inst.adapters]))


def pair_supply_gpus_excluded(inst: Instance, duration_s: float, workers: int | None = None,
                              max_checks: int | None = None) -> bool:
    """True when no twin-accepted placement of ``inst`` uses two GPUs, shown by the supply of
    its two heaviest load classes (``optim.supply_pair``: the least-work GPU of every shape
    (adapters, how many of each class) failing at every Amax, :func:`gpu_excluded` with its
    spread margin, at the smallest rank; the count-aware cap). False when not shown within
    ``PAIR_SUPPLY_BUDGET`` x ``max_checks`` GPU checks (default
    ``supply_exclusion.SUPPLY_CHECKS``; 0: only a cached success of that default): each pair has
    two sides, and the pairs where the large GPU carries about its least load take one failure
    per class count. Cached on disk."""
    from .supply_exclusion import SUPPLY_CHECKS
    from .supply_pair import (PAIR_SUPPLY_BUDGET, PAIR_SUPPLY_VERSION, pair_supply_excluded,
                              two_classes)
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    loads = [inst.load_tps(a) for a in inst.adapters]
    if two_classes(loads) is None:
        return False
    checks = PAIR_SUPPLY_BUDGET * (SUPPLY_CHECKS if max_checks is None else int(max_checks))
    r0 = _smallest_rank(inst)

    def key(budget: int) -> str:
        return _gpu_key(inst, inst.adapters, r0, duration_s,
                        what=f"pair_supply_excluded/{PAIR_SUPPLY_VERSION}/{budget}")

    hit = _cached_exclusion([(key(budget), budget == checks) for budget in
                             dict.fromkeys((PAIR_SUPPLY_BUDGET * SUPPLY_CHECKS, checks))])
    if hit is not None or checks <= 0:
        return bool(hit)
    cap = twin_lower_bound(inst, duration_s, workers).count_cap_tps
    check = _least_work_check(inst, duration_s, workers)
    return _recorded_search(
        inst, key(checks), "pair supply checks", checks, {"duration_s": float(duration_s)},
        lambda progress: pair_supply_excluded(loads, inst.total_load_tps, cap, check, checks,
                                              progress=progress))


def class_gpus_excluded(inst: Instance, k: int, duration_s: float, workers: int | None = None,
                        max_checks: int | None = None, cached_only: bool = False) -> bool:
    """True when no twin-accepted placement of ``inst`` (each adapter whole on one GPU) uses
    ``k`` GPUs, shown by its load classes (``optim.class_exclusion``): first the count-aware
    caps and the classes' supply alone (no twin check: cheap, so also on a solve's path), then
    the checked search (every GPU a vector of class counts, failures cut every vector that
    spreads them, :func:`gpu_excluded` with its spread margin, same premises as the supply
    steps; with several ranks, classes of load and rank, every GPU checked at the server rank
    of the largest rank it holds with its adapters at the smallest) with ``max_checks`` GPU
    checks (default ``class_exclusion.CLASS_CHECKS``; a larger budget goes on from the saved
    search; 0: only a cached success, of any budget). ``cached_only``: read the cache and
    nothing else (not even the caps-only solve). Cached on disk."""
    from .class_exclusion import (CLASS_CHECKS, CLASS_SOUND_VERSIONS, CLASS_VERSION,
                                  MAX_CLASSES, class_excluded, load_classes)
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    loads = [inst.load_tps(a) for a in inst.adapters]
    ranks = [a.rank for a in inst.adapters]
    if k < 2 or not 2 <= len(load_classes(loads, ranks).loads) <= MAX_CLASSES:
        return False
    checks = CLASS_CHECKS if max_checks is None else int(max_checks)
    r0 = _smallest_rank(inst)

    def key(budget: int | str, version: int = CLASS_VERSION) -> str:
        return _class_key(inst, k, duration_s, budget, version)

    def search(budget: int | str, fails) -> bool:
        from .capacity import _disk_put
        trace: dict = {}
        # the checked search's progress, saved every round: a stopped search (or a larger
        # budget) goes on from there without solving its model round by round again
        where = key("progress")
        resume = None
        if fails is not None:   # the latest sound version's: its cuts and checks are facts
            resume = next((st for v in sorted(CLASS_SOUND_VERSIONS, reverse=True)
                           if (st := _saved_progress(key("progress", v))) is not None), None)
        return _recorded_search(
            inst, key(budget), f"class checks, {k} GPUs", 0 if fails is None else budget,
            {"k": int(k), "duration_s": float(duration_s), "search": trace},
            lambda progress: class_excluded(
                loads, k, cap_of, fails, 0 if fails is None else int(budget),
                progress=progress, trace=trace, ranks=ranks, resume=resume,
                save=None if fails is None else (lambda st: _disk_put(where, st, durable=True))))

    # an exclusion cached by any sound version stands, whatever budget found it ("proven"); a
    # "not shown" only the current version's at this budget
    stages = ["caps", "proven"] + list(dict.fromkeys((CLASS_CHECKS, checks)))
    hit = _cached_exclusion([(key(budget, v), v == CLASS_VERSION and budget == checks)
                             for v in sorted(CLASS_SOUND_VERSIONS, reverse=True)
                             for budget in stages])
    if hit is not None or cached_only:
        return bool(hit)
    gpu_cap = twin_lower_bound(inst, duration_s, workers).count_cap_tps
    by_count = count_caps(inst, duration_s, workers, measure_max=0)   # the SLO's, cached

    def cap_of(n: int) -> float:
        c = gpu_cap
        if by_count is not None and n < len(by_count):
            c = min(c, float(by_count[n]))
        return c

    if _cached_exclusion([(key("caps"), True)]) is None and search("caps", None):
        return True
    if checks <= 0:
        return False
    # every GPU checked at the server rank of the largest rank it holds, its adapters at the
    # smallest rank (the least work there: the GPU at its own ranks fails where that one does)
    check = _least_work_check(inst, duration_s, workers)
    out = search(checks, lambda v, rank=r0: check(np.asarray(v), rank))
    if out:                 # found by any budget: read by every later call
        from .capacity import _disk_put
        _disk_put(key("proven"), {"excluded": True, "instance": inst.name, "k": int(k),
                                  "duration_s": float(duration_s), "max_checks": checks},
                  durable=True)
    return out


def _saved_progress(key: str) -> dict | None:
    """A class search's saved progress under ``key``: the furthest of the user cache's and the
    search store's (either may be behind: a store from an earlier session, a cache from a run
    without the store)."""
    from .capacity import _disk_get_all
    return max(_disk_get_all(key), default=None,
               key=lambda st: (int(st.get("checks", 0)), int(st.get("rounds", 0))))


def _class_key(inst: Instance, k: int, duration_s: float, budget: int | str,
               version: int) -> str:
    """Disk-cache key of ``class_gpus_excluded``'s records: ``budget`` a check budget, "caps",
    "proven" or "progress" (``inst`` its bound view)."""
    return _gpu_key(inst, inst.adapters, _smallest_rank(inst), duration_s,
                    what=f"class_gpus_excluded/{version}/{int(k)}/{budget}")


@dataclass(frozen=True)
class ClassSearchStatus:
    """Where the class step of one instance and GPU count stands, read from the disk cache
    (nothing is replayed): ``classes`` its load classes (0: not applicable), the saved
    search's ``checks`` / ``rounds`` / ``cuts`` (of the latest sound ``version`` that saved
    one; None: none saved), how the search with ``budget`` checks ended (``ended``, None:
    stopped before it ended or never run; ``earlier``: how an earlier version's search ended,
    which a rerun does not take: a "not shown" stands for its own version only) and whether
    an exclusion is recorded."""

    classes: int
    budget: int
    version: int | None = None
    checks: int = 0
    rounds: int = 0
    cuts: int = 0
    ended: str | None = None
    excluded: bool = False
    earlier: str | None = None

    def describe(self) -> str:
        text = self._state()
        return text if self.ended or not self.earlier else f"{text}; {self.earlier}"

    def _state(self) -> str:
        from .class_exclusion import MAX_CLASSES
        if not 2 <= self.classes <= MAX_CLASSES:
            return f"class step not applicable ({self.classes} load classes)"
        if self.excluded:
            return "excluded by the class step (the bound is raised)"
        if self.version is None:
            return "no checked search saved" + (f"; with {self.budget} checks it ended: "
                                                f"{self.ended}" if self.ended else
                                                " (rerun the study to run it)")
        done = (f"{self.checks} checks saved, {self.rounds} rounds, {self.cuts} cuts "
                f"(version {self.version})")
        if self.ended:
            return f"{done}; with {self.budget} checks it ended: {self.ended}"
        if self.checks >= self.budget:
            return (f"{done}; its {self.budget}-check budget is spent (--class-checks above "
                    f"{self.checks} goes on)")
        return f"{done}; stopped (rerun the study to go on)"


def class_search_status(inst: Instance, k: int, duration_s: float,
                        budget: int | None = None) -> ClassSearchStatus:
    """The class step's state for ``k`` GPUs (``ClassSearchStatus``), from the cache alone;
    ``budget`` defaults to ``class_exclusion.CLASS_CHECKS``."""
    from .capacity import _disk_get
    from .class_exclusion import (CLASS_CHECKS, CLASS_SOUND_VERSIONS, CLASS_VERSION,
                                  MAX_CLASSES, load_classes)
    inst = inst.bound_view()
    budget = CLASS_CHECKS if budget is None else int(budget)
    n = len(load_classes([inst.load_tps(a) for a in inst.adapters],
                         [a.rank for a in inst.adapters]).loads)
    if k < 2 or not 2 <= n <= MAX_CLASSES:
        return ClassSearchStatus(n, budget)
    versions = sorted(CLASS_SOUND_VERSIONS, reverse=True)
    # an exclusion of any sound version and budget, read as class_gpus_excluded reads it
    excluded = class_gpus_excluded(inst, k, duration_s, max_checks=0, cached_only=True)

    def why(v: int, b: int) -> str | None:
        hit = _disk_get(_class_key(inst, k, duration_s, b, v))
        return None if hit is None else (hit.get("search") or {}).get("why") or "not shown"

    ended = why(CLASS_VERSION, budget)
    earlier = next((f"version {v} ended: {w}" for v in versions if v != CLASS_VERSION
                    for w in [why(v, CLASS_CHECKS)] if w is not None), None)
    for v in versions:
        st = _saved_progress(_class_key(inst, k, duration_s, "progress", v))
        if st is not None:
            return ClassSearchStatus(n, budget, v, int(st["checks"]), int(st["rounds"]),
                                     len(st["cuts"]), ended, excluded, earlier)
    return ClassSearchStatus(n, budget, None, ended=ended, excluded=excluded, earlier=earlier)


def lora_gpu_lower_bound(inst: Instance, duration_s: float | None = None,
                         workers: int | None = None, pair_checks: int = 0) -> int:
    """The best twin-sound lower bound on the GPU count (``twin_lower_bound(...).best``)."""
    return twin_lower_bound(inst, duration_s, workers, pair_checks).best


SUPPLY_SOLVE_CHECKS = 0        # raise_bound_to's default: a solve only reads a study's result
CERT_PAIR_CHECKS = 64          # raise_bound_to: GPU checks of two_gpus_excluded ...
CERT_PAIR_MAX_ADAPTERS = 512   # ... on instances of at most this many adapters


def raise_bound_to(inst: Instance, lb: int, target: int, duration_s: float,
                   workers: int | None = None, supply_checks: int = SUPPLY_SOLVE_CHECKS,
                   full_counts: bool = False, class_checks: int | None = None) -> int:
    """``target`` when the twin-sound exclusions show that no twin-accepted placement uses
    ``target - 1`` = ``lb`` GPUs, else ``lb``: the checks a certificate needs when a placement
    is one GPU above the bound, run without the load thresholds ``twin_lower_bound`` uses to
    spare them elsewhere. One GPU: ``one_gpu_excluded`` (exact, every Amax); k >= 2 GPUs: under
    a latency SLO the count-partition bound over every grid count (``count_bound``, measuring
    until ``lb`` is excluded; ``full_counts`` as in ``twin_lower_bound``), then
    ``fullest_gpu_excluded`` then ``busiest_gpu_excluded`` (same assumptions as the bound);
    two GPUs: also every split replayed (``two_gpu_splits_excluded``, few adapters only), then
    every split of adapters and load by the canonical GPUs of both sides (``two_gpus_excluded``
    with up to ``CERT_PAIR_CHECKS`` GPU checks, same assumptions; instances of at most
    ``CERT_PAIR_MAX_ADAPTERS`` adapters, whose GPU checks take seconds, not minutes); any k:
    last, every GPU's vector of load-class counts (``class_gpus_excluded``: the caps and the
    supply alone, then ``class_checks`` GPU checks, default ``class_exclusion.CLASS_CHECKS``,
    where ``supply_checks`` > 0: a larger budget goes on from the saved search), the supply of the heaviest adapters (``supply_gpus_excluded``), and
    for two GPUs that of the two heaviest load classes (``pair_supply_gpus_excluded``), each
    with ``supply_checks`` GPU checks: ``supply_exclusion.SUPPLY_CHECKS`` in the studies
    (minutes on many adapters), none on a solve's path (``SUPPLY_SOLVE_CHECKS``), which takes a
    study's cached success only. With ``supply_checks`` > 0 the cached successes of those three
    searches are read first, before any step that replays."""
    inst = inst.bound_view()       # classes: the loosest SLO they allow
    if target != lb + 1 or lb < 1:
        return lb
    if lb == 1:
        return target if one_gpu_excluded(inst, duration_s, workers) else lb
    if adapter_count_bound(inst, duration_s, workers, lb, lb, max_count=len(inst.adapters),
                           measure_max=None if full_counts else solve_count_max(duration_s)
                           )[0] > lb:          # under an SLO, one GPU type: else lb
        return target
    if supply_checks and _cached_search_exclusion(inst, lb, duration_s, workers):
        return target
    if fullest_gpu_excluded(inst, lb, duration_s, workers):
        return target
    if busiest_gpu_excluded(inst, lb, duration_s, workers):
        return target
    if lb == 2 and two_gpu_splits_excluded(inst, duration_s, workers, full_counts):
        return target
    if (lb == 2 and len(inst.adapters) <= CERT_PAIR_MAX_ADAPTERS
            and two_gpus_excluded(inst, duration_s, workers, CERT_PAIR_CHECKS)):
        return target
    if class_gpus_excluded(inst, lb, duration_s, workers, class_checks if supply_checks else 0):
        return target
    if supply_gpus_excluded(inst, lb, duration_s, workers, supply_checks):
        return target
    if lb == 2 and pair_supply_gpus_excluded(inst, duration_s, workers, supply_checks):
        return target
    return lb


def _cached_search_exclusion(inst: Instance, k: int, duration_s: float,
                             workers: int | None) -> bool:
    """A study's cached exclusion of ``k`` GPUs by the checked searches (class, supply, pair
    supply), read before any step replays anything: a proof stands whichever step found it,
    so a study's rerun (``--rebound``) does not spend the class step's checks on a point the
    supply step already certified."""
    return (class_gpus_excluded(inst, k, duration_s, workers, 0, cached_only=True)
            or supply_gpus_excluded(inst, k, duration_s, workers, 0)
            or (k == 2 and pair_supply_gpus_excluded(inst, duration_s, workers, 0)))


def twin_certificate(inst: Instance, placement, duration_s: float | None = None
                     ) -> tuple[bool, int]:
    """(certified, bound): ``certified`` when ``placement`` is twin-accepted and its GPU count
    equals the twin-sound lower bound for its verification window (then no twin-accepted
    placement uses fewer GPUs). ``duration_s`` defaults to the window the placement was
    verified with, else the instance's."""
    dur = duration_s if duration_s is not None else (placement.verify_duration_s
                                                    or inst.duration_s)
    lb = lora_gpu_lower_bound(inst, dur)
    if placement.verdict == "accepted" and placement.gpus and placement.n_gpus == lb + 1:
        lb = raise_bound_to(inst, lb, placement.n_gpus, dur)
    ok = placement.verdict == "accepted" and bool(placement.gpus) and placement.n_gpus == lb
    return ok, lb


TWIN_OPTIMAL = "optimal in the twin"


def placement_claim(inst: Instance, placement, duration_s: float | None = None) -> str | None:
    """The optimality claim ``placement`` supports in the twin: ``TWIN_OPTIMAL`` when its GPU
    count equals a twin-sound lower bound (``twin_certificate``), else None."""
    return TWIN_OPTIMAL if twin_certificate(inst, placement, duration_s)[0] else None


def unsupported_rank_reason(inst: Instance) -> Reason | None:
    """The pre-check's ``rank_unsupported`` reason: adapters whose rank starts on no GPU type of
    the instance (at Amax 1 or more); None when every rank does."""
    usable_ranks: set[int] = set()
    for t in inst.gpu_types:
        prof = t.load_profile()
        usable_ranks |= {r for r in prof.supported_ranks if max_startable_amax(prof, r) >= 1}
    bad_rank = [a for a in inst.adapters if a.rank not in usable_ranks]
    if not bad_rank:
        return None
    ranks = sorted({a.rank for a in bad_rank})
    return Reason("rank_unsupported",
                  f"{len(bad_rank)} adapter(s) have rank(s) {ranks} that no GPU type supports "
                  f"(supported: {sorted(usable_ranks)}): {_listing([a.id for a in bad_rank])}",
                  tuple(a.id for a in bad_rank))


def precheck(inst: Instance, allow_split: bool = False) -> FeasibilityReport:
    """Run every pre-check on ``inst`` and collect the reasons (never raises for infeasibility)."""
    thr = inst.starvation_threshold
    cap = {t.name: type_capacity_tps(inst, t) for t in inst.gpu_types}
    limit = {k: v / thr for k, v in cap.items()}      # most offered tps a GPU may carry
    reasons: list[Reason] = []

    bad_rank = unsupported_rank_reason(inst)
    if bad_rank is not None:
        reasons.append(bad_rank)

    best = max(limit.values())
    if not allow_split:
        heavy = [a for a in inst.adapters if inst.load_tps(a) > best]
        if heavy:
            worst = max(heavy, key=inst.load_tps)
            reasons.append(Reason(
                "adapter_overload",
                f"{len(heavy)} adapter(s) offer more than one GPU can serve "
                f"({best:.0f} tok/s = capacity / threshold); largest: '{worst.id}' with "
                f"{inst.load_tps(worst):.0f} tok/s: {_listing([a.id for a in heavy])}",
                tuple(a.id for a in heavy)))

    pool = sum(t.count * limit[t.name] for t in inst.gpu_types)
    total = inst.total_load_tps
    lb = gpu_lower_bound(inst)
    if total > pool:
        reasons.append(Reason(
            "pool_capacity",
            f"total offered load {total:.0f} tok/s exceeds what the pool's "
            f"{inst.total_gpus_available} GPU(s) can serve ({pool:.0f} tok/s); at least {lb} "
            f"GPU(s) are needed"))
    budget = inst.objective.gpu_budget
    if budget is not None and budget < lb:
        reasons.append(Reason(
            "gpu_budget",
            f"objective.gpu_budget {budget} is below the capacity lower bound of {lb} GPU(s)"))
    return FeasibilityReport(inst.name, tuple(reasons), cap, lb)
