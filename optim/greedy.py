"""Greedy Maxpack placement (first-fit decreasing with surrogate testing points) and twin repair.

Order. Adapters are grouped by rank, largest rank first (a GPU's ``max_lora_rank`` is then set by
its first adapter and never grows); inside a group rates are taken in zigzag order (largest,
smallest, second largest, second smallest, ...) so that every prefix mixes hot and cold adapters.

Amax. A prefix is feasible when the surrogate accepts it at any Amax of its grid; the GPU then
gets the accepted Amax of highest predicted throughput, preferring values up to the adapter
count (plus the smallest grid value above it), since more slots than adapters only cost memory.

Filling. GPUs are opened one at a time and filled next-fit along that order. For the open GPU the
additive features of every prefix of the remaining queue are prefix sums, so the fast surrogate
evaluates a whole set of *testing points* (prefix sizes 1, 2, 4, 8, 16, 24, 32, 48, 64, ... and
the exact remaining count — the earlier version padded the last test by the committed count
instead) against every Amax candidate in one call. The GPU takes the largest passing testing
point, refined by bisection up to the first failing point after it. (A surrogate need not be
monotone in the prefix: a hot adapter may fail alone at the small Amax values a single adapter
allows, yet pass among 16 adapters at Amax 32; stopping at the first failure would close such
GPUs nearly empty.) the untested adapters go back to the queue and the GPU closes with the Amax of highest
predicted throughput. Memory errors are exact (the profile's KV table inside the model).

Heterogeneous pools. Each new GPU is filled once per GPU type that still has units; the type is
chosen by the objective: ``gpus`` takes the type that absorbs the most load, ``cost`` the most
load per dollar, ``latency`` the most load (then the latency objective only scores).

Shrink. Next-fit in that order can leave a GPU's worth of slack spread over several GPUs (hot
adapters late in the order); while the surrogate accepts the adapters spread load-balanced
(largest first onto the least-loaded GPU) over one GPU fewer, greedy takes that spread.

Pool exhausted. When the queue is not empty and no GPU is left, greedy does not declare the
instance infeasible (the earlier version did, although a random placement could serve it): it
spreads the adapters over every available GPU, largest load first onto the least-loaded GPU of
a rank-compatible kind, and keeps that placement if the surrogate accepts every GPU; otherwise the
result is ``over_pool`` (more GPUs than the pool has).

Surrogate. By default greedy packs with the fast (distilled) surrogate, its most accurate
model. ``surrogate="capacity"`` packs with the encodable capacity model instead — exactly the
model the MILP / CP-SAT methods encode, so that greedy and exact optima can be compared on the
same ground (the optimality-gap study does; DESIGN.md section 5).

Repair. With verification on, every GPU is replayed in the fleet twin. When the twin rejects a
GPU, the adapters are first spread load-balanced over the same GPUs (kept when the surrogate and
the twin accept every GPU: next-fit leaves the last GPU light). Otherwise a rejected GPU gets the
Amax of highest twin throughput among every integer 1..adapters + 1 (``optim.amax_search``) when
the twin accepts it there; failing that it loses the adapters at the end of its list (bisection on the prefix length, each candidate checked
by the twin), and the removed adapters are placed by the same greedy fill on new GPUs, whose
twin verdicts are checked in turn, until the twin accepts every GPU. Each change is recorded in
``Placement.repairs``.

Compaction. Once the twin accepts, ``optim.compaction`` tries fewer GPUs, load-balanced, with each
GPU's Amax searched by the twin over every integer (the surrogates only know their Amax grid),
down to the twin lower bound (option ``compact``, default on; it leaves split placements alone).

SLO. Under a latency SLO the packing surrogate is also gated by ``optim.slo_capacity``: the
twin-measured load one GPU carries under the SLO by rank and busy adapter count (``SloGated``;
a hundred light adapters count as a few busy ones). With verification on, where that packing
ends above the twin lower bound after repair and compaction, the packing gated by the
one-adapter limit alone is repaired and compacted too and the better of the two is kept
(``params["slo_packing"]`` names it): the table is a prediction, and either packing can be the
one compaction brings lower.

The twin's first fit. Under an SLO, with verification on and the gpus objective, where the kept
placement is still above the twin lower bound, ``optim.twin_first_fit`` packs once more with
the twin as the judge of every GPU (first-fit decreasing, each GPU at its best integer Amax,
the workload verification draws for it), within a replay budget; its placement, verified and
compacted, is kept when it uses fewer GPUs (a note says so).

Replication (instance ``max_homes`` k > 1, ``--max-homes``). Greedy splits exactly the adapters
that the surrogate says no GPU type serves alone (at any Amax), each into the fewest equal
shares m <= k of which one GPU serves one alone (``replicate``); every other adapter keeps one
home, so k > 1 changes nothing on an instance without such adapters. A share is packed like an
adapter of rate share x rate (what the twin replays on that GPU), with one rule more: two
shares of one adapter never share a GPU (filling skips a share whose adapter the GPU already
holds and leaves it first in the queue; spreading puts it on the least-loaded GPU without it).
An adapter that no GPU serves alone even at a 1/k share fails with a message naming it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from twin.workload import Adapter

from .balance import balanced_members
from .instance import GpuType, Instance
from .registry import MethodOptions
from .objectives import Objective
from .placement import GpuMetrics, GpuPlan, Placement, plan_gpu
from .slo_capacity import SloCapacity, measure_slo_capacity
from .twin_first_fit import twin_first_fit

TRAINED_DIR = Path(__file__).resolve().parent.parent / "surrogates" / "trained"
Item = tuple[Adapter, float]            # an adapter and the share of its traffic on one GPU
TEST_POINTS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
MAX_PER_GPU = 512


# ----------------------------------------------------------------------------- surrogate access
_FAST_CACHE: dict[str, object] = {}


def load_fast_model(profile: str):
    """The committed fast surrogate of a profile (``surrogates/trained/<profile>/fast``)."""
    if profile not in _FAST_CACHE:
        from surrogates.fast import FastModel
        stem = TRAINED_DIR / profile / "fast"
        if not stem.with_suffix(".json").exists():
            raise ValueError(f"greedy: no trained fast surrogate for profile '{profile}' "
                             f"(expected {stem}.json); run `python -m surrogates train`")
        _FAST_CACHE[profile] = FastModel.load(stem)
    return _FAST_CACHE[profile]


class CapacitySurrogate:
    """The encodable capacity model behind the fast model's ``predict_unchecked`` interface
    (out-of-domain rows count as starved)."""

    def __init__(self, model) -> None:
        self.model = model

    def predict_unchecked(self, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        thr, feasible, ood = self.model.predict_with_flags(M)
        return thr, ~(feasible & ~ood)


class SloGated:
    """A packing surrogate that also calls a GPU infeasible when its offered load exceeds what
    one GPU of the type carries under the instance's latency SLO: ``capacity.row_caps``, the
    twin-measured limit by rank and busy adapter count (``optim.slo_capacity``), never above
    the one-adapter limit. It stops the throughput surrogate from packing GPUs the SLO must
    then split (a prediction: the twin verifies, repair fixes what it rejects)."""

    def __init__(self, model, capacity, load_col: int) -> None:
        self.model, self.capacity, self.load_col = model, capacity, int(load_col)

    def predict_unchecked(self, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        thr, starved = self.model.predict_unchecked(M)
        return thr, starved | (M[:, self.load_col] > self.capacity.row_caps(M))


SURROGATES = ("fast", "capacity")
_CAPACITY_CACHE: dict[str, CapacitySurrogate] = {}


def load_surrogate(profile: str, kind: str = "fast"):
    """The packing surrogate of a profile: ``fast`` or ``capacity`` (module docstring)."""
    if kind == "fast":
        return load_fast_model(profile)
    if kind == "capacity":
        from .exact.capacity import load_capacity_model, trained_dir
        key = str(trained_dir() / profile)
        if key not in _CAPACITY_CACHE:
            model = load_capacity_model(profile)
            if model is None:
                raise ValueError(f"greedy: no trained capacity model for profile '{profile}'; "
                                 "run `python -m surrogates train`")
            _CAPACITY_CACHE[key] = CapacitySurrogate(model)
        return _CAPACITY_CACHE[key]
    raise ValueError(f"greedy: surrogate must be one of {SURROGATES}, got {kind!r}")


def amax_candidates() -> np.ndarray:
    """Amax values the surrogates are trained on (their domain)."""
    from surrogates.dataset import AMAX_GRID
    return np.asarray(AMAX_GRID, dtype=np.float64)


# ----------------------------------------------------------------------------- ordering
def maxpack_order(adapters: Sequence[Adapter]) -> list[int]:
    """Indices in Maxpack order: rank groups largest first, zigzag rates inside a group."""
    order: list[int] = []
    for rank in sorted({a.rank for a in adapters}, reverse=True):
        grp = sorted((i for i, a in enumerate(adapters) if a.rank == rank),
                     key=lambda i: (-adapters[i].rate, adapters[i].id))
        lo, hi = 0, len(grp) - 1
        take_hi = True
        while lo <= hi:
            if take_hi:
                order.append(grp[lo])
                lo += 1
            else:
                order.append(grp[hi])
                hi -= 1
            take_hi = not take_hi
    return order


# ----------------------------------------------------------------------------- one GPU
def useful_amax(ks: np.ndarray, amaxes: np.ndarray) -> np.ndarray:
    """Mask (len(ks), len(amaxes)): Amax values up to k, plus the smallest one >= k (more slots
    than adapters only costs KV memory)."""
    ks = np.asarray(ks, dtype=np.float64)[:, None]
    a = np.asarray(amaxes, dtype=np.float64)[None, :]
    first_ge = np.min(np.where(a >= ks, a, np.inf), axis=1, keepdims=True)
    return (a <= ks) | (a == first_ge)

@dataclass(frozen=True)
class Fill:
    """Result of filling one GPU from queue position ``start``: ``k`` adapters at ``amax``."""

    k: int
    amax: int
    max_rank: int
    throughput: float
    load: float


def _rows(prefix: np.ndarray, ks: np.ndarray, max_rank: int, amaxes: np.ndarray) -> np.ndarray:
    """Feature rows (FEATURES order) for prefix sizes ``ks`` x Amax candidates."""
    add = prefix[ks - 1]                                   # (len(ks), n_additive)
    n_k, n_a = len(ks), len(amaxes)
    M = np.empty((n_k * n_a, add.shape[1] + 2))
    M[:, :add.shape[1]] = np.repeat(add, n_a, axis=0)
    M[:, -2] = float(max_rank)
    M[:, -1] = np.tile(amaxes, n_k)
    return M


def fill_gpu(phi: np.ndarray, ranks: np.ndarray, start: int, model, amaxes: np.ndarray,
             load_index: int) -> Fill:
    """Largest feasible prefix of ``phi[start:]`` on one GPU (see module docstring)."""
    remaining = len(phi) - start
    kmax = min(remaining, MAX_PER_GPU)
    prefix = np.cumsum(phi[start:start + kmax], axis=0)
    max_rank = int(ranks[start])
    cache: dict[int, tuple[bool, int, float]] = {}

    def evaluate(ks: list[int]) -> None:
        todo = [k for k in ks if k not in cache]
        if not todo:
            return
        karr = np.asarray(todo, dtype=np.int64)
        thr, starved = model.predict_unchecked(_rows(prefix, karr, max_rank, amaxes))
        thr = thr.reshape(len(todo), len(amaxes))
        ok = ~starved.reshape(len(todo), len(amaxes))
        pref = ok & useful_amax(karr, amaxes)
        for j, k in enumerate(todo):
            if ok[j].any():
                choose = pref[j] if pref[j].any() else ok[j]
                cand = np.where(choose, thr[j], -np.inf)
                b = int(np.argmax(cand))          # first max -> the smaller Amax on ties
                cache[k] = (True, int(amaxes[b]), float(thr[j, b]))
            else:
                cache[k] = (False, 0, 0.0)

    points = sorted({k for k in TEST_POINTS if k <= kmax} | {kmax})
    evaluate(points)
    good, bad = 0, None
    for k in points:                             # the largest passing testing point ...
        if cache[k][0]:
            good, bad = k, None
        elif bad is None:
            bad = k                              # ... and the first failing one after it
    if bad is not None:                          # bisection between last pass and first fail
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            evaluate([mid])
            if cache[mid][0]:
                lo = mid
            else:
                hi = mid
        good = lo
    if good == 0:
        return Fill(0, 0, max_rank, 0.0, 0.0)
    _, amax, thr = cache[good]
    return Fill(good, amax, max_rank, thr, float(prefix[good - 1, load_index]))


# ----------------------------------------------------------------------------- whole instance
def _choose(fills: dict[str, Fill], types: dict[str, GpuType], objective: str) -> str | None:
    usable = {t: f for t, f in fills.items() if f.k > 0}
    if not usable:
        return None
    if objective == "cost":
        return max(usable, key=lambda t: (usable[t].load / max(types[t].price_per_hour, 1e-12),
                                          usable[t].k, t))
    return max(usable, key=lambda t: (usable[t].load, usable[t].k, t))


def _packing_inputs(inst: Instance, surrogate: str, adapters: Sequence[Adapter] | None = None,
                    shares: Sequence[float] | None = None,
                    caps: dict[str, SloCapacity] | None = None
                    ) -> tuple[list[Adapter], dict, np.ndarray]:
    """Adapters (default: the instance's), the packing surrogate per GPU type name (gated by
    the SLO capacity ``caps`` where given: ``SloGated``), and the adapters' feature rows at the
    routed rates (``shares`` x rate; default shares 1) — what filling and spreading read."""
    from surrogates.features import IDX
    ads = list(inst.adapters if adapters is None else adapters)
    models = {t.name: load_surrogate(t.profile, surrogate) for t in inst.gpu_types}
    for name, cap in (caps or {}).items():
        models[name] = SloGated(models[name], cap, IDX["load"])
    return ads, models, _features(inst, ads, shares)


def _features(inst: Instance, adapters: Sequence[Adapter], shares: Sequence[float] | None
              ) -> np.ndarray:
    """Feature rows of ``adapters`` at rate x share (what one GPU serving that share sees)."""
    from surrogates.features import adapter_feature_matrix
    sh = [1.0] * len(adapters) if shares is None else list(shares)
    return adapter_feature_matrix([a.rank for a in adapters],
                                  [a.rate * s for a, s in zip(adapters, sh)], inst.lengths)


def _routed(adapters: Sequence[Adapter], shares: Sequence[float]) -> list[Adapter]:
    """The adapters as the GPUs holding the shares see them (rate x share)."""
    return [a if s == 1.0 else replace(a, rate=a.rate * s) for a, s in zip(adapters, shares)]


def _distinct_prefix(queue: Sequence[int], ids: Sequence[str], limit: int) -> list[int]:
    """Up to ``limit`` positions of ``queue`` in order, skipping a share of an adapter already
    taken (two shares of one adapter never go on one GPU)."""
    out: list[int] = []
    seen: set[str] = set()
    for j in queue:
        if len(out) == limit:
            break
        if ids[j] not in seen:
            seen.add(ids[j])
            out.append(j)
    return out


def replicate(inst: Instance, surrogate: str = "fast", k: int | None = None
              ) -> tuple[list[Adapter], list[float], list[str]]:
    """(adapters, shares, notes): every adapter of ``inst`` once with share 1, except those the
    surrogate says no GPU type serves alone, which appear m times with share 1/m, m <= k
    (default ``inst.max_homes``) the fewest equal shares one GPU serves alone (module
    docstring). An adapter no 1/k share of which is served alone stays whole: the fill then
    tries it among others and, failing, names it (``greedy_plans``)."""
    k = inst.max_homes if k is None else int(k)
    if k == 1:
        return list(inst.adapters), [1.0] * len(inst.adapters), []
    ads, shares, notes = [], [], []
    fewest = _fewest_shares(inst, k, surrogate)
    split: list[str] = []
    for a, m in zip(inst.adapters, fewest):
        m = max(m, 1)
        ads += [a] * m
        shares += [1.0 / m] * m
        if m > 1:
            split.append(f"{a.id} over {m} GPUs")
    if split:
        notes.append(f"max_homes {k}: split {len(split)} adapter(s) no GPU serves alone into "
                     "equal shares: " + ", ".join(split[:8])
                     + (f" (+{len(split) - 8} more)" if len(split) > 8 else ""))
    return ads, shares, notes


def _fewest_shares(inst: Instance, k: int, surrogate: str) -> list[int]:
    """Per adapter of ``inst``: the fewest m in 1..k whose 1/m share some GPU type serves alone
    (surrogate, any Amax of its grid), 0 when no m <= k does. One surrogate call per type."""
    amaxes = amax_candidates()
    n, n_a = len(inst.adapters), len(amaxes)
    ms = np.tile(np.arange(1, k + 1), n)                       # (n k,) adapter-major
    ads = [a for a in inst.adapters for _ in range(k)]
    phi = _features(inst, ads, list(1.0 / ms))
    M = np.empty((n * k * n_a, phi.shape[1] + 2))
    M[:, :phi.shape[1]] = np.repeat(phi, n_a, axis=0)
    M[:, -2] = np.repeat([float(a.rank) for a in ads], n_a)
    M[:, -1] = np.tile(amaxes, n * k)
    ok = np.zeros((n, k), dtype=bool)
    for t in inst.gpu_types:
        _, starved = load_surrogate(t.profile, surrogate).predict_unchecked(M)
        ok |= (~starved.reshape(n, k, n_a)).any(axis=2)
    return [int(np.argmax(row)) + 1 if row.any() else 0 for row in ok]


def _spread(inst: Instance, adapters: Sequence[Adapter], models: dict[str, object],
            phi_all: np.ndarray, amaxes: np.ndarray,
            slots: Sequence[GpuType] | None = None,
            shares: Sequence[float] | None = None) -> list[GpuPlan] | None:
    """Every GPU of ``slots`` (default: every available GPU) used; largest load first onto the
    least-loaded GPU (``balanced_members``: shares of one adapter on distinct GPUs); None unless the
    surrogate accepts every GPU. ``phi_all``: the rows at the routed rates."""
    if slots is None:
        slots = [t for t in inst.gpu_types for _ in range(t.count)]
    if not slots:
        return None
    shares = [1.0] * len(adapters) if shares is None else list(shares)
    members = balanced_members(inst, adapters, len(slots), shares)
    if members is None:
        return None
    plans = []
    for t, mem in zip(slots, members):
        if not mem:
            continue
        if len(mem) > MAX_PER_GPU:      # beyond the surrogates' adapter-count domain
            return None
        phi = phi_all[mem].sum(axis=0)
        mr = max(adapters[i].rank for i in mem)
        M = _rows(phi[None, :], np.array([1]), mr, amaxes)
        thr, starved = models[t.name].predict_unchecked(M)
        if starved.all():
            return None
        pref = ~starved & useful_amax(np.array([len(mem)]), amaxes)[0]
        b = int(np.argmax(np.where(pref if pref.any() else ~starved, thr, -np.inf)))
        pred = GpuMetrics(float(phi[2]), float(thr[b]), False, False)
        plans.append(plan_gpu(t.name, t.profile, int(amaxes[b]),
                              [(adapters[i], shares[i]) for i in mem], inst.mean_tokens, mr, pred))
    return plans


def greedy_plans(inst: Instance, adapters: Sequence[Adapter], objective: str,
                 pool: dict[str, int] | None = None, surrogate: str = "fast",
                 shares: Sequence[float] | None = None, caps: dict[str, SloCapacity] | None = None
                 ) -> tuple[list[GpuPlan], bool, list[str]]:
    """Greedy fill of ``adapters`` onto GPUs of ``pool`` (type -> units; default the instance's)
    with the ``surrogate`` packing model; ``shares`` (default 1 each) are the parts of each
    adapter's traffic the items carry (``replicate``: an adapter may appear once per share).
    Returns (plans, over_pool, notes)."""
    from surrogates.features import IDX

    types = {t.name: t for t in inst.gpu_types}
    pool = dict(pool) if pool is not None else {t.name: t.count for t in inst.gpu_types}
    shares = [1.0] * len(adapters) if shares is None else list(shares)
    adapters, models, phi_all = _packing_inputs(inst, surrogate, adapters, shares, caps)
    amaxes = {name: amax_candidates() for name in models}
    order = maxpack_order(_routed(adapters, shares))
    ordered = [(adapters[i], shares[i]) for i in order]
    ids = [a.id for a, _ in ordered]
    distinct = len(set(ids)) == len(ids)
    ranks = np.array([a.rank for a, _ in ordered])
    phi = phi_all[order]
    plans: list[GpuPlan] = []
    notes: list[str] = []
    over_pool = False
    queue = list(range(len(ordered)))
    while queue:
        avail = [n for n, c in pool.items() if c > 0]
        if not avail:
            spread = _spread(inst, adapters, models, phi_all, amaxes[inst.gpu_types[0].name],
                             shares=shares)
            if spread is not None:
                notes.append("next-fit needed more GPUs than the pool has; a load-balanced "
                             "spread over all available GPUs is predicted feasible")
                return spread, False, notes
            over_pool = True
            avail = [max(types, key=lambda n: types[n].count)]
            pool[avail[0]] = pool.get(avail[0], 0) + 1
        cand = queue[:MAX_PER_GPU] if distinct else _distinct_prefix(queue, ids, MAX_PER_GPU)
        cphi, cranks = phi[cand], ranks[cand]
        fills = {n: fill_gpu(cphi, cranks, 0, models[n], amaxes[n], IDX["load"]) for n in avail}
        t = _choose(fills, types, objective)
        if t is None:
            a, s = ordered[cand[0]]
            part = "" if s == 1.0 else f", a {s:.3g} share"
            k = inst.max_homes
            split = (f", nor split over max_homes={k} GPUs (no 1/{k} share is served alone)"
                     if k > 1 and s == 1.0 else "")
            slo = (f"; under the SLO {inst.slo.describe()} one GPU carries at most "
                   + ", ".join(f"{c.one_tps:,.0f} tok/s ({n})" for n, c in caps.items())
                   if caps else "")
            raise ValueError(f"adapter '{a.id}' (rank {a.rank}, rate {a.rate}{part}) cannot be "
                             f"served by any GPU type, even alone (surrogate){split}{slo}")
        f = fills[t]
        pool[t] -= 1
        pred = GpuMetrics(f.load, f.throughput, False, False)
        plans.append(plan_gpu(t, types[t].profile, f.amax,
                              [ordered[j] for j in cand[:f.k]], inst.mean_tokens,
                              f.max_rank, pred))
        if distinct:
            queue = queue[f.k:]
        else:
            taken = set(cand[:f.k])
            queue = [j for j in queue if j not in taken]
    return plans, over_pool, notes


# ----------------------------------------------------------------------------- twin repair
def _twin_ok(inst: Instance, plan: GpuPlan, duration_s: float, seed: int) -> tuple[bool, object]:
    from twin.profile import load_profile
    from twin.server import simulate_server
    m = simulate_server(load_profile(plan.profile), [a for a, _ in plan.adapters],
                        plan.server_config(inst.judging),
                        duration_s, lengths=inst.lengths, seed=seed)
    return m.accepted, m


def _best_twin_amax(inst: Instance, plan: GpuPlan, duration_s: float, seed: int
                    ) -> GpuPlan | None:
    """The plan at the Amax of highest twin throughput among every integer 1..adapters + 1
    (``amax_search.twin_best_amax``) when the twin accepts it there, else None."""
    from .amax_search import twin_best_amax
    return twin_best_amax(inst, plan, seed, duration_s)[0]


def _shrink(inst: Instance, plans: list[GpuPlan], surrogate: str,
            caps: dict[str, SloCapacity] | None = None) -> tuple[list[GpuPlan], bool]:
    """While the surrogate accepts the adapters spread (``_spread``) over the GPUs minus the last
    one opened, take that spread. Next-fit in Maxpack order can leave a GPU's worth of slack
    spread over several GPUs (a few hot adapters late in the order); returns (plans, shrunk)."""
    if len(plans) < 2:
        return plans, False
    types = {t.name: t for t in inst.gpu_types}
    ads, shares = _plan_items(inst, plans)
    ads, models, phi = _packing_inputs(inst, surrogate, ads, shares, caps)
    amaxes = amax_candidates()
    shrunk = False
    while len(plans) >= 2:
        cand = _spread(inst, ads, models, phi, amaxes, [types[g.gpu_type] for g in plans[:-1]],
                       shares)
        if cand is None:
            break
        plans, shrunk = cand, True
    return plans, shrunk


def _plan_items(inst: Instance, plans: Sequence[GpuPlan]) -> tuple[list[Adapter], list[float]]:
    """(adapters, shares) the plans hold: the instance's adapters with share 1 when nothing is
    split (the instance's order, as greedy always used), else every (adapter, share) of the
    plans in instance order (shares of one adapter in GPU order)."""
    pairs = [(a, s) for g in plans for a, s in g.adapters]
    if all(s == 1.0 for _, s in pairs):
        return list(inst.adapters), [1.0] * len(inst.adapters)
    pos = {a.id: i for i, a in enumerate(inst.adapters)}
    pairs.sort(key=lambda x: pos[x[0].id])          # stable: GPU order within an adapter
    return [a for a, _ in pairs], [s for _, s in pairs]


def _rebalanced(inst: Instance, p: Placement, models: dict, amaxes: np.ndarray,
                duration_s: float) -> Placement | None:
    """The placement's adapters (shares) spread over the same GPUs (``_spread``) when the
    surrogate and then the twin accept it, else None. Next-fit fills GPUs to the brim and
    leaves the last one light; a twin rejection near capacity is often cured by balancing,
    without a new GPU."""
    from .verify import verify
    if len(p.gpus) < 2:
        return None
    types = {t.name: t for t in inst.gpu_types}
    ads, shares = _plan_items(inst, p.gpus)
    plans = _spread(inst, ads, models, _features(inst, ads, shares), amaxes,
                    [types[g.gpu_type] for g in p.gpus], shares)
    if plans is None:
        return None
    cand = verify(p.with_(gpus=tuple(plans)), inst, duration_s=duration_s)
    return cand if cand.verdict == "accepted" else None


def repair(inst: Instance, placement: Placement, objective: str, duration_s: float,
           max_rounds: int = 20, surrogate: str = "fast",
           caps: dict[str, SloCapacity] | None = None) -> Placement:
    """Make every GPU twin-accepted (see module docstring); returns the repaired placement."""
    from .verify import verify
    p = verify(placement, inst, duration_s=duration_s)
    changes = list(p.repairs)
    amaxes = amax_candidates()
    models = _packing_inputs(inst, surrogate, caps=caps)[1] if p.verdict == "rejected" else None
    rounds = 0
    while p.verdict == "rejected" and rounds < max_rounds:
        rounds += 1
        balanced = _rebalanced(inst, p, models, amaxes, duration_s)
        if balanced is not None:
            changes.append(f"rebalanced the load over the same {balanced.n_gpus} GPU(s) "
                           "(largest load first onto the least-loaded GPU)")
            p = balanced
            break
        kept: list[GpuPlan] = []
        evicted: list[Item] = []
        alone: list[Item] = []      # from GPUs where even their first adapter alone failed
        for g, plan in enumerate(p.gpus):
            if plan.verified is not None and plan.verified.ok:
                kept.append(plan)
                continue
            fixed = _best_twin_amax(inst, plan, duration_s, inst.seed + g)
            if fixed is not None:
                changes.append(f"gpu {g}: Amax {plan.max_loras} -> {fixed.max_loras} "
                               "(twin rejected the predicted Amax)")
                kept.append(fixed)
                continue
            lo, hi = 0, len(plan.adapters)        # largest twin-accepted prefix
            best: GpuPlan | None = None
            while hi - lo > 1:
                mid = (lo + hi) // 2
                sub = plan_gpu(plan.gpu_type, plan.profile, plan.max_loras,
                               plan.adapters[:mid], inst.mean_tokens, plan.max_lora_rank)
                cand = _best_twin_amax(inst, sub, duration_s, inst.seed + g)
                if cand is not None:
                    lo, best = mid, cand
                else:
                    hi = mid
            moved = plan.adapters[lo:] if best is not None else plan.adapters
            if best is not None:
                kept.append(best)
                evicted.extend(moved)
            elif len(moved) > 1:    # packed together again they would fail again: one per GPU
                alone.extend(moved)
            else:
                evicted.extend(moved)
            changes.append(f"gpu {g}: twin rejected it; moved {len(moved)} adapter(s) "
                           f"({', '.join(a.id for a, _ in moved[:5])}"
                           f"{', ...' if len(moved) > 5 else ''}) to new GPUs")
        used = {}
        for plan in kept:
            used[plan.gpu_type] = used.get(plan.gpu_type, 0) + 1
        pool = {t.name: max(t.count - used.get(t.name, 0), 0) for t in inst.gpu_types}
        new, over, _ = (greedy_plans(inst, [a for a, _ in evicted], objective, pool, surrogate,
                                     [s for _, s in evicted], caps)
                        if evicted else ([], False, []))
        for plan in new:
            pool[plan.gpu_type] = max(pool.get(plan.gpu_type, 0) - 1, 0)
        for a, s in alone:
            one, over_one, _ = greedy_plans(inst, [a], objective, pool, surrogate, [s], caps)
            for plan in one:
                pool[plan.gpu_type] = max(pool.get(plan.gpu_type, 0) - 1, 0)
            new, over = new + one, over or over_one
        if new:
            changes.append(f"opened {len(new)} GPU(s) for the moved adapters")
        status = "over_pool" if (over or p.status == "over_pool") else "solved"
        p = verify(p.with_(gpus=tuple(kept + new), status=status, repairs=tuple(changes)), inst,
                   duration_s=duration_s)
    return p.with_(repairs=tuple(changes), params={**p.params, "repair_rounds": rounds})


# ----------------------------------------------------------------------------- method entry
def greedy(inst: Instance, obj: Objective, opts: MethodOptions) -> Placement:
    """Registered method ``greedy``; ``opts.extra``: ``repair`` (set by ``solve`` when
    verifying), ``surrogate`` (``fast`` default, or ``capacity``), ``compact`` (default True:
    after repair, ``optim.compaction`` takes GPUs away while the twin accepts). The instance's
    ``max_homes`` k > 1 splits the adapters no GPU serves alone (``replicate``)."""
    if (inst.uses_configurations or obj.name == "energy") and inst.max_homes > 1:
        return Placement(inst.name, "greedy", "failed", notes=(
            f"max_homes {inst.max_homes}: replication is not supported with catalog GPU types, "
            "power caps, a power budget or the energy objective (set max_homes to 1)",))
    if inst.uses_configurations or obj.name == "energy":   # types x caps: twin-measured
        from .config_greedy import solve_configurations
        ex = opts.extra
        return solve_configurations(inst, obj.name, bool(ex.get("repair") or ex.get("verify")),
                                    ex.get("duration_s"), ex.get("workers"))
    surrogate = opts.extra.get("surrogate", "fast")
    if surrogate not in SURROGATES:
        raise ValueError(f"greedy: option 'surrogate' must be one of {SURROGATES}, "
                         f"got {surrogate!r}")
    dur = opts.extra.get("duration_s")
    dur = float(dur if dur is not None else inst.duration_s)
    workers = opts.extra.get("workers")
    caps = measure_slo_capacity(inst, dur, workers)
    place = _pack(inst, obj.name, surrogate, caps)
    if not opts.extra.get("repair", False):
        return place
    if place.status != "failed":
        place = _verified(inst, place, obj.name, dur, surrogate, caps, opts)
    if caps and not _certified(place):
        # under an SLO the count-aware table is a prediction: where its packing is not
        # certified, the packing gated by the one-adapter limit alone is tried too
        one = {n: c.one_adapter_only() for n, c in caps.items()}
        alt = _pack(inst, obj.name, surrogate, one)
        if alt.status != "failed":
            alt = _verified(inst, alt, obj.name, dur, surrogate, one, opts)
        if _better(alt, place, obj):
            return alt.with_(params={**alt.params, "slo_packing": "one-adapter limit"},
                             notes=alt.notes + (
                                 "under the SLO, the packing gated by the one-adapter limit "
                                 f"alone took {alt.n_gpus} GPU(s), the count-aware one "
                                 f"{place.n_gpus if place.gpus else 'none'}",))
    if caps:
        place = place.with_(params={**place.params, "slo_packing": "count-aware"})
    if caps and obj.name == "gpus" and place.status == "solved" and not _certified(place):
        place = _twin_first_fit(inst, place, obj, dur, surrogate, caps, opts)
    return place


def _twin_first_fit(inst: Instance, place: Placement, obj: Objective, duration_s: float,
                    surrogate: str, caps: dict[str, SloCapacity], opts: MethodOptions
                    ) -> Placement:
    """``place``, or the twin's first-fit packing (``optim.twin_first_fit``), verified,
    repaired and compacted like ``place``, when it is twin-accepted on fewer GPUs (or ``place``
    is not twin-accepted: then on any count)."""
    accepted = place.verdict == "accepted"
    alt = twin_first_fit(inst, duration_s, opts.extra.get("workers"),
                         max_gpus=place.n_gpus - 1 if accepted else None)
    if alt is None:
        return place.with_(notes=place.notes + (
            ("the twin's first-fit packing found no placement on fewer than "
             f"{place.n_gpus} GPU(s)" if accepted else
             "the twin's first-fit packing found no placement") +
            " (it stops there and at its replay budget; one GPU type and whole adapters "
            "only)",))
    alt = _verified(inst, alt, obj.name, duration_s, surrogate, caps, opts)
    if not _better(alt, place, obj):
        return place
    return alt.with_(params={**place.params, **alt.params}, notes=place.notes + alt.notes + (
        f"the twin's first-fit packing took {alt.n_gpus} GPU(s), greedy's packing "
        f"{place.n_gpus} after repair and compaction",))


def _pack(inst: Instance, objective: str, surrogate: str,
          caps: dict[str, SloCapacity]) -> Placement:
    """Greedy's packing (fill, then shrink) under the SLO capacity ``caps`` (empty: none), not
    yet verified; ``failed`` when an adapter fits no GPU type."""
    t0 = time.perf_counter()
    try:
        ads, shares, notes = (replicate(inst, surrogate) if inst.max_homes > 1
                              else (list(inst.adapters), None, []))
        plans, over_pool, fill_notes = greedy_plans(inst, ads, objective, surrogate=surrogate,
                                                    shares=shares, caps=caps)
        notes = notes + fill_notes
        if not over_pool:
            opened = len(plans)
            plans, shrunk = _shrink(inst, plans, surrogate, caps)
            if shrunk:
                notes = notes + [f"a load-balanced spread over {len(plans)} GPUs (next-fit "
                                 f"opened {opened}) is predicted feasible"]
    except ValueError as e:       # an adapter no GPU type can serve, per the surrogate
        return Placement(inst.name, "greedy", "failed", wall_time_s=time.perf_counter() - t0,
                         notes=(str(e),))
    wall = time.perf_counter() - t0
    place = Placement(inst.name, "greedy", "over_pool" if over_pool else "solved",
                      tuple(plans), wall_time_s=wall, notes=tuple(notes),
                      params={"test_points": list(TEST_POINTS), "placement_wall_s": wall,
                              "surrogate": surrogate, "max_homes": inst.max_homes})
    if caps:
        place = place.with_(params={**place.params,
                                    "slo_load_cap_tps": {n: c.one_tps for n, c in caps.items()},
                                    "slo_capacity": [c.to_dict() for c in caps.values()]})
    return place


def _verified(inst: Instance, place: Placement, objective: str, duration_s: float,
              surrogate: str, caps: dict[str, SloCapacity], opts: MethodOptions) -> Placement:
    """``place`` repaired in the twin, then compacted (option ``compact``, default on)."""
    place = repair(inst, place, objective, duration_s, surrogate=surrogate, caps=caps)
    if opts.extra.get("compact", True) and place.status == "solved":
        from .compaction import compact
        place = compact(inst, place, duration_s, workers=opts.extra.get("workers"))
    return place


def _certified(p: Placement) -> bool:
    """Twin-accepted with as many GPUs as compaction's twin lower bound."""
    lb = p.params.get("lower_bound")
    return p.verdict == "accepted" and lb is not None and p.n_gpus <= lb


def _better(a: Placement, b: Placement, obj: Objective) -> bool:
    """``a`` is twin-accepted and ``b`` is not, or both are and ``a`` scores lower by ``obj``."""
    if a.verdict != "accepted" or a.status != "solved":
        return False
    if b.verdict != "accepted" or b.status != "solved":
        return True
    return obj.value(a) < obj.value(b)
