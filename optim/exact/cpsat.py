"""CP-SAT model of the placement problem (OR-Tools), over the same decisions and families as
``milp`` (see there for the math; each ``add_*`` here states the same constraint).

Differences in form only: Booleans instead of binaries, the same integer data, and for the
latency objective integer ``w[g,p]`` (load units) with an objective scaled to integers
(ITL table in units of 1e-3 ms).

Replication (``P.max_homes`` k > 1): the share ``s[i,g]`` of the MILP is carried as the integer
flow ``f[i,g] = w_i s[i,g]`` in load units, 0 <= f[i,g] <= w_i. Nothing is lost: once homes
and configurations are fixed, what remains is a transportation problem with integer supplies
``w_i`` and integer capacities, whose vertices are integral, so an integral flow exists
whenever a fractional one does (and the latency objective, linear in the loads, has an
integral optimum too). The extracted share is ``f[i,g] / w_i``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from ortools.sat.python import cp_model

from twin.cli_support import Interrupted, run_interruptible

from .common import (Effective, SolveResult, assign_slots, default_threads, effective,
                     warm_start_solution)
from .problem import PackingProblem

ITL_SCALE = 1000


@dataclass
class Vars:
    x: dict
    y: dict
    z: dict
    w: dict
    f: dict | None = None       # replication: flows f[i,g] in load units


def add_variables(m: cp_model.CpModel, P: PackingProblem, E: Effective) -> Vars:
    """x[i,g], y[g], z[g,p] Booleans (x absent when adapter i fits no configuration of t(g));
    w[g,p] in [0, cap_p] for the latency objective; with replication f[i,g] in [0, w_i]
    beside every x[i,g]."""
    x, y, z, w = {}, {}, {}, {}
    f = {} if P.splits else None
    for g, t in enumerate(E.slots):
        y[g] = m.NewBoolVar(f"y{g}")
        for p, c in enumerate(E.configs[t]):
            z[g, p] = m.NewBoolVar(f"z{g}_{p}")
            if P.objective == "latency":
                w[g, p] = m.NewIntVar(0, c.cap, f"w{g}_{p}")
        for i in range(P.n):
            if E.allowed[t][i]:
                x[i, g] = m.NewBoolVar(f"x{i}_{g}")
                if f is not None:
                    f[i, g] = m.NewIntVar(0, P.loads[i], f"f{i}_{g}")
    return Vars(x, y, z, w, f)


def add_assignment(m, P, E, v: Vars) -> None:
    """sum_g x[i,g] = 1 for all i; with replication sum_g f[i,g] = w_i (all traffic routed)."""
    for i in range(P.n):
        if v.f is None:
            m.AddExactlyOne([v.x[i, g] for g in range(len(E.slots)) if (i, g) in v.x])
        else:
            m.Add(sum(v.f[i, g] for g in range(len(E.slots)) if (i, g) in v.f) == P.loads[i])


def add_home_link(m, P, E, v: Vars) -> None:
    """Replication: traffic only to homes, f[i,g] <= w_i x[i,g] (as x[i,g] = 0 => f[i,g] = 0)."""
    for (i, g), fv in v.f.items():
        m.Add(fv == 0).OnlyEnforceIf(v.x[i, g].Not())


def add_max_homes(m, P, E, v: Vars) -> None:
    """Replication: sum_g x[i,g] <= k (and >= 1, implied by the assignment as w_i > 0)."""
    for i in range(P.n):
        homes = [v.x[i, g] for g in range(len(E.slots)) if (i, g) in v.x]
        m.Add(sum(homes) <= P.max_homes)
        m.AddBoolOr(homes)


def add_linking(m, P, E, v: Vars) -> None:
    """x[i,g] <= y[g]."""
    for (i, g), xv in v.x.items():
        m.AddImplication(xv, v.y[g])


def add_configuration_choice(m, P, E, v: Vars) -> None:
    """sum_p z[g,p] = y[g]."""
    for g, t in enumerate(E.slots):
        m.Add(sum(v.z[g, p] for p in range(len(E.configs[t]))) == v.y[g])


def add_rank(m, P, E, v: Vars) -> None:
    """x[i,g] <= sum_{p: r_p >= r_i} z[g,p]  (memory table: only starting configurations exist)."""
    for (i, g), xv in v.x.items():
        t = E.slots[g]
        ok = [p for p, c in enumerate(E.configs[t]) if c.rank >= P.ranks[i]]
        if len(ok) < len(E.configs[t]):
            m.AddBoolOr([v.z[g, p] for p in ok]).OnlyEnforceIf(xv)


def _sum_x(P, v, g, coef):
    return sum(coef[i] * v.x[i, g] for i in range(P.n) if (i, g) in v.x)


def gpu_load(P, v: Vars, g: int):
    """L_g: sum_i w_i x[i,g], or with replication sum_i f[i,g]."""
    if v.f is None:
        return _sum_x(P, v, g, P.loads)
    return sum(v.f[i, g] for i in range(P.n) if (i, g) in v.f)


def add_feature_interval(m, P, E, v: Vars) -> None:
    """sum_p xlo_p z[g,p] <= sum_i phi_i x[i,g] <= sum_p xhi_p z[g,p]."""
    for g, t in enumerate(E.slots):
        xs = _sum_x(P, v, g, P.xs)
        m.Add(sum(c.x_lo * v.z[g, p] for p, c in enumerate(E.configs[t])) <= xs)
        m.Add(xs <= sum(c.x_hi * v.z[g, p] for p, c in enumerate(E.configs[t])))


def add_capacity(m, P, E, v: Vars) -> None:
    """sum_p llo_p z[g,p] <= L_g <= sum_p cap_p z[g,p] (``gpu_load``); the same per configuration
    as half-reified constraints (z[g,p] => llo_p <= load_g <= cap_p, xlo_p <= x_g <= xhi_p),
    which CP-SAT propagates far better than the sums; and the aggregate
    sum_g sum_p cap_p z[g,p] >= total load (redundant, tightens the bound)."""
    total = []
    for g, t in enumerate(E.slots):
        load = gpu_load(P, v, g)
        caps = sum(c.cap * v.z[g, p] for p, c in enumerate(E.configs[t]))
        m.Add(load <= caps)
        total.append(caps)
        if any(c.load_lo for c in E.configs[t]):
            m.Add(sum(c.load_lo * v.z[g, p] for p, c in enumerate(E.configs[t])) <= load)
        xs = _sum_x(P, v, g, P.xs)
        for p, c in enumerate(E.configs[t]):
            m.Add(load <= c.cap).OnlyEnforceIf(v.z[g, p])
            if c.load_lo:
                m.Add(load >= c.load_lo).OnlyEnforceIf(v.z[g, p])
            m.Add(xs >= c.x_lo).OnlyEnforceIf(v.z[g, p])
            m.Add(xs <= c.x_hi).OnlyEnforceIf(v.z[g, p])
    m.Add(sum(total) >= P.total_load)


def add_symmetry_breaking(m, P, E, v: Vars) -> None:
    """y[g] >= y[g+1] within a type; identical adapters i < j: slot(i) <= slot(j)."""
    for g in range(len(E.slots) - 1):
        if E.slots[g] == E.slots[g + 1]:
            m.AddImplication(v.y[g + 1], v.y[g])
    G = range(len(E.slots))
    for grp in P.identical_groups():
        for a, b in zip(grp[:-1], grp[1:]):
            m.Add(sum(g * v.x[a, g] for g in G if (a, g) in v.x)
                  <= sum(g * v.x[b, g] for g in G if (b, g) in v.x))


def add_cuts(m, P, E, v: Vars) -> None:
    """sum_{i in S} x[i,g] [- sum_{i not in S} x[i,g]] + sum_{p:(r,A)} z[g,p] <= |S| per slot g
    of the cut's type."""
    for cut in P.cuts:
        for g, t in enumerate(E.slots):
            if t != cut.type_index:
                continue
            ps = [p for p, c in enumerate(E.configs[t]) if c.rank == cut.rank and c.amax == cut.amax]
            if not ps or any((i, g) not in v.x for i in cut.adapters):
                continue
            expr = sum(v.x[i, g] for i in cut.adapters) + sum(v.z[g, p] for p in ps)
            if not cut.superset:
                expr = expr - sum(v.x[i, g] for i in range(P.n)
                                  if i not in cut.adapters and (i, g) in v.x)
            m.Add(expr <= len(cut.adapters))


def add_budget(m, P, E, v: Vars) -> None:
    """sum_g y[g] <= B (latency objective)."""
    if P.objective == "latency" and P.gpu_budget is not None:
        m.Add(sum(v.y.values()) <= P.gpu_budget)


def add_lower_bound(m, P, E, v: Vars) -> None:
    """sum_g y[g] >= LB for a proven GPU lower bound LB (gpus objective; redundant)."""
    if P.objective == "gpus" and P.gpu_lower_bound > 0:
        m.Add(sum(v.y.values()) >= P.gpu_lower_bound)


def set_objective(m, P, E, v: Vars) -> float:
    """gpus: min sum y; cost: min sum price y (prices in cents); latency: min sum itl_p w[g,p]
    with w[g,p] <= cap_p z[g,p], sum_p w[g,p] = load_g. Returns the objective scale."""
    if P.objective == "latency":
        for (g, p), wv in v.w.items():
            m.Add(wv == 0).OnlyEnforceIf(v.z[g, p].Not())
        for g, t in enumerate(E.slots):
            m.Add(sum(v.w[g, p] for p in range(len(E.configs[t]))) == gpu_load(P, v, g))
        m.Minimize(sum(int(round((E.configs[E.slots[g]][p].itl_ms or 1e6) * ITL_SCALE)) * wv
                       for (g, p), wv in v.w.items()))
        return ITL_SCALE * max(P.total_load, 1)
    if P.objective == "cost":
        m.Minimize(sum(int(round(P.slot_weight(E.slots[g]) * 100)) * v.y[g] for g in v.y))
        return 100.0
    m.Minimize(sum(v.y.values()))
    return 1.0


def _add_split_hint(m, P, E, v: Vars, start: SolveResult) -> None:
    """Hints y, z, x and the flows f = w_i x share from a replication start (none when it does
    not fit the slots)."""
    from .split import hint_slots
    hs = hint_slots(P, E, start)
    if hs is None:
        return
    for g, t in enumerate(E.slots):
        pe, items, shares = hs.get(g, (None, (), ()))
        m.AddHint(v.y[g], g in hs)
        for p in range(len(E.configs[t])):
            m.AddHint(v.z[g, p], p == pe)
        share = dict(zip(items, shares))
        for i in range(P.n):
            if (i, g) in v.x:
                m.AddHint(v.x[i, g], i in share)
                m.AddHint(v.f[i, g], int(round(P.loads[i] * share.get(i, 0.0))))


def build_model(P: PackingProblem, symmetry: bool = True):
    if P.splits and P.cuts:
        raise ValueError(f"problem '{P.name}': adapter-set cuts are not valid with replication "
                         "(a GPU's load is not fixed by its adapters); use capacity cuts")
    E = effective(P)
    m = cp_model.CpModel()
    v = add_variables(m, P, E)
    add_assignment(m, P, E, v)
    if P.splits:
        add_home_link(m, P, E, v)
        add_max_homes(m, P, E, v)
    add_linking(m, P, E, v)
    add_configuration_choice(m, P, E, v)
    add_rank(m, P, E, v)
    add_feature_interval(m, P, E, v)
    add_capacity(m, P, E, v)
    if symmetry:
        add_symmetry_breaking(m, P, E, v)
    add_cuts(m, P, E, v)
    add_budget(m, P, E, v)
    add_lower_bound(m, P, E, v)
    scale = set_objective(m, P, E, v)
    return m, E, v, scale


def solve_cpsat(P: PackingProblem, time_limit_s: float = 60.0, threads: int | None = None,
                warm_start: Sequence[tuple[int, Sequence[int]]] | None = None,
                symmetry: bool = True, seed: int = 0, verbose: bool = False,
                split_hint: SolveResult | None = None) -> SolveResult:
    """Solve with CP-SAT (``num_workers`` = threads, seeded); ``warm_start`` as a hint, or with
    replication ``split_hint`` (a start with shares, ``split``) when there is no unsplit one."""
    t0 = time.perf_counter()
    m, E, v, scale = build_model(P, symmetry)
    start = warm_start_solution(P, E, warm_start)
    if start is not None:
        slots = assign_slots(P, E, start)
        for g in range(len(E.slots)):
            used = g in slots
            m.AddHint(v.y[g], used)
            for p in range(len(E.configs[E.slots[g]])):
                m.AddHint(v.z[g, p], used and slots[g][1] == p)
                if (g, p) in v.w:
                    m.AddHint(v.w[g, p], sum(P.loads[i] for i in slots[g][2])
                              if used and slots[g][1] == p else 0)
            for i in range(P.n):
                if (i, g) in v.x:
                    m.AddHint(v.x[i, g], used and i in slots[g][2])
                    if v.f is not None:
                        m.AddHint(v.f[i, g], P.loads[i] if used and i in slots[g][2] else 0)
    elif split_hint is not None and v.f is not None:
        _add_split_hint(m, P, E, v, split_hint)
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = max(0.1, float(time_limit_s) - (time.perf_counter() - t0))
    s.parameters.num_workers = int(threads or default_threads())
    s.parameters.random_seed = int(seed)
    s.parameters.log_search_progress = verbose
    # Ctrl-C / SIGTERM: Python's handler (not CP-SAT's, which would swallow it) raises in the
    # main thread while the search runs in a helper thread; StopSearch ends it with the best
    # solution so far, returned in ``Interrupted.partial``
    s.parameters.catch_sigint_signal = False
    build_s = time.perf_counter() - t0
    st, interrupted = run_interruptible(lambda: s.Solve(m), s.StopSearch)
    wall = time.perf_counter() - t0
    if interrupted:
        r = None
        if st is not None:
            r = _result(P, E, v, s, st, scale, wall, start is not None,
                        {"termination": s.StatusName(st) + " (interrupted)", "build_s": build_s,
                         "interrupted": True})
        raise Interrupted(r, "cpsat search interrupted")
    return _result(P, E, v, s, st, scale, wall, start is not None,
                   {"termination": s.StatusName(st), "build_s": build_s})


def _result(P: PackingProblem, E: Effective, v: Vars, s, st, scale: float, wall: float,
            warm: bool, details: dict) -> SolveResult:
    """The ``SolveResult`` of a finished (or stopped) search."""
    if st == cp_model.INFEASIBLE:
        return SolveResult("cpsat", "infeasible", None, None, wall, (), warm, details)
    bound = s.BestObjectiveBound() / scale
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveResult("cpsat", "unknown", None, bound, wall, (), warm, details)
    obj = s.ObjectiveValue() / scale
    gpus = []
    shares = []
    for g, t in enumerate(E.slots):
        if s.Value(v.y[g]):
            items = tuple(i for i in range(P.n) if (i, g) in v.x and s.Value(v.x[i, g]))
            p = next(p for p in range(len(E.configs[t])) if s.Value(v.z[g, p]))
            if items:
                gpus.append((t, E.orig[t][p], items))
                if v.f is not None:
                    shares.append(tuple(s.Value(v.f[i, g]) / P.loads[i] for i in items))
    if st == cp_model.OPTIMAL:
        bound = obj
        status = "optimal"
    else:
        status = "feasible"
    if P.objective == "gpus":
        bound = math.ceil(bound - 1e-6)
    if P.objective == "cost":
        obj = sum(P.types[t].price for t, _, _ in gpus)
    return SolveResult("cpsat", status, float(obj), float(bound), wall, tuple(gpus),
                       warm, details, tuple(shares))
