"""Twin in the loop: solve exactly, replay the placement in the fleet twin, cut, re-solve.

``solve_exact(inst, objective, solver=...)`` runs under one wall-clock deadline (the time
limit covers bounds, starts, model building, search and replays):

1. builds the ``PackingProblem`` (``capacity.build_problem``) and checks that every adapter
   fits some configuration (else: ``infeasible`` with the adapters named);
2. bounds (L1, count, Martello–Toth L2; the assignment LP where the model is small enough):
   the best one becomes a model row (``PackingProblem.gpu_lower_bound``);
3. starts that the model admits: first/best-fit decreasing on the mode's own capacities
   (``first_fit``), and — outside the constant-capacity mode — the best available heuristic
   (``greedy``, else ``maxbase``), run as ``optim solve --verify`` runs it, or a placement the
   caller hands in (``given``). A twin-accepted heuristic placement is the *incumbent*;
4. solves (``_model_solve``: arc-flow with its LP bound and dive where GPUs are limited by load
   alone, else the assignment model over the pool cut to what can beat the best start); at the
   deadline the best start is returned with the bound. Classical bin packing (one bin kind,
   ``classical_kind``) first gets a tabu search into the bound, column generation's exact bound
   and a packing search into it — with or without the arc-flow graph, so a capacity too fine
   for the graph (Scholl's hard set, 100,000) is decided the same way;
5. with ``verify``, replays the placement in the fleet twin (window ``duration_s``); for every
   GPU that starves or fails memory it first searches every integer Amax
   (``integer_amax_rescue``: the capacity model knows only its Amax grid, the twin can accept
   a GPU between grid values) and keeps the best one the twin accepts; for the GPUs no integer
   Amax serves it cuts and re-solves — until the twin accepts, the model
   can no longer beat the incumbent, the iteration limit
   (``instance.solver.max_repair_iterations``, default 30) or the deadline (replays that would
   pass it are not started). Every iteration is reported in ``params``. Cuts (``cut_mode``):

   * ``"capacity"`` (default): the rejected adapter set is also replayed under every other
     (rank, Amax) configuration the model admits it with, and each configuration the twin
     rejects gets a ``CapacityCut`` — its capacity pieces are lowered below the set's load from
     the set's adapter count on (``problem`` module docstring). One iteration thus corrects the
     surrogate wherever the twin disagrees with it for that set, instead of trying Amax values
     one solve at a time;
   * ``"exact"`` / ``"superset"``: a ``Cut`` forbidding that adapter set (or any superset of it)
     on any GPU of that type with that (rank, Amax) (not with replication, where a GPU's load
     is not fixed by its adapter set).

With replication (``max_homes`` > 1) every solve's shares are re-chosen, for the same homes, to
balance the GPUs' utilisation (``split.balance_shares``) before the twin replays them.

A final answer is never a placement the twin rejected when a twin-accepted one is known: the
incumbent is returned whenever the model's placement is rejected, not replayed, or not better.
``params["claim"]`` says what is proven: ``optimal in the twin`` (the count meets the twin-sound
lower bound, ``feasibility.twin_certificate``), ``optimal for the surrogate (...)`` (the model
proved its optimum and the twin accepts a placement with that count), ``optimal for the constant
capacities``, or None. Status ``optimal`` goes with a claim, ``solved`` with a bound and gap —
for a verified surrogate-mode answer the twin-sound bound (the surrogate's bound is kept as
``surrogate_best_bound``: it does not bound twin-accepted placements).
"""

from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Sequence

from twin.cli_support import Interrupted, run_interruptible

from ..instance import Instance
from ..placement import GpuMetrics, Placement, plan_gpu
from ..verify import verify as twin_verify
from .bounds import infeasible_adapters, lower_bounds
from .capacity import build_problem
from .common import SolveResult, effective, warm_start_solution
from .first_fit import best_start, solution_value
from .problem import LOAD_SCALE, CapacityCut, Cut, PackingProblem, scale_load
from .split import as_split_start, balance_shares, split_fit

DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_MAX_ITERATIONS = 30
LP_BOUND_MAX_PAIRS = 20_000     # (adapter, GPU slot) pairs up to which the assignment LP runs
# (adapter, GPU slot) pairs per second that building the assignment model takes (measured on the
# 2-core machine: Pyomo ~5k/s, CP-SAT ~9k/s, about halved for safety); a model that cannot be built
# in half the time left is not built
BUILD_PAIRS_PER_S = {"milp": 2_500, "cpsat": 4_000}
DIVE_SHARE = {"milp": 0.5, "cpsat": 0.8}   # of the time left, for the arc-flow LP dive
TABU_SHARE = 0.25       # of the time left, for each packing search into a proven bound
TABU_FIRST_SHARE = 0.1  # ... the first one, before column generation (which packs what it misses)
TABU_ROOT_SHARE = 0.1   # ... the one into column generation's root bound, before branch-and-price
COLGEN_SHARE = 0.7      # of the time left, for the column-generation bound and dive
CUT_MODES = ("capacity", "exact", "superset")


def heuristic_solution(inst: Instance, objective, P: PackingProblem, verify: bool = False,
                       duration_s: float | None = None, workers: int | None = None
                       ) -> tuple[str | None, list[tuple[int, list[int]]] | None,
                                  Placement | None]:
    """(method name, solution as (type index, adapter indices) per GPU, the placement) from
    greedy. With ``verify`` it runs as ``optim solve --verify`` runs it (twin repair,
    compaction), so an accepted placement is a twin-accepted incumbent. The solution is ``None``
    when greedy splits adapters or fails."""
    from ..greedy import greedy
    from ..registry import MethodOptions
    name = "greedy"
    extra = {}
    if verify:
        extra = {"repair": True, "duration_s": duration_s, "workers": workers}
    try:
        p = greedy(inst, objective, MethodOptions(seed=inst.seed, extra=extra))
        if verify and p.gpus and p.verdict is None:
            p = twin_verify(p, inst, duration_s=duration_s, workers=workers)
    except Exception:       # a heuristic failing must not stop the exact method
        return name, None, None
    return name, _as_solution(P, p), p


def _as_solution(P: PackingProblem, p: Placement) -> list[tuple[int, list[int]]] | None:
    """A placement as (type index, adapter indices) per GPU; ``None`` when it is empty, splits
    adapters or uses a GPU type the problem does not have."""
    split = _as_split(P, p) if p.gpus else None
    if split is None or any(s < 1 - 1e-9 for _, _, shares in split for s in shares):
        return None
    return [(t, items) for t, items, _ in split]


def _as_split(P: PackingProblem, p: Placement) -> list[tuple[int, list[int], list[float]]] | None:
    """A placement as (type index, adapter indices, shares) per GPU; ``None`` when it uses a
    GPU type or adapter the problem does not have."""
    idx = {a: i for i, a in enumerate(P.ids)}
    tix = {t.name: k for k, t in enumerate(P.types)}
    out = []
    for g in p.gpus:
        if g.gpu_type not in tix or any(a.id not in idx for a, _ in g.adapters):
            return None
        out.append((tix[g.gpu_type], [idx[a.id] for a, _ in g.adapters],
                    [float(s) for _, s in g.adapters]))
    return out


def _preferred_config(P: PackingProblem, t: int, p: int, items: Sequence[int],
                      load: int | None = None) -> int:
    """Among the configurations admitting the GPU, keep the solver's choice for latency; for
    gpus/cost prefer the smallest rank class, then the most load slack (objective unchanged).
    ``load``: the GPU's integer load when it carries shares (replication)."""
    if P.objective == "latency":
        return p
    ps = (P.configs_admitting(t, items) if load is None
          else P.configs_admitting_split(t, items, load))
    if not ps:
        return p
    cf = P.types[t].configs
    return min(ps, key=lambda q: (cf[q].rank, -cf[q].cap, cf[q].amax))


def to_placement(inst: Instance, P: PackingProblem, r: SolveResult, method: str) -> Placement:
    """A ``Placement`` from a solve result (predicted metrics from the configuration). With
    replication each adapter carries its solved share; a home without traffic (share 0,
    allowed by the model) is dropped, and the configuration re-chosen for what remains."""
    plans = []
    order = sorted(range(len(r.gpus)), key=lambda k: (r.gpus[k][0], min(r.gpus[k][2])))
    for k in order:
        t, p, items = r.gpus[k]
        kept = [(i, s) for i, s in zip(items, r.gpu_shares(k)) if s > 0]
        if not kept:
            continue
        items = [i for i, _ in kept]
        p = _preferred_config(P, t, p, items, P.split_load(items, [s for _, s in kept])
                              if P.splits else None)
        c = P.types[t].configs[p]
        gt = inst.gpu_types[t]
        pairs = [(inst.adapters[i], s) for i, s in kept]
        offered = sum(inst.load_tps(inst.adapters[i]) * s for i, s in kept)
        pred = GpuMetrics(offered, min(offered, c.cap / 1000.0), False, False, c.itl_ms)
        plans.append(plan_gpu(gt.name, gt.profile, c.amax, pairs, inst.mean_tokens,
                              max_lora_rank=c.rank, predicted=pred))
    status = {"optimal": "optimal", "feasible": "solved", "infeasible": "infeasible"}.get(
        r.status, "failed")
    return Placement(inst.name, method, status, tuple(plans), best_bound=r.bound)


def capacity_cuts(inst: Instance, P: PackingProblem,
                  rejected: Sequence[tuple[int, int, int, Sequence[int], float | None]],
                  duration_s: float | None, workers: int | None,
                  deadline: float | None = None,
                  replay_s: float | None = None) -> list[CapacityCut]:
    """Capacity cuts for GPUs the twin rejected, given as (type index, rank, Amax, adapters,
    twin throughput or None): the rejected configuration, plus every other (rank, Amax)
    configuration admitting the set that the twin also rejects (replays in parallel, in batches
    of one per worker; with a ``deadline`` no batch starts that would end after it, given
    ``replay_s`` seconds per replay). With replication the adapters are (index, share) pairs:
    the GPU's load is the shares' load and the probes replay the same shares."""
    from twin.fleet import simulate_fleet

    from ..placement import plan_gpu
    theta = inst.starvation_threshold
    out: list[CapacityCut] = []
    probes: list[tuple[int, int, int, Sequence]] = []
    for t, rank, amax, items, served in rejected:
        out.append(_cut_for(P, t, rank, amax, items, served, theta))
        cf = P.types[t].configs
        seen = {(rank, amax)}
        idx, shares = _pairs(items)
        for p in (P.configs_admitting(t, idx) if shares is None
                  else P.configs_admitting_split(t, idx, P.split_load(idx, shares))):
            key = (cf[p].rank, cf[p].amax)
            if key not in seen:
                seen.add(key)
                probes.append((t, *key, items))
    if not probes:
        return out
    from .common import default_threads
    batch = max(1, workers or default_threads())
    for b0 in range(0, len(probes), batch):
        if deadline is not None and replay_s is not None \
                and time.perf_counter() + replay_s > deadline:
            break
        part = probes[b0:b0 + batch]
        jobs = []
        for t, rank, amax, items in part:
            gt = inst.gpu_types[t]
            idx, shares = _pairs(items)
            plan = plan_gpu(gt.name, gt.profile, amax,
                            [(inst.adapters[i], s) for i, s in zip(idx, shares or [1.0] * len(idx))],
                            inst.mean_tokens, max_lora_rank=rank)
            jobs.append(plan.twin_assignment(replace(inst.judging, threshold=theta)))
        t0 = time.perf_counter()
        res = simulate_fleet(jobs, duration_s=float(duration_s or inst.duration_s),
                             lengths=inst.lengths, seed=inst.seed, workers=workers,
                             check_routing=False)
        replay_s = max(replay_s or 0.0, time.perf_counter() - t0)
        for (t, rank, amax, items), m in zip(part, res.per_gpu):
            if not m.accepted:
                out.append(_cut_for(P, t, rank, amax, items,
                                    0.0 if m.memory_error else m.throughput_tps, theta))
    return out


def _pairs(items: Sequence) -> tuple[list[int], list[float] | None]:
    """(adapter indices, shares or None) of a cut's adapters: plain indices (no replication)
    or (index, share) pairs."""
    if items and isinstance(items[0], tuple):
        return [int(i) for i, _ in items], [float(s) for _, s in items]
    return [int(i) for i in items], None


def _cut_for(P: PackingProblem, t: int, rank: int, amax: int, items: Sequence,
             served_tps: float | None, theta: float) -> CapacityCut:
    """The cut at ``L_cut = min(L*, T*/theta)`` (``problem`` module docstring); with shares,
    ``L*`` is the shares' load and the feature counts every home in full, as the model does."""
    idx, shares = _pairs(items)
    load = sum(P.loads[i] for i in idx) if shares is None else P.split_load(idx, shares)
    if served_tps is not None:
        load = min(load, scale_load(served_tps / theta))
    return CapacityCut(t, rank, amax, sum(P.xs[i] for i in idx), load)


def _model_solve(P: PackingProblem, solver: str, deadline: float, threads: int | None,
                 starts: Sequence[tuple[str, Sequence[tuple[int, Sequence[int]]]]],
                 seed: int, split_given: Sequence[tuple[str, Sequence]] = ()
                 ) -> tuple[SolveResult, dict[str, Any]]:
    """One solve of ``P`` before ``deadline``: the arc-flow model when it is exact for ``P``
    (``arcflow.applicable``; LP bound and an LP dive first), else the assignment model with the
    pool cut down to what can beat the best start. With replication, ``split.split_fit`` and the
    split placements of ``split_given`` ((name, [(type, adapters, shares), ...])) the model
    admits are starts too. Returns the result and a record of how."""
    info: dict[str, Any] = {}
    E = effective(P)
    mapped = [(name, sol, m) for name, sol in starts
              if (m := warm_start_solution(P, E, sol)) is not None]
    first = min(mapped, key=lambda s: solution_value(P, s[1]), default=None)
    best = first[:2] if first else None
    split_best = _split_start(P, split_given) if P.splits else None
    if split_best is not None and best is not None \
            and split_best[1].objective >= solution_value(P, best[1]):
        split_best = None                   # an unsplit start at least as good
    info["start"] = split_best[0] if split_best else (best[0] if best else None)
    r = _solve_model(P, solver, deadline, threads, best, seed, info,
                     split_best[1] if split_best else None)
    if r.status == "unknown" and r.objective is None and split_best is not None:
        name, st = split_best
        r = replace(st, solver=solver, bound=r.bound, solve_time_s=r.solve_time_s,
                    warm_start_used=True,
                    details={"termination": f"time limit; best start ({name}) returned"})
    elif r.status == "unknown" and r.objective is None and first is not None:
        # the search found nothing in time: the best start the model admits, with the bound
        name, sol, m = first
        gpus = tuple((t, E.orig[t][p], items) for t, p, items in m)
        r = SolveResult(solver, "feasible", solution_value(P, sol), r.bound, r.solve_time_s,
                        gpus, True, {"termination": f"time limit; best start ({name}) returned"})
    return r, info


def _split_start(P: PackingProblem, given: Sequence[tuple[str, Sequence]]
                 ) -> tuple[str, SolveResult] | None:
    """The best replication start: ``split_fit`` or a given split placement the model admits."""
    cands = [(name, st) for name, sol in given if (st := as_split_start(P, sol)) is not None]
    fit = split_fit(P)
    if fit is not None:
        cands.append(("split-fit", fit))
    return min(cands, key=lambda c: c[1].objective, default=None)


def _solve_model(P: PackingProblem, solver: str, deadline: float, threads: int | None,
                 best: tuple[str, Sequence] | None, seed: int,
                 info: dict[str, Any], split_hint: SolveResult | None = None) -> SolveResult:
    """The solve of ``_model_solve`` (model choice, dive, search), recording into ``info``;
    ``split_hint``: a replication start (assignment model only)."""
    from . import arcflow
    from .cpsat import solve_cpsat
    from .milp import solve_milp

    reason = arcflow.applicable(P)
    G = arcflow.build_graph(P) if reason is None else None
    if reason is None and G is None:
        reason = "arc-flow graph above its size limit"
    info["model"] = "arcflow" if G is not None else "assignment"
    kind = classical_kind(P)
    if kind is not None:
        # classical bin packing (with or without the graph: capacities too fine for one, e.g.
        # Scholl's hard set at 100,000, take the same path)
        P, best, done = _classical_search(P, kind, best, deadline, solver, info,
                                          retry=G is None)
        if done is not None:
            return done
    if G is not None:
        info["n_arcs"] = G.n_arcs
        # CP-SAT seldom finds an exactly-full packing by itself (triplets); HiGHS' MIP does,
        # so the dive gets most of the time before cpsat and half of it before milp
        share = DIVE_SHARE[solver]
        dive = arcflow.lp_dive(P, G, min(deadline, time.perf_counter()
                                         + share * max(0.0, deadline - time.perf_counter())),
                               threads=threads)
        info.update({"lp_bound": dive.lp_value, "lp_dive_s": round(dive.wall_s, 3),
                     "lp_solves": dive.solves,
                     "dive_gpus": len(dive.gpus) if dive.gpus is not None else None})
        lb = P.gpu_lower_bound
        if dive.lp_value is not None and P.objective == "gpus":
            lb = max(lb, math.ceil(dive.lp_value - 1e-6))
        Pl = replace(P, gpu_lower_bound=lb)
        hint = None
        if dive.gpus is not None:
            dive_sol = [(t, list(items)) for t, _, items in dive.gpus]
            if best is None or solution_value(P, dive_sol) < solution_value(P, best[1]):
                best = ("lp-dive", dive_sol)
                info["start"] = "lp-dive"
        if lb > P.gpu_lower_bound:      # the LP raised the bound: search a packing into it
            t0 = time.perf_counter()
            best = _tabu_start(P, kind, lb, best, deadline, TABU_SHARE, info)
            if _meets(P, best, lb):
                return _packing_result(solver, kind, best[1], lb, t0, "the arc-flow LP",
                                       "tabu search")
        if best is not None:
            hint = arcflow.hint_flows(G, P, best[1])
        fn = arcflow.solve_arcflow_milp if solver == "milp" else arcflow.solve_arcflow_cpsat
        kw = {"seed": seed} if solver == "cpsat" else {}
        r = fn(Pl, G, max(0.1, deadline - time.perf_counter()), threads=threads, hint=hint, **kw)
        if r.bound is not None and P.objective == "gpus":
            r = replace(r, bound=max(r.bound, float(lb)))
        return r
    info["why_not_arcflow"] = reason
    pool_starts = [best] if best is not None else []
    if split_hint is not None:
        pool_starts.append(("split", [(t, items) for t, _, items in split_hint.gpus]))
    Pm = _pool_below(P, pool_starts)
    pairs = Pm.n * len(Pm.slots)
    left = deadline - time.perf_counter()
    info["pairs"] = pairs
    if pairs > BUILD_PAIRS_PER_S[solver] * 0.5 * left:
        # building the model alone would take most of what is left: keep the best start
        info["skipped"] = (f"assignment model of {pairs} (adapter, GPU) pairs cannot be built "
                           f"and searched in the {left:.1f} s left")
        return SolveResult(solver, "unknown", None, None, 0.0, (), False,
                           {"termination": "model too large for the time left"})
    fn = solve_milp if solver == "milp" else solve_cpsat
    r = fn(Pm, time_limit_s=max(0.1, deadline - time.perf_counter()), threads=threads,
           warm_start=best[1] if best and split_hint is None else None,
           split_hint=split_hint)
    if kind is not None and P.gpu_lower_bound and (r.bound is None
                                                   or r.bound < P.gpu_lower_bound):
        r = replace(r, bound=float(P.gpu_lower_bound))   # column generation's proven bound
    return r


@dataclass(frozen=True)
class BinKind:
    """Classical bin packing's only bin: GPU type and configuration (indices into
    ``PackingProblem.types``), capacity in units of ``divisor`` (``arcflow.common_divisor``)."""

    type_index: int
    config_index: int
    cap: int
    divisor: int

    def weights(self, P: PackingProblem) -> list[int]:
        """The adapters' loads in the kind's units."""
        return [w // self.divisor for w in P.loads]


def classical_kind(P: PackingProblem) -> BinKind | None:
    """The only bin kind when ``P`` is classical bin packing — gpus objective, GPUs limited by
    load alone (``arcflow.applicable``), one (type with GPUs, configuration) pair and it takes
    every adapter's rank — else None. Needs no arc-flow graph, so capacities too fine for one
    (Scholl's hard set: 100,000) still get column generation's bound and the searches."""
    from . import arcflow
    if P.objective != "gpus" or arcflow.applicable(P) is not None:
        return None
    pairs = [(ti, pi, c) for ti, t in enumerate(P.types) if t.count > 0
             for pi, c in enumerate(t.configs)]
    if len(pairs) != 1:
        return None
    ti, pi, cfg = pairs[0]
    if any(r > cfg.rank for r in P.ranks):
        return None
    d = arcflow.common_divisor(P)
    return BinKind(ti, pi, min(cfg.cap, P.total_load) // d, d)


def _classical_search(P: PackingProblem, kind: BinKind, best, deadline: float, solver: str,
                      info: dict[str, Any], retry: bool = False
                      ) -> tuple[PackingProblem, Any, SolveResult | None]:
    """Classical bin packing's searches before any model, each ending the solve when it packs
    into the proven bound: a tabu search into the bound (``TABU_FIRST_SHARE`` of the time
    left), column generation's exact bound at the root, a tabu search into it
    (``TABU_ROOT_SHARE``: where the LP bound is the optimum, as on Scholl's hard set and
    Schwerin's, it packs in a second or two), then branch-and-price (``COLGEN_SHARE``), which
    also proves a bound infeasible and raises it. When the root bound is the first search's
    target, the second search is skipped, or with ``retry`` (no arc-flow graph: capacities so
    fine that branch-and-price crawls, as on Scholl's hard set) run again from another seed.
    Returns (``P`` with the raised bound, the best start, the optimal result or None)."""
    t0 = time.perf_counter()
    best = _tabu_start(P, kind, P.gpu_lower_bound, best, deadline, TABU_FIRST_SHARE, info)
    if _meets(P, best, P.gpu_lower_bound):
        return P, best, _packing_result(solver, kind, best[1], P.gpu_lower_bound, t0, "bounds",
                                        "tabu search")
    t0 = time.perf_counter()
    packed: dict[str, Any] = {}                 # the root search's packing, when it finds one
    tried = P.gpu_lower_bound                   # the first search's target

    def at_root(target: int) -> list[list[int]] | None:
        if target <= tried and not retry:       # searched already
            return None
        got = _tabu_start(P, kind, target, best, deadline, TABU_ROOT_SHARE, info,
                          seed=int(target <= tried))
        if got is None or not _meets(P, got, target):
            return None
        packed["best"] = got
        return [list(items) for _, items in got[1]]

    P, best = _colgen_start(P, kind, best, deadline, COLGEN_SHARE, info, at_root=at_root)
    if "best" in packed:
        return P, packed["best"], _packing_result(solver, kind, packed["best"][1],
                                                  P.gpu_lower_bound, t0, "column generation",
                                                  "tabu search")
    if _meets(P, best, P.gpu_lower_bound):
        return P, best, _packing_result(solver, kind, best[1], P.gpu_lower_bound, t0,
                                        "column generation", "branch-and-price")
    return P, best, None


def _colgen_start(P: PackingProblem, kind: BinKind, best, deadline: float, share: float,
                  info: dict[str, Any], at_root=None) -> tuple[PackingProblem, Any]:
    """(``P`` with its bound raised, best) for classical bin packing (``kind``): column
    generation's exact Farley bound (``colgen``) and, while ``best`` is above it, ``at_root``
    (``colgen_dive``'s) then branch-and-price for a packing into it, within ``share`` of the
    time left (recorded in ``info``)."""
    from .colgen import colgen_dive
    t0 = time.perf_counter()
    incumbent = None if best is None else int(solution_value(P, best[1]))
    r = colgen_dive(kind.weights(P), kind.cap, t0 + share * max(0.0, deadline - t0),
                    known_bound=P.gpu_lower_bound, incumbent=incumbent, at_root=at_root)
    lb = r.lower_bound or 0
    if r.lp_value is not None:
        info.setdefault("lp_bound", r.lp_value)
    info.setdefault("colgen", []).append(
        {"bound": lb, "lp": None if r.lp_value is None else round(r.lp_value, 6),
         "found": r.bins is not None, "nodes": r.nodes, "columns": r.columns,
         "wall_s": round(r.wall_s, 3)})
    if lb > P.gpu_lower_bound:
        P = replace(P, gpu_lower_bound=lb)
    if r.bins is None:
        return P, best
    info["start"] = "colgen-dive"
    return P, ("colgen-dive", [(kind.type_index, sorted(b)) for b in r.bins if b])


def _tabu_start(P: PackingProblem, kind: BinKind | None, target: int, best, deadline: float,
                share: float, info: dict[str, Any], seed: int = 0):
    """``best`` or, for classical bin packing (``kind``) when ``best`` uses more than
    ``target`` GPUs, a packing into ``target`` bins found by ``bpp_search.pack_into`` within
    ``share`` of the time left (recorded in ``info``)."""
    from .bpp_search import pack_into
    if (kind is None or target < 1
            or (best is not None and solution_value(P, best[1]) <= target)):
        return best
    t0 = time.perf_counter()
    until = t0 + share * max(0.0, deadline - t0)
    bins = pack_into(kind.weights(P), kind.cap, target, until, seed=seed)
    info.setdefault("tabu", []).append({"target": target, "found": bins is not None,
                                        "wall_s": round(time.perf_counter() - t0, 3)})
    if bins is None:
        return best
    info["start"] = "tabu"
    return ("tabu", [(kind.type_index, sorted(b)) for b in bins if b])


def _meets(P: PackingProblem, best, bound: int) -> bool:
    """``best`` (a named solution or None) uses at most ``bound`` GPUs (gpus objective)."""
    return P.objective == "gpus" and best is not None and solution_value(P, best[1]) <= bound


def _packing_result(solver: str, kind: BinKind, sol, bound: int, t0: float, source: str,
                    found_by: str) -> SolveResult:
    """An optimal ``SolveResult`` for a one-kind packing ``sol`` that meets a proven bound
    (nothing is left for the model to find); ``source`` names the bound, ``found_by`` the
    search."""
    gpus = tuple((kind.type_index, kind.config_index, tuple(sorted(items)))
                 for _, items in sol if items)
    return SolveResult(solver, "optimal", float(len(gpus)), float(bound),
                       time.perf_counter() - t0, gpus, True,
                       {"termination": f"packing into the bound of {source} ({found_by})"})


def _pool_below(P: PackingProblem, starts) -> PackingProblem:
    """``P`` with each type's GPU slots cut to what a solution at least as good as the best
    start can use: the start's GPU count (gpus) or its cost over the type's price (cost)."""
    if not starts or P.objective not in ("gpus", "cost"):
        return P
    val = min(solution_value(P, sol) for _, sol in starts)
    return replace(P, max_slots={t: min(spec.count, int(val // max(P.slot_weight(t), 1e-9)))
                                 for t, spec in enumerate(P.types)})


def solve_exact(inst: Instance, objective=None, solver: str = "milp",
                time_limit_s: float | None = None, threads: int | None = None,
                warm_start: bool = True, verify: bool = True, duration_s: float | None = None,
                workers: int | None = None, max_iterations: int | None = None,
                cut_mode: str = "capacity", models: dict[str, Any] | None = None,
                problem: PackingProblem | None = None, bounds: bool = True,
                method_name: str | None = None, given: Placement | None = None) -> Placement:
    """Exact placement with the twin in the loop (module docstring). ``given``: a placement to
    start from instead of running the heuristic (used as warm start when the model admits it,
    and as the twin-accepted incumbent when it was verified and accepted).

    Ctrl-C or SIGTERM (``KeyboardInterrupt``) at any step raises
    ``twin.cli_support.Interrupted`` whose ``partial`` is the best placement known at that
    moment (see ``_interrupted_best``), or None when there is none yet."""
    state: dict[str, Any] = {"starts": []}
    try:
        with interruptible_c_solvers():
            return _solve_exact(inst, objective, solver, time_limit_s, threads, warm_start,
                                verify, duration_s, workers, max_iterations, cut_mode, models,
                                problem, bounds, method_name, given, state)
    except KeyboardInterrupt as e:
        best = _interrupted_best(inst, state, e)
        raise Interrupted(best, "exact search interrupted") from None


@contextmanager
def interruptible_c_solvers():
    """Within the block every CP-SAT ``CpSolver.solve`` and highspy ``Highs.run`` — also those
    of ``arcflow`` (model and LP dive) and ``templates``, which do not go through
    ``run_interruptible`` themselves — runs in a helper thread with CP-SAT's own SIGINT catcher
    off (it would end the search as at a time limit and swallow Ctrl-C), so that Ctrl-C and
    SIGTERM stop it at once (``Interrupted`` without a partial result: the loop falls back to
    the best placement it knows). Calls already in a helper thread (``solve_cpsat``,
    ``solve_milp``) run as they are."""
    import highspy
    from ortools.sat.python import cp_model

    cp_solve = cp_model.CpSolver.solve
    hs_run = highspy.Highs.run
    hs_own = "run" in highspy.Highs.__dict__      # else inherited from the C++ base

    def solve(self, model, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return cp_solve(self, model, *args, **kwargs)
        self.parameters.catch_sigint_signal = False
        r, interrupted = run_interruptible(lambda: cp_solve(self, model, *args, **kwargs),
                                           self.stop_search)
        if interrupted:
            raise Interrupted(None, "cp-sat search interrupted")
        return r

    def run(self):
        if threading.current_thread() is not threading.main_thread():
            return hs_run(self)
        self.HandleUserInterrupt = True          # highspy's interrupt callbacks read cancelSolve
        r, interrupted = run_interruptible(lambda: hs_run(self), self.cancelSolve)
        if interrupted:
            raise Interrupted(None, "HiGHS solve interrupted")
        return r

    cp_model.CpSolver.solve = solve
    highspy.Highs.run = run
    try:
        yield
    finally:
        cp_model.CpSolver.solve = cp_solve
        if hs_own:
            highspy.Highs.run = hs_run
        else:
            del highspy.Highs.run


def _interrupted_best(inst: Instance, state: dict[str, Any], e: KeyboardInterrupt
                      ) -> Placement | None:
    """The best placement known when the search was interrupted, marked interrupted
    (``params["interrupted"]``, a note): among the solver's best solution so far (the partial
    result of an interrupted CP-SAT/HiGHS search), the last model placement the twin did not
    reject, the twin-accepted incumbent and the best start the model admits, the one of least
    objective value (the incumbent on ties); None before any exists."""
    obj, method, P = state.get("obj"), state.get("method"), state.get("P")
    if obj is None or P is None:
        return None
    Pc = state.get("Pc") or P
    cands: list[tuple[Placement, str]] = []
    if state.get("incumbent") is not None:
        cands.append((state["incumbent"].with_(method=method), "the twin-accepted start"))
    partial = getattr(e, "partial", None)
    if isinstance(partial, SolveResult) and partial.gpus:
        cands.append((to_placement(inst, Pc, partial, method), "the solver's best solution so "
                      "far (not replayed in the twin)"))
    last = state.get("placement")
    if last is not None and last.gpus and last.verdict != "rejected":
        cands.append((last, "the last solved placement"))
    E = effective(P)
    for name, sol in state["starts"]:
        m = warm_start_solution(P, E, sol)
        if m is not None:
            r = SolveResult(state.get("solver", method), "feasible", solution_value(P, sol), None,
                            0.0, tuple((t, E.orig[t][p], items) for t, p, items in m), True,
                            {"termination": "interrupted"})
            cands.append((to_placement(inst, P, r, method), f"the {name} start"))
    if not cands:
        return None
    best, what = min(cands, key=lambda c: obj.value(c[0]))
    status = best.status if best.status in ("solved", "failed") else "solved"
    return best.with_(status=status, objective=obj.name, objective_value=obj.value(best),
                      params={**best.params, "interrupted": True, "interrupted_source": what},
                      notes=best.notes + (f"interrupted (Ctrl-C or SIGTERM): returning {what}",))


def _solve_exact(inst: Instance, objective, solver: str, time_limit_s: float | None,
                 threads: int | None, warm_start: bool, verify: bool, duration_s: float | None,
                 workers: int | None, max_iterations: int | None, cut_mode: str,
                 models: dict[str, Any] | None, problem: PackingProblem | None, bounds: bool,
                 method_name: str | None, given: Placement | None,
                 state: dict[str, Any]) -> Placement:
    """``solve_exact``'s work; records what an interrupt may return in ``state``."""
    from ..objectives import make_objective

    if solver not in ("milp", "cpsat"):
        raise ValueError(f"solver: must be 'milp' or 'cpsat', got {solver!r}")
    if cut_mode not in CUT_MODES:
        raise ValueError(f"cut_mode: must be one of {CUT_MODES}, got {cut_mode!r}")
    method = method_name or solver
    obj = objective if objective is not None and not isinstance(objective, str) \
        else make_objective(inst, objective)
    tl = float(time_limit_s or inst.solver.time_limit_s or DEFAULT_TIME_LIMIT_S)
    threads = threads if threads is not None else (inst.solver.threads or None)
    max_it = max_iterations if max_iterations is not None else (
        inst.solver.max_repair_iterations if inst.solver.max_repair_iterations is not None
        else DEFAULT_MAX_ITERATIONS)
    t_start = time.perf_counter()
    deadline = t_start + tl
    tables = None
    if problem is None and inst.slo is not None:    # greedy's SLO table: the same surrogate
        from ..slo_capacity import measure_slo_capacity
        tables = measure_slo_capacity(inst, float(duration_s or inst.duration_s), workers)
    P = problem or build_problem(inst, obj.name, getattr(obj, "gpu_budget", None), models=models,
                                 slo_tables=tables)
    state.update(obj=obj, method=method, solver=solver, P=P)
    sources = sorted({t.source for t in P.types})
    constant = all(t.source == "constant" for t in P.types)
    if P.splits and cut_mode != "capacity":
        raise ValueError(f"cut_mode: '{cut_mode}' cuts forbid adapter sets, which is not valid "
                         f"when adapters are split (max_homes {P.max_homes}); use 'capacity'")
    bad = infeasible_adapters(P)
    params: dict[str, Any] = {"solver": solver, "capacity_source": sources,
                              "time_limit_s": tl, "cut_mode": cut_mode,
                              "max_homes": P.max_homes}
    if bad:
        ids = [P.ids[i] for i in bad]
        why = ("fit no configuration of any GPU type (rank, load or memory): "
               if not P.splits else
               f"offer more load than max_homes={P.max_homes} GPUs can carry (the capacity "
               f"model's largest caps of the {P.max_homes} best homes for their rank): ")
        return Placement(inst.name, method, "infeasible", objective=obj.name, params=params,
                         notes=(f"{len(bad)} adapter(s) {why}{', '.join(ids[:5])}",))
    b = lower_bounds(P, lp=False)
    params["bounds"] = b.to_dict()
    if P.objective == "gpus":
        P = replace(P, gpu_lower_bound=int(b.best))
        state["P"] = P
    starts: list[tuple[str, list]] = state["starts"]   # solutions the model admits, as hints
    ff = best_start(P) if warm_start else None
    if ff is not None:
        starts.append(ff)
    incumbent: Placement | None = None          # best twin-accepted placement so far
    hname, hplace = None, None                  # the heuristic's name and placement
    if warm_start and not constant:
        if given is not None:       # a placement the caller already has (e.g. greedy's)
            hname, hsol, hplace = given.method, _as_solution(P, given), given
        else:
            t_h = time.perf_counter()
            hname, hsol, hplace = heuristic_solution(inst, obj, P, verify=verify,
                                                     duration_s=duration_s, workers=workers)
            params["heuristic_s"] = round(time.perf_counter() - t_h, 3)
            if time.perf_counter() > deadline:
                params["over_limit_in"] = (
                    f"the {hname} start ({params['heuristic_s']:.0f} s with its twin replays "
                    "and, on a new profile or window, the one-time twin lower-bound "
                    "measurement) used the whole time limit")
        params["warm_start_method"] = hname
        if hsol is not None and warm_start_solution(P, effective(P), hsol) is not None:
            starts.append((hname, hsol))
        elif hsol is not None:
            params["warm_start_rejected"] = f"{hname}'s placement does not satisfy the model"
        if verify and hplace is not None and hplace.verdict == "accepted" \
                and hplace.status in ("solved", "optimal"):
            incumbent = hplace
            state["incumbent"] = incumbent
    split_given: list[tuple[str, list]] = []       # a split heuristic placement, as a start
    if P.splits and hplace is not None and hplace.gpus:
        sg = _as_split(P, hplace)
        if sg is not None:
            split_given.append((hname, sg))
    params["starts"] = {name: solution_value(P, sol) for name, sol in starts}
    pool_cap = _pool_below(P, starts)
    if bounds and not constant and time.perf_counter() < deadline - 1.0 \
            and P.n * len(pool_cap.slots) <= LP_BOUND_MAX_PAIRS:
        lp_s = min(10.0, 0.15 * (deadline - time.perf_counter()))
        b = lower_bounds(pool_cap, lp=True, time_limit_s=lp_s, threads=threads)
        params["bounds"] = b.to_dict()
    replay_s = _incumbent_replay_s(incumbent, workers)   # wall s of one GPU-replay batch
    iterations = []
    cuts: list[Cut] = []
    cap_cuts: list[CapacityCut] = []
    tix = {t.name: k for k, t in enumerate(P.types)}
    idx = {a: i for i, a in enumerate(P.ids)}
    placement = None
    r = None
    for it in range(max_it + 1):
        left = deadline - time.perf_counter()
        if left <= 0.5 and r is not None:
            break
        Pc = P.with_cuts(cuts).with_capacity_cuts(cap_cuts)
        it_starts = list(starts)
        if it and warm_start:               # first fit again, with the tightened capacities
            ffc = best_start(Pc)
            if ffc is not None:
                it_starts.append(ffc)
        state["Pc"] = Pc
        r, how = _model_solve(Pc, solver, deadline, threads, it_starts, inst.seed,
                              split_given if warm_start else ())
        if Pc.splits and r.gpus:            # same homes, most balanced routing weights
            r = balance_shares(Pc, r)
        rec = {"iteration": it, "status": r.status, "objective": r.objective, "bound": r.bound,
               "gap": r.gap, "solve_time_s": round(r.solve_time_s, 3),
               "warm_start_used": r.warm_start_used, "cuts": len(cuts) + len(cap_cuts),
               "termination": r.details.get("termination"), **how}
        if r.status in ("infeasible", "unknown"):
            iterations.append(rec)
            placement = to_placement(inst, Pc, r, method)
            break
        placement = to_placement(inst, Pc, r, method)
        state["placement"] = placement
        if not verify:
            iterations.append(rec)
            break
        if incumbent is not None and P.objective == "gpus" and r.objective is not None \
                and r.objective >= incumbent.n_gpus:
            rec["verdict"] = "not replayed: no fewer GPUs than the twin-accepted incumbent"
            iterations.append(rec)
            break
        est = _replay_estimate(placement.n_gpus, replay_s, workers)
        if est is not None and time.perf_counter() + est > deadline:
            rec["verdict"] = f"not replayed: ~{est:.0f} s of replay would pass the time limit"
            iterations.append(rec)
            placement = placement.with_(notes=placement.notes + (
                "the model's placement was not replayed in the twin (time limit)",))
            break
        t_rep = time.perf_counter()
        placement = twin_verify(placement, inst, duration_s=duration_s, workers=workers)
        state["placement"] = placement
        replay_s = (time.perf_counter() - t_rep) / max(1, math.ceil(
            placement.n_gpus / max(1, workers or _threads())))
        rec["verdict"] = placement.verdict
        bad_gpus = [g for g in placement.gpus if g.verified is not None and not g.verified.ok]
        rec["rejected_gpus"] = len(bad_gpus)
        if bad_gpus and not P.splits:
            placement, n_int = integer_amax_rescue(inst, placement, duration_s, workers,
                                                   deadline, replay_s)
            state["placement"] = placement
            rec["integer_amax_accepted"] = n_int
            rec["verdict"] = placement.verdict
            bad_gpus = [g for g in placement.gpus
                        if g.verified is not None and not g.verified.ok]
        iterations.append(rec)
        if placement.verdict == "accepted":
            break
        if cut_mode == "capacity":
            new = capacity_cuts(inst, Pc, [(tix[g.gpu_type], g.max_lora_rank, g.max_loras,
                                            [idx[a.id] for a, _ in g.adapters] if not P.splits
                                            else [(idx[a.id], s) for a, s in g.adapters],
                                            0.0 if g.verified.memory_error
                                            else g.verified.throughput_tps)
                                           for g in bad_gpus], duration_s, workers,
                                 deadline=deadline, replay_s=replay_s)
            cap_cuts += new
            rec["new_cuts"] = len(new)
        else:
            for g in bad_gpus:
                cuts.append(Cut(tix[g.gpu_type], g.max_lora_rank, g.max_loras,
                                frozenset(idx[a.id] for a, _ in g.adapters),
                                superset=cut_mode == "superset"))
        # the previous solution violates the new cuts; the starts are re-checked per solve
    assert r is not None and placement is not None
    best_bound = _best_bound(P, r, b)
    params.update({"status": r.status, "objective": r.objective, "model_bound": r.bound,
                   "best_bound": best_bound,
                   "gap": _gap(r.objective, best_bound),
                   "solve_time_s": sum(x["solve_time_s"] for x in iterations),
                   "iterations": iterations, "n_iterations": len(iterations),
                   "n_cuts": len(cuts) + len(cap_cuts), "threads": threads,
                   "warm_start_used": any(x["warm_start_used"] for x in iterations),
                   "capacity_cuts": [{"type": P.types[c.type_index].name, "rank": c.rank,
                                      "amax": c.amax, "x": c.x, "load_tps": c.load / LOAD_SCALE}
                                     for c in cap_cuts]})
    notes = list(placement.notes)
    if r.status == "infeasible":
        notes.append("the exact model proved that no placement satisfies the capacity model"
                     + (f" and the {len(cuts) + len(cap_cuts)} twin cut(s)"
                        if cuts or cap_cuts else ""))
    if r.status == "unknown":
        notes.append(f"no placement found within {tl:g} s (best bound {best_bound:g})")
    model_optimal = r.status == "optimal"
    if verify and incumbent is not None and (
            placement.verdict != "accepted"
            or (P.objective == "gpus" and incumbent.n_gpus <= placement.n_gpus)
            or (P.objective == "cost" and obj.value(incumbent) <= obj.value(placement) + 1e-9)):
        # the twin-accepted incumbent is at least as good as anything the model gave
        inc_value = incumbent.n_gpus if P.objective == "gpus" else obj.value(incumbent)
        if placement.verdict == "rejected":
            why = "the twin rejects the model's placement"
        elif placement.verdict == "accepted" or r.objective is None:
            why = f"the model's placement has objective {obj.value(placement):g}"
        else:
            why = (f"the model's best placement (objective {r.objective:g}) does not beat it"
                   if r.objective >= inc_value - 1e-9
                   else "the model's placement could not be replayed within the time limit")
        notes.append(f"returning the twin-accepted {incumbent.method} placement (objective "
                     f"{inc_value:g}) the search started from: {why}")
        if model_optimal and r.objective is not None and r.objective > inc_value + 1e-9:
            notes.append(f"the capacity model's proven optimum ({r.objective:g}) is above a "
                         "twin-accepted placement: the model is conservative here")
        # the model's optimum is a claim about the incumbent only when their values agree
        model_optimal = model_optimal and r.objective is not None \
            and abs(r.objective - inc_value) <= 1e-9
        placement = incumbent.with_(method=method, best_bound=best_bound,
                                    status="optimal" if model_optimal else "solved",
                                    params={**incumbent.params})
        params["objective"] = inc_value
        params["gap"] = _gap(inc_value, best_bound)
    elif verify and placement.verdict == "rejected":
        notes.append(f"twin still rejects after {len(iterations)} iteration(s) "
                     "(iteration or time limit); no twin-accepted placement is known")
    elif verify and placement.verdict is None and placement.gpus:
        model_optimal = False
    claim = None
    if model_optimal:
        claim = ("optimal for the constant capacities" if constant
                 else "optimal for the surrogate (as corrected by the twin's cuts)")
        if P.splits:      # the split problem is a relaxation: say which problem was proven
            claim += (f", adapters split over up to {P.max_homes} GPUs with routing weights "
                      "(each home charged its adapter's full feature value)")
    if P.splits:
        notes.append(f"max_homes {P.max_homes}: the model may split an adapter's traffic over "
                     f"up to {P.max_homes} GPUs; its optimum and bounds are those of this split "
                     "problem (a relaxation of one home per adapter: L2 and arc-flow not used)")
    if verify and not constant and P.objective == "gpus" and placement.verdict == "accepted":
        from ..feasibility import TWIN_OPTIMAL, twin_certificate
        certified, lb = twin_certificate(inst, placement, duration_s)
        params["lower_bound"] = lb          # twin-sound (printed as twin_lower_bound)
        if certified:
            claim = TWIN_OPTIMAL
        # the surrogate's bound says nothing about twin-accepted placements (the surrogate can be
        # conservative); the bound and gap of a verified answer are the twin-sound ones
        params["surrogate_best_bound"] = best_bound
        best_bound = float(lb)
        params["best_bound"] = best_bound
        params["gap"] = _gap(float(placement.n_gpus), best_bound)
    if any(s.startswith("provisional") for s in sources):
        notes.append("capacity model: provisional twin-measured table (no trained "
                     "surrogates/trained/<profile>/capacity.json yet)")
    params["claim"] = claim
    params["wall_s"] = time.perf_counter() - t_start
    if "over_limit_in" in params:
        notes.append(params["over_limit_in"])
    status = placement.status
    if status == "optimal" and claim is None:
        status = "solved"
    if claim is not None and placement.gpus and status == "solved":
        status = "optimal"
    return placement.with_(params={**placement.params, **params}, notes=tuple(notes),
                           objective=obj.name, status=status, best_bound=best_bound)


RESCUE_REPLAYS = 20      # replays one GPU's integer Amax search is budgeted at (probes, refinement)


def integer_amax_rescue(inst: Instance, placement: Placement, duration_s: float | None,
                        workers: int | None, deadline: float,
                        replay_s: float | None = None) -> tuple[Placement, int]:
    """``placement`` with each GPU the twin rejects at its configuration's Amax (a grid value:
    the capacity model knows no other) moved to the best integer Amax the twin accepts it at
    (``amax_search.twin_best_amax``, with the draw that GPU has in verification: seed + index),
    and the number of GPUs so accepted. The placement is verified again when every rejected
    GPU was accepted so; GPUs no integer Amax serves are left for the cuts. A search is not
    started within a second of ``deadline``, nor when ``RESCUE_REPLAYS`` replays of
    ``replay_s`` wall seconds each (the loop's measured replay time) would pass it."""
    from ..amax_search import twin_best_amax
    dur = float(duration_s if duration_s is not None else inst.duration_s)
    gpus = list(placement.gpus)
    bad = [j for j, g in enumerate(gpus) if g.verified is not None and not g.verified.ok]
    amaxes: list[int] = []                    # the integer Amax of each GPU so accepted
    for j in bad:
        if time.perf_counter() + RESCUE_REPLAYS * (replay_s or 0.0) >= deadline - 1.0:
            break
        best, _ = twin_best_amax(inst, gpus[j], inst.seed + j, dur, workers)
        if best is not None:
            gpus[j] = best
            amaxes.append(best.max_loras)
    if not amaxes:
        return placement, 0
    out = placement.with_(gpus=tuple(gpus), notes=placement.notes + (
        f"{len(amaxes)} GPU(s) the twin rejected at the capacity model's Amax accepted at "
        f"another integer Amax ({', '.join(map(str, amaxes))})",))
    if len(amaxes) == len(bad):
        out = twin_verify(out, inst, duration_s=duration_s, workers=workers)
    return out, len(amaxes)


def _threads() -> int:
    from .common import default_threads
    return default_threads()


def _incumbent_replay_s(p: Placement | None, workers: int | None) -> float | None:
    """Wall seconds per batch of parallel GPU replays, from a verified placement's timing."""
    if p is None or not p.verify_wall_s or not p.gpus:
        return None
    return p.verify_wall_s / max(1, math.ceil(p.n_gpus / max(1, workers or _threads())))


def _replay_estimate(n_gpus: int, replay_s: float | None, workers: int | None) -> float | None:
    """Expected wall seconds to replay ``n_gpus`` GPUs, ``None`` before any replay was timed."""
    if replay_s is None:
        return None
    return replay_s * math.ceil(n_gpus / max(1, workers or _threads()))


def _best_bound(P: PackingProblem, r: SolveResult, b) -> float:
    """The best lower bound from any source: the solver's, L1/L2/count and the LP value."""
    vals = [v for v in (r.bound, b.best) if v is not None]
    best = max(vals) if vals else 0.0
    if r.status == "optimal" and r.objective is not None:
        best = max(best, r.objective)
    return float(best)


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None:
        return None
    if objective == 0:
        return 0.0
    return max(0.0, (objective - bound) / abs(objective))
