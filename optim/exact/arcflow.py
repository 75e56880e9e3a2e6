"""Arc-flow model (Valério de Carvalho 1999) for the modes where a GPU is limited by load alone.

When no configuration limits the adapter count (the constant-capacity mode, and any problem
whose feature intervals cannot bind), the placement problem is variable-sized bin packing: a
*bin kind* ``k`` is one configuration ``p`` of one GPU type ``t`` (capacity ``C_k = cap_p``,
accepting adapters of rank ``<= r_p``), and kinds of one type share its GPU count. Its LP
relaxation equals the Gilmore–Gomory bound, which is the optimum (rounded up) on almost every
instance in the literature, so HiGHS and CP-SAT close the gap quickly.

Graph of kind ``k`` (integer loads divided by their common divisor ``d``): nodes are the loads
``0..C_k`` reachable by adding adapters class by class in non-increasing load order (a class is
one (load, rank) value; at most as many copies as the class has adapters). Arcs:

* item arcs ``(u, u + w_c, c)`` for class ``c`` allowed on ``k``;
* loss arcs ``(u, C_k)`` for every node ``u < C_k`` (unused capacity).

Every path ``0 -> C_k`` is a feasible GPU of kind ``k``; every feasible GPU is a path (its
adapters in class order). Variables: integer flow ``f_a`` on every arc, ``n_k`` GPUs of kind
``k`` (flow out of node 0). Constraint families (one function each in the two model builders):

* flow conservation:  ``sum_in f - sum_out f = -n_k`` at 0, ``+n_k`` at ``C_k``, 0 elsewhere;
* demand:             ``sum_k sum_{a in A_k(c)} f_a >= m_c`` for every class ``c``;
* pool:               ``sum_{k of type t} n_k <= count_t``;
* lower bound:        ``sum_k n_k >= LB`` (any valid GPU bound; redundant, helps the search);
* objective:          ``min sum_k weight_t(k) n_k`` (1 for gpus, the price for cost).

A solution is decomposed into paths (one per GPU); surplus copies a path carries beyond a
class's adapters are dropped (removing an adapter never breaks a load-only GPU).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import reduce
from typing import Sequence

from .common import SolveResult, default_threads, highs_threads
from .problem import PackingProblem

MAX_NODES = 20_000          # per kind, after dividing by the common divisor
MAX_ARCS = 400_000          # over all kinds
MAX_CAP_RAISES = 3          # LP dive: GPU-total raises before the cap is dropped
DIVE_NOISE = 0.3            # LP dive restarts: noise added to positive flows on the path choice


@dataclass(frozen=True)
class Kind:
    """One bin kind: GPU type, configuration index (in ``problem.types[t].configs``), reduced
    capacity, arcs ``(u, v, class or -1 for loss)``."""

    type_index: int
    config_index: int
    cap: int
    arcs: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class ArcFlowGraph:
    classes: tuple[tuple[int, int], ...]          # (reduced load, rank)
    members: tuple[tuple[int, ...], ...]           # adapters of each class
    kinds: tuple[Kind, ...]
    divisor: int

    @property
    def n_arcs(self) -> int:
        return sum(len(k.arcs) for k in self.kinds)

    def uncovered(self) -> list[int]:
        """Classes no kind has an arc for (their adapters fit no GPU: the problem is
        infeasible)."""
        have = {c for kind in self.kinds for _, _, c in kind.arcs if c >= 0}
        return [c for c in range(len(self.classes)) if c not in have]


def applicable(P: PackingProblem) -> str | None:
    """``None`` when the arc-flow model is exact for ``P``, else the reason it is not."""
    if P.objective not in ("gpus", "cost"):
        return f"objective '{P.objective}'"
    if P.splits:
        return f"adapters may be split over up to {P.max_homes} GPUs (max_homes)"
    if P.cuts:
        return "adapter-set cuts"
    total_x = sum(P.xs)
    min_x = min(P.xs)
    for t in P.types:
        for c in t.configs:
            if c.load_lo > 0:
                return "load intervals with a lower end"
            if c.x_lo > min_x or c.x_hi < total_x:
                return f"type {t.name}: configuration {c.label or c.amax} limits the adapter count"
    return None


def common_divisor(P: PackingProblem) -> int:
    """The greatest common divisor of every positive load and capacity of ``P`` (1 when none):
    the unit the graph's loads and capacities are counted in."""
    caps = [c.cap for t in P.types for c in t.configs]
    return reduce(math.gcd, [w for w in P.loads if w > 0] + [c for c in caps if c > 0], 0) or 1


def build_graph(P: PackingProblem, max_nodes: int = MAX_NODES,
                max_arcs: int = MAX_ARCS) -> ArcFlowGraph | None:
    """The arc-flow graph of ``P`` (``None`` when it exceeds the size limits)."""
    d = common_divisor(P)
    by_class: dict[tuple[int, int], list[int]] = {}
    for i in range(P.n):
        by_class.setdefault((P.loads[i] // d, P.ranks[i]), []).append(i)
    classes = sorted(by_class, key=lambda c: (-c[0], -c[1]))
    members = tuple(tuple(by_class[c]) for c in classes)
    kinds: list[Kind] = []
    n_arcs = 0
    for ti, t in enumerate(P.types):
        if t.count <= 0:
            continue
        for pi, c in enumerate(t.configs):
            C = min(c.cap, P.total_load) // d
            if C + 1 > max_nodes:
                return None
            reach = {0}
            arcs: set[tuple[int, int, int]] = set()
            for ci, (w, r) in enumerate(classes):
                if r > c.rank or w > C:
                    continue
                m = len(members[ci])
                for u in sorted(reach):
                    v = u
                    for _ in range(m):
                        if v + w > C:
                            break
                        arcs.add((v, v + w, ci))
                        v += w
                        reach.add(v)
                if n_arcs + len(arcs) > max_arcs:
                    return None
            arcs |= {(u, C, -1) for u in reach if u < C}
            n_arcs += len(arcs)
            if n_arcs > max_arcs:
                return None
            kinds.append(Kind(ti, pi, C, tuple(sorted(arcs))))
    return ArcFlowGraph(tuple(classes), members, tuple(kinds), d)


def hint_flows(G: ArcFlowGraph, P: PackingProblem,
               sol: Sequence[tuple[int, Sequence[int]]]) -> dict[tuple[int, int], int] | None:
    """Arc flows (kind index, arc index) -> value of a (type, adapters) solution; ``None`` when
    a GPU is not a path of any kind of its type."""
    cls_of = {i: ci for ci, mem in enumerate(G.members) for i in mem}
    index = [{a: k for k, a in enumerate(kind.arcs)} for kind in G.kinds]
    flows: dict[tuple[int, int], int] = {}
    for t, items in sol:
        load = sum(P.loads[i] for i in items) // G.divisor
        mr = max(P.ranks[i] for i in items)
        seq = sorted((cls_of[i] for i in items))
        placed = False
        for ki, kind in enumerate(G.kinds):
            cfg = P.types[kind.type_index].configs[kind.config_index]
            if kind.type_index != t or cfg.rank < mr or load > kind.cap:
                continue
            path, u = [], 0
            for ci in seq:
                w = G.classes[ci][0]
                a = (u, u + w, ci)
                if a not in index[ki]:
                    break
                path.append(index[ki][a])
                u += w
            else:
                if u < kind.cap:
                    path.append(index[ki][(u, kind.cap, -1)])
                for a in path:
                    flows[ki, a] = flows.get((ki, a), 0) + 1
                placed = True
                break
        if not placed:
            return None
    return flows


def decompose(G: ArcFlowGraph, flows: dict[tuple[int, int], int]
              ) -> list[tuple[int, int, tuple[int, ...]]]:
    """Paths of a flow as GPUs ``(type, config, adapters)``; surplus class copies dropped."""
    left = {ci: list(mem) for ci, mem in enumerate(G.members)}
    gpus = []
    for ki, kind in enumerate(G.kinds):
        out: dict[int, list[int]] = {}
        f = {a: v for (k, a), v in flows.items() if k == ki and v > 0}
        for a in f:
            out.setdefault(kind.arcs[a][0], []).append(a)
        while True:
            u, classes = 0, []
            start = [a for a in out.get(0, []) if f[a] > 0]
            if not start:
                break
            while u != kind.cap:
                a = next((a for a in out.get(u, []) if f[a] > 0), None)
                if a is None:       # cannot happen for a conserving flow
                    raise RuntimeError("arc-flow solution does not conserve flow")
                f[a] -= 1
                if kind.arcs[a][2] >= 0:
                    classes.append(kind.arcs[a][2])
                u = kind.arcs[a][1]
            items = []
            for ci in classes:
                if left[ci]:
                    items.append(left[ci].pop())
            if items:
                gpus.append((kind.type_index, kind.config_index, tuple(sorted(items))))
    if any(left.values()):
        raise RuntimeError("arc-flow solution does not cover every adapter")
    return gpus


@dataclass(frozen=True)
class LpDive:
    """Outcome of ``lp_dive``: the LP relaxation value (``None`` when not solved), a solution
    found by diving as ``(type, config, adapters)`` per GPU (``None`` when the dive failed),
    LP solves, wall time."""

    lp_value: float | None
    gpus: tuple[tuple[int, int, tuple[int, ...]], ...] | None
    solves: int
    wall_s: float


class _ArcFlowLp:
    """The arc-flow LP relaxation as a HiGHS model, with handles on the rows a dive changes:
    one demand row per class, one pool row per GPU type, and the GPU-total row."""

    def __init__(self, P: PackingProblem, G: ArcFlowGraph, threads: int | None) -> None:
        import highspy
        import numpy as np
        import scipy.sparse as sp

        self.G = G
        self.cols = [(k, a) for k, kind in enumerate(G.kinds) for a in range(len(kind.arcs))]
        self.first = []                       # first column of each kind
        nf, nk = len(self.cols), len(G.kinds)
        self.nf = nf
        ri, cj, val, lo, hi = [], [], [], [], []
        r = j = 0
        inf = highspy.kHighsInf
        for k, kind in enumerate(G.kinds):   # flow conservation
            self.first.append(j)
            for node, (ins, outs) in _incidence(kind).items():
                for a, sgn in [(a, 1) for a in ins] + [(a, -1) for a in outs]:
                    ri.append(r), cj.append(j + a), val.append(sgn)
                if node in (0, kind.cap):
                    ri.append(r), cj.append(nf + k), val.append(1 if node == 0 else -1)
                lo.append(0.0), hi.append(0.0)
                r += 1
            j += len(kind.arcs)
        self.demand_row = r                   # demand, one row per class
        for k, kind in enumerate(G.kinds):
            for a, (_, _, c) in enumerate(kind.arcs):
                if c >= 0:
                    ri.append(r + c), cj.append(self.first[k] + a), val.append(1)
        for mem in G.members:
            lo.append(float(len(mem))), hi.append(inf)
        r += len(G.members)
        self.pool_row = {}
        for t, spec in enumerate(P.types):   # pool
            ks = [k for k, kind in enumerate(G.kinds) if kind.type_index == t]
            if not ks:
                continue
            for k in ks:
                ri.append(r), cj.append(nf + k), val.append(1)
            self.pool_row[t] = r
            lo.append(0.0), hi.append(float(spec.count))
            r += 1
        self.total_row = r                    # GPU total
        for k in range(nk):
            ri.append(r), cj.append(nf + k), val.append(1)
        lo.append(0.0), hi.append(inf)
        r += 1
        A = sp.csc_matrix((val, (ri, cj)), shape=(r, nf + nk))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = nf + nk, r
        lp.col_cost_ = np.r_[np.zeros(nf), np.array(_weights(P, G), dtype=float)]
        lp.col_lower_ = np.zeros(nf + nk)
        lp.col_upper_ = np.full(nf + nk, inf)
        lp.row_lower_, lp.row_upper_ = np.array(lo), np.array(hi)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_ = A.indptr, A.indices
        lp.a_matrix_.value_ = A.data
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", highs_threads(threads))
        self.h.setOptionValue("random_seed", 0)
        self.h.passModel(lp)
        self.solves = 0

    def solve(self, deadline: float):
        """The LP solution's column values, or ``None`` (infeasible or out of time)."""
        import highspy
        import numpy as np
        if time.perf_counter() >= deadline:
            return None
        self.h.setOptionValue("time_limit", max(0.01, deadline - time.perf_counter()))
        self.h.run()
        self.solves += 1
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            self.h.clearSolver()      # a warm start from an infeasible basis is slow
            return None
        return np.array(self.h.getSolution().col_value)

    def heaviest_path(self, x, noise=None) -> tuple[int, list[int], float]:
        """(kind, classes, bottleneck flow) of the path that follows the largest flow out of
        every node (plus ``noise`` per column, to vary restarts), in the kind with the most
        GPUs."""
        G = self.G
        score = x if noise is None else x + noise * (x > 1e-9)
        k = max(range(len(G.kinds)), key=lambda q: (x[self.nf + q], -q))
        kind, base = G.kinds[k], self.first[k]
        out: dict[int, list[int]] = {}
        for a, (u, _, _) in enumerate(kind.arcs):
            out.setdefault(u, []).append(a)
        u, classes, flow = 0, [], float("inf")
        while u != kind.cap:
            a = max(out[u], key=lambda q: (score[base + q], kind.arcs[q][2] >= 0, -q))
            flow = min(flow, float(x[base + a]))
            if kind.arcs[a][2] >= 0:
                classes.append(kind.arcs[a][2])
            u = kind.arcs[a][1]
        return k, classes, flow


def lp_dive(P: PackingProblem, G: ArcFlowGraph, deadline: float,
            threads: int | None = None, seed: int = 0) -> LpDive:
    """Arc-flow LP relaxation (HiGHS) and pattern dives for an integer solution.

    The LP value is the Gilmore–Gomory bound (a valid lower bound). A dive (sequential
    rounding, as for cutting stock) commits GPUs path by path: the path that follows the largest
    LP flow out of each node, as many copies as its bottleneck flow rounded down (at least one),
    their adapters taken off the demand rows (copies beyond what is left are dropped), as many
    GPUs off the pool and the GPU-total rows, and the LP re-solved. The GPU total is capped at
    the LP value rounded up (gpus objective), so a dive that covers every adapter meets the
    bound; when the capped LP turns infeasible the cap grows (at most ``MAX_CAP_RAISES`` times,
    then it is dropped). A dive that ends above the bound is restarted from the root with seeded
    noise on the path choice, keeping the best, until the bound is met or ``deadline``
    (``time.perf_counter()``)."""
    import numpy as np
    t0 = time.perf_counter()
    lp = _ArcFlowLp(P, G, threads)
    x0 = lp.solve(deadline)
    if x0 is None:
        return LpDive(None, None, lp.solves, time.perf_counter() - t0)
    lp_value = float(lp.h.getInfo().objective_function_value)
    target = math.ceil(lp_value - 1e-6) if P.objective == "gpus" else None
    rng = np.random.default_rng(seed)
    best: list[tuple[int, list[int]]] | None = None
    attempt = 0
    while time.perf_counter() < deadline:
        noise = None if attempt == 0 else rng.random(len(x0)) * DIVE_NOISE
        used = _dive(lp, P, G, deadline, target, noise, restart=attempt > 0)
        attempt += 1
        if used is not None and (best is None or len(used) < len(best)):
            best = used
        if best is not None and (target is None or len(best) <= target):
            break
    if best is None:
        return LpDive(lp_value, None, lp.solves, time.perf_counter() - t0)
    left = {c: list(m) for c, m in enumerate(G.members)}
    gpus = []
    for k, take in best:
        kind = G.kinds[k]
        gpus.append((kind.type_index, kind.config_index,
                     tuple(sorted(left[c].pop() for c in take))))
    return LpDive(lp_value, tuple(gpus), lp.solves, time.perf_counter() - t0)


def _dive(lp: _ArcFlowLp, P: PackingProblem, G: ArcFlowGraph, deadline: float,
          target: int | None, noise, restart: bool) -> list[tuple[int, list[int]]] | None:
    """One dive from the root LP (rows reset first on a restart): the GPUs committed as
    (kind, classes), or ``None`` when it did not cover every adapter in time."""
    demand = [len(m) for m in G.members]
    pool = {t: float(P.types[t].count) for t in lp.pool_row}
    if restart:
        for c, m in enumerate(demand):
            lp.h.changeRowBounds(lp.demand_row + c, float(m), float("inf"))
        for t, r in lp.pool_row.items():
            lp.h.changeRowBounds(r, 0.0, pool[t])
    cap = target
    lp.h.changeRowBounds(lp.total_row, 0.0, float(cap) if cap is not None else float("inf"))
    x = lp.solve(deadline)
    used: list[tuple[int, list[int]]] = []
    while x is not None and any(demand):
        k, classes, flow = lp.heaviest_path(x, noise)
        copies = max(1, int(math.floor(flow + 1e-6)))     # the LP uses the path that often
        added = 0
        for _ in range(copies):
            take = []
            for c in classes:
                if demand[c] > 0:
                    demand[c] -= 1
                    take.append(c)
            if not take:
                break
            used.append((k, take))
            pool[G.kinds[k].type_index] -= 1
            added += 1
        if not added:
            break
        for c in set(classes):
            lp.h.changeRowBounds(lp.demand_row + c, float(demand[c]), float("inf"))
        t = G.kinds[k].type_index
        lp.h.changeRowBounds(lp.pool_row[t], 0.0, pool[t])
        if cap is not None:
            lp.h.changeRowBounds(lp.total_row, 0.0, float(cap - len(used)))
        if not any(demand):
            break
        x = lp.solve(deadline)
        raised = 0
        while x is None and cap is not None and raised < MAX_CAP_RAISES:
            cap += 1                          # the capped LP is infeasible: allow one more
            raised += 1
            lp.h.changeRowBounds(lp.total_row, 0.0, float(cap - len(used)))
            x = lp.solve(deadline)
        if x is None and cap is not None:     # give the cap up (the dive still ends integral)
            cap = None
            lp.h.changeRowBounds(lp.total_row, 0.0, float("inf"))
            x = lp.solve(deadline)
    return None if any(demand) else used


def _weights(P: PackingProblem, G: ArcFlowGraph) -> list[float]:
    return [P.slot_weight(k.type_index) for k in G.kinds]


def solve_arcflow_milp(P: PackingProblem, G: ArcFlowGraph, time_limit_s: float,
                       threads: int | None = None, lower_bound: int = 0,
                       hint: dict[tuple[int, int], int] | None = None) -> SolveResult:
    """The arc-flow model in Pyomo, solved by HiGHS."""
    import pyomo.environ as pyo
    from pyomo.contrib.appsi.base import TerminationCondition as TC
    from pyomo.contrib.appsi.solvers import Highs

    t0 = time.perf_counter()
    if G.uncovered():
        return SolveResult("milp", "infeasible", None, None, 0.0, (), False,
                           {"termination": "an adapter fits no GPU kind", "model": "arcflow"})
    m = pyo.ConcreteModel()
    A = [(k, a) for k, kind in enumerate(G.kinds) for a in range(len(kind.arcs))]
    m.f = pyo.Var(A, domain=pyo.NonNegativeIntegers)
    m.n = pyo.Var(range(len(G.kinds)), domain=pyo.NonNegativeIntegers)
    _add_flow_conservation(m, G, lambda e: e)
    _add_demand(m, G, lambda e: e)
    _add_pool(m, P, G, lambda e: e)
    lower_bound = max(lower_bound, P.gpu_lower_bound)
    if lower_bound > 0 and P.objective == "gpus":
        m.lb = pyo.Constraint(expr=sum(m.n[k] for k in range(len(G.kinds))) >= lower_bound)
    w = _weights(P, G)
    m.obj = pyo.Objective(expr=sum(w[k] * m.n[k] for k in range(len(G.kinds))))
    if hint:
        for k, a in A:
            m.f[k, a].set_value(hint.get((k, a), 0))
        for k, kind in enumerate(G.kinds):
            m.n[k].set_value(_gpus_of_kind(G, hint, k))
    s = Highs()
    s.config.time_limit = max(0.1, time_limit_s - (time.perf_counter() - t0))
    s.config.load_solution = False
    s.config.warmstart = bool(hint)
    s.highs_options = {"threads": highs_threads(threads), "random_seed": 0,
                       "mip_rel_gap": 0.0,
                       "mip_abs_gap": 0.99 if P.objective == "gpus" else 1e-6}
    build_s = time.perf_counter() - t0
    res = s.solve(m)
    wall = time.perf_counter() - t0
    details = {"termination": str(res.termination_condition), "build_s": build_s,
               "model": "arcflow", "n_arcs": G.n_arcs}
    if res.termination_condition == TC.infeasible:
        return SolveResult("milp", "infeasible", None, None, wall, (), bool(hint), details)
    obj, bound = res.best_feasible_objective, res.best_objective_bound
    if bound is not None and not math.isfinite(bound):
        bound = None
    if obj is None or not math.isfinite(obj):
        return SolveResult("milp", "unknown", None, bound, wall, (), bool(hint), details)
    res.solution_loader.load_vars()
    flows = {(k, a): int(round(pyo.value(m.f[k, a]))) for k, a in A
             if pyo.value(m.f[k, a]) > 0.5}
    return _result("milp", P, G, flows, bound, res.termination_condition == TC.optimal, wall,
                   bool(hint), details)


def solve_arcflow_cpsat(P: PackingProblem, G: ArcFlowGraph, time_limit_s: float,
                        threads: int | None = None, lower_bound: int = 0,
                        hint: dict[tuple[int, int], int] | None = None,
                        seed: int = 0) -> SolveResult:
    """The arc-flow model in CP-SAT (integer flows)."""
    from ortools.sat.python import cp_model
    t0 = time.perf_counter()
    if G.uncovered():
        return SolveResult("cpsat", "infeasible", None, None, 0.0, (), False,
                           {"termination": "an adapter fits no GPU kind", "model": "arcflow"})
    m = cp_model.CpModel()
    ub = P.n
    f = {(k, a): m.NewIntVar(0, ub, f"f{k}_{a}") for k, kind in enumerate(G.kinds)
         for a in range(len(kind.arcs))}
    n = {k: m.NewIntVar(0, P.types[kind.type_index].count, f"n{k}")
         for k, kind in enumerate(G.kinds)}

    class _M:                      # the two builders share the family functions
        pass
    mm = _M()
    mm.f, mm.n = f, n
    _add_flow_conservation(mm, G, m.Add)
    _add_demand(mm, G, m.Add)
    _add_pool(mm, P, G, m.Add)
    lower_bound = max(lower_bound, P.gpu_lower_bound)
    if lower_bound > 0 and P.objective == "gpus":
        m.Add(sum(n.values()) >= lower_bound)
    scale = 100 if P.objective == "cost" else 1
    w = _weights(P, G)
    m.Minimize(sum(int(round(w[k] * scale)) * n[k] for k in n))
    if hint:
        for key, var in f.items():
            m.AddHint(var, hint.get(key, 0))
        for k, kind in enumerate(G.kinds):
            m.AddHint(n[k], _gpus_of_kind(G, hint, k))
    s = cp_model.CpSolver()
    s.parameters.catch_sigint_signal = False     # leave Ctrl-C to Python (twin.cli_support)
    s.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter() - t0))
    s.parameters.num_workers = int(threads or default_threads())
    s.parameters.random_seed = int(seed)
    build_s = time.perf_counter() - t0
    st = s.Solve(m)
    wall = time.perf_counter() - t0
    details = {"termination": s.StatusName(st), "build_s": build_s, "model": "arcflow",
               "n_arcs": G.n_arcs}
    if st == cp_model.INFEASIBLE:
        return SolveResult("cpsat", "infeasible", None, None, wall, (), bool(hint), details)
    bound = s.BestObjectiveBound() / scale
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult("cpsat", "unknown", None, bound, wall, (), bool(hint), details)
    flows = {key: int(s.Value(v)) for key, v in f.items() if s.Value(v) > 0}
    return _result("cpsat", P, G, flows, bound, st == cp_model.OPTIMAL, wall, bool(hint),
                   details)


def _gpus_of_kind(G: ArcFlowGraph, flows: dict[tuple[int, int], int], k: int) -> int:
    """GPUs of kind ``k`` in a flow: the flow leaving node 0."""
    return sum(v for (kk, a), v in flows.items() if kk == k and G.kinds[k].arcs[a][0] == 0)


def _result(solver: str, P: PackingProblem, G: ArcFlowGraph, flows, bound: float | None,
            optimal: bool, wall: float, warm: bool, details: dict) -> SolveResult:
    """The result of a solved flow; the objective is recomputed from the decomposed GPUs
    (surplus copies dropped), so it is exact for the placement returned."""
    gpus = decompose(G, flows)
    obj = float(sum(P.slot_weight(t) for t, _, _ in gpus))
    if optimal:
        bound = obj
    if bound is not None and P.objective == "gpus":
        bound = float(math.ceil(bound - 1e-6))
    return SolveResult(solver, "optimal" if optimal else "feasible", obj, bound, wall,
                       tuple(gpus), warm, details)


# ----------------------------------------------------------------------- constraint families
def _incidence(kind: Kind) -> dict[int, tuple[list[int], list[int]]]:
    """Per node of a kind's graph, in node order (0 and ``C_k`` always present): the arcs
    entering it and the arcs leaving it (indices into ``kind.arcs``)."""
    nodes: dict[int, tuple[list[int], list[int]]] = {0: ([], []), kind.cap: ([], [])}
    for a, (u, v, _) in enumerate(kind.arcs):
        nodes.setdefault(u, ([], []))[1].append(a)
        nodes.setdefault(v, ([], []))[0].append(a)
    return dict(sorted(nodes.items()))


def _add_flow_conservation(m, G: ArcFlowGraph, add) -> None:
    """sum_in f - sum_out f = -n_k at node 0, +n_k at C_k, 0 elsewhere (per kind k)."""
    import pyomo.environ as pyo
    cons = []
    for k, kind in enumerate(G.kinds):
        for node, (ins, outs) in _incidence(kind).items():
            e = sum(m.f[k, a] for a in ins) - sum(m.f[k, a] for a in outs)
            rhs = -m.n[k] if node == 0 else (m.n[k] if node == kind.cap else 0)
            cons.append(e == rhs)
    _collect(m, "flow", cons, add, pyo)


def _add_demand(m, G: ArcFlowGraph, add) -> None:
    """sum over item arcs of class c (all kinds) of f >= m_c."""
    import pyomo.environ as pyo
    per: dict[int, list] = {}
    for k, kind in enumerate(G.kinds):
        for a, (_, _, c) in enumerate(kind.arcs):
            if c >= 0:
                per.setdefault(c, []).append(m.f[k, a])
    cons = []
    for c, mem in enumerate(G.members):
        if c not in per:
            raise ValueError(f"arc-flow: adapters {mem[:3]} fit no bin kind")
        cons.append(sum(per[c]) >= len(mem))
    _collect(m, "demand", cons, add, pyo)


def _add_pool(m, P: PackingProblem, G: ArcFlowGraph, add) -> None:
    """sum_{k of type t} n_k <= count_t."""
    import pyomo.environ as pyo
    cons = []
    for t, spec in enumerate(P.types):
        ks = [k for k, kind in enumerate(G.kinds) if kind.type_index == t]
        if ks:
            cons.append(sum(m.n[k] for k in ks) <= spec.count)
    _collect(m, "pool", cons, add, pyo)


def _collect(m, name: str, cons: list, add, pyo) -> None:
    """Add constraints to a CP-SAT model (``add`` = ``model.Add``) or, for Pyomo, as one
    indexed ``ConstraintList`` named ``name``."""
    if hasattr(m, "component"):          # a Pyomo model
        cl = pyo.ConstraintList()
        setattr(m, name, cl)
        for c in cons:
            if c is True:
                continue
            cl.add(c)
    else:
        for c in cons:
            if c is not True:
                add(c)
