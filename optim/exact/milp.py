"""MILP of the placement problem, built with Pyomo and solved with HiGHS (``appsi_highs``).

Sets: adapters ``I``, GPU slots ``G`` (type ``t(g)``), configurations ``P_t`` of each type
(see ``problem``). Variables: ``x[i,g]``, ``y[g]``, ``z[g,p]`` binary; ``w[g,p] >= 0`` (load
on GPU ``g`` under configuration ``p``) only for the latency objective. Each constraint family
is added by one ``add_*`` function whose docstring states it. Data are the integer units of
``problem`` (loads ``w_i``, feature values ``phi_i``), so HiGHS, CP-SAT and the brute force
see the same feasible set.

Replication (``P.max_homes`` k > 1, ``problem`` module docstring): ``x[i,g]`` becomes the home
indicator and a continuous share ``s[i,g]`` in [0, 1] carries the traffic (``add_assignment``,
``add_home_link``, ``add_max_homes``); the load of GPU ``g`` is ``L_g = sum_i w_i s[i,g]``
(``gpu_load``), everything else reads ``x`` as before. Without replication ``L_g = sum_i w_i
x[i,g]`` and the model is unchanged.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Sequence

import pyomo.environ as pyo

from twin.cli_support import Interrupted, run_interruptible

from .common import (Effective, SolveResult, assign_slots, effective, highs_threads,
                     warm_start_solution)
from .problem import PackingProblem


def add_variables(m, P: PackingProblem, E: Effective, relax: bool = False) -> None:
    """x[i,g] in {0,1} (0 when adapter i fits no configuration of t(g)); y[g], z[g,p] in {0,1};
    w[g,p] >= 0 for the latency objective; with replication s[i,g] in [0, 1] (0 where x is)."""
    dom = pyo.UnitInterval if relax else pyo.Binary
    m.I = pyo.RangeSet(0, P.n - 1)
    m.G = pyo.RangeSet(0, len(E.slots) - 1)
    m.GP = pyo.Set(dimen=2, initialize=[(g, p) for g, t in enumerate(E.slots)
                                        for p in range(len(E.configs[t]))])
    m.x = pyo.Var(m.I, m.G, domain=dom)
    m.y = pyo.Var(m.G, domain=dom)
    m.z = pyo.Var(m.GP, domain=dom)
    if P.splits:
        m.s = pyo.Var(m.I, m.G, domain=pyo.UnitInterval)
    for g, t in enumerate(E.slots):
        for i in range(P.n):
            if not E.allowed[t][i]:
                m.x[i, g].fix(0)
                if P.splits:
                    m.s[i, g].fix(0)
    if P.objective == "latency":
        m.w = pyo.Var(m.GP, domain=pyo.NonNegativeReals)


def add_assignment(m, P: PackingProblem, E: Effective) -> None:
    """Every adapter on exactly one GPU:  sum_g x[i,g] = 1  for all i; with replication every
    adapter's traffic routed in full:  sum_g s[i,g] = 1."""
    v = m.s if P.splits else m.x
    m.assign = pyo.Constraint(m.I, rule=lambda m, i: sum(v[i, g] for g in m.G) == 1)


def add_home_link(m, P: PackingProblem, E: Effective) -> None:
    """Replication: traffic only to homes:  s[i,g] <= x[i,g]  for all i, g."""
    m.home = pyo.Constraint(m.I, m.G, rule=lambda m, i, g: m.s[i, g] <= m.x[i, g]
                            if E.allowed[E.slots[g]][i] else pyo.Constraint.Skip)


def add_max_homes(m, P: PackingProblem, E: Effective) -> None:
    """Replication: at most k homes per adapter:  sum_g x[i,g] <= k  for all i (at least one
    follows from the assignment and the home link)."""
    m.homes = pyo.Constraint(m.I, rule=lambda m, i: sum(m.x[i, g] for g in m.G)
                             <= P.max_homes)


def gpu_load(m, P: PackingProblem, g: int):
    """L_g: sum_i w_i x[i,g], or with replication sum_i w_i s[i,g] (the shares' load)."""
    v = m.s if P.splits else m.x
    return sum(P.loads[i] * v[i, g] for i in range(P.n))


def add_linking(m, P: PackingProblem, E: Effective) -> None:
    """Adapters only on used GPUs:  x[i,g] <= y[g]  for all i, g."""
    m.link = pyo.Constraint(m.I, m.G, rule=lambda m, i, g: m.x[i, g] <= m.y[g]
                            if E.allowed[E.slots[g]][i] else pyo.Constraint.Skip)


def add_configuration_choice(m, P: PackingProblem, E: Effective) -> None:
    """A used GPU takes exactly one configuration (piece), an unused one none:
    sum_{p in P_t(g)} z[g,p] = y[g]."""
    def rule(m, g):
        ps = range(len(E.configs[E.slots[g]]))
        if not ps:
            return m.y[g] == 0
        return sum(m.z[g, p] for p in ps) == m.y[g]
    m.choose = pyo.Constraint(m.G, rule=rule)


def add_rank(m, P: PackingProblem, E: Effective) -> None:
    """Max-rank class and memory table: an adapter of rank r_i only under a configuration whose
    rank class is >= r_i:  x[i,g] <= sum_{p: r_p >= r_i} z[g,p]. (Configurations whose
    (Amax, rank) has no KV entry do not exist, see ``problem``.)"""
    def rule(m, i, g):
        t = E.slots[g]
        if not E.allowed[t][i]:
            return pyo.Constraint.Skip
        ok = [p for p, c in enumerate(E.configs[t]) if c.rank >= P.ranks[i]]
        if len(ok) == len(E.configs[t]):
            return pyo.Constraint.Skip
        return m.x[i, g] <= sum(m.z[g, p] for p in ok)
    m.rank = pyo.Constraint(m.I, m.G, rule=rule)


def add_feature_interval(m, P: PackingProblem, E: Effective) -> None:
    """The piece feature lies in the chosen piece's interval (exact, no big-M since one z is 1):
    sum_p xlo_p z[g,p] <= sum_i phi_i x[i,g] <= sum_p xhi_p z[g,p]."""
    def lo(m, g):
        t = E.slots[g]
        return sum(c.x_lo * m.z[g, p] for p, c in enumerate(E.configs[t])) <= \
            sum(P.xs[i] * m.x[i, g] for i in range(P.n))

    def hi(m, g):
        t = E.slots[g]
        return sum(P.xs[i] * m.x[i, g] for i in range(P.n)) <= \
            sum(c.x_hi * m.z[g, p] for p, c in enumerate(E.configs[t]))
    m.feat_lo = pyo.Constraint(m.G, rule=lo)
    m.feat_hi = pyo.Constraint(m.G, rule=hi)


def add_capacity(m, P: PackingProblem, E: Effective) -> None:
    """The piece's load cap (and, for latency sub-pieces, its lower load end):
    sum_p llo_p z[g,p] <= L_g <= sum_p cap_p z[g,p]  (L_g from ``gpu_load``)."""
    def hi(m, g):
        t = E.slots[g]
        return gpu_load(m, P, g) <= sum(c.cap * m.z[g, p] for p, c in enumerate(E.configs[t]))
    m.cap = pyo.Constraint(m.G, rule=hi)
    if any(c.load_lo > 0 for cs in E.configs for c in cs):
        def lo(m, g):
            t = E.slots[g]
            return sum(c.load_lo * m.z[g, p] for p, c in enumerate(E.configs[t])) <= \
                gpu_load(m, P, g)
        m.cap_lo = pyo.Constraint(m.G, rule=lo)


def add_symmetry_breaking(m, P: PackingProblem, E: Effective) -> None:
    """GPU order within a type: y[g] >= y[g+1] for consecutive slots of one type; identical
    adapters i < j (equal rank, load, feature) ordered by slot: sum_g g x[i,g] <= sum_g g x[j,g].
    Both hold for some optimal solution (GPU and adapter relabelings commute)."""
    pairs = [(g, g + 1) for g in range(len(E.slots) - 1) if E.slots[g] == E.slots[g + 1]]
    m.sym_y = pyo.Constraint(pyo.Any)
    for g, h in pairs:
        m.sym_y[g] = m.y[g] >= m.y[h]
    m.sym_x = pyo.Constraint(pyo.Any)
    for grp in P.identical_groups():
        for a, b in zip(grp[:-1], grp[1:]):
            m.sym_x[a] = sum(g * m.x[a, g] for g in m.G) <= sum(g * m.x[b, g] for g in m.G)


def add_cuts(m, P: PackingProblem, E: Effective) -> None:
    """Twin no-good cuts: for a cut (type t, rank r, Amax A, set S) and every slot g of type t,
    sum_{i in S} x[i,g] [- sum_{i not in S} x[i,g] unless superset] + sum_{p: (r_p,A_p)=(r,A)}
    z[g,p] <= |S|."""
    m.cuts = pyo.Constraint(pyo.Any)
    k = 0
    for cut in P.cuts:
        for g, t in enumerate(E.slots):
            if t != cut.type_index:
                continue
            ps = [p for p, c in enumerate(E.configs[t]) if c.rank == cut.rank and c.amax == cut.amax]
            if not ps:
                continue
            expr = sum(m.x[i, g] for i in cut.adapters) + sum(m.z[g, p] for p in ps)
            if not cut.superset:
                expr = expr - sum(m.x[i, g] for i in range(P.n) if i not in cut.adapters)
            m.cuts[k] = expr <= len(cut.adapters)
            k += 1


def add_budget(m, P: PackingProblem, E: Effective) -> None:
    """GPU budget (latency objective): sum_g y[g] <= B."""
    if P.objective == "latency" and P.gpu_budget is not None:
        m.budget = pyo.Constraint(expr=sum(m.y[g] for g in m.G) <= P.gpu_budget)


def set_objective(m, P: PackingProblem, E: Effective) -> None:
    """gpus: min sum_g y[g]; cost: min sum_g price_t(g) y[g]; latency: min
    sum_{g,p} itl_p w[g,p] / W with w[g,p] <= cap_p z[g,p] and sum_p w[g,p] = L_g
    (W = total load): the load-weighted mean ITL of the per-piece ITL table."""
    if P.objective == "latency":
        m.w_cap = pyo.Constraint(m.GP, rule=lambda m, g, p:
                                 m.w[g, p] <= E.configs[E.slots[g]][p].cap * m.z[g, p])
        m.w_sum = pyo.Constraint(m.G, rule=lambda m, g: sum(
            m.w[g, p] for p in range(len(E.configs[E.slots[g]])))
            == gpu_load(m, P, g))
        W = max(P.total_load, 1)
        m.obj = pyo.Objective(expr=sum((E.configs[E.slots[g]][p].itl_ms or 1e6) * m.w[g, p]
                                       for g, p in m.GP) / W, sense=pyo.minimize)
    else:
        m.obj = pyo.Objective(expr=sum(P.slot_weight(E.slots[g]) * m.y[g] for g in m.G),
                              sense=pyo.minimize)


def add_lower_bound(m, P: PackingProblem, E: Effective) -> None:
    """A proven GPU lower bound LB (gpus objective):  sum_g y[g] >= LB. Redundant for the
    integer optimum; it lifts the LP bound to LB at once."""
    if P.objective == "gpus" and P.gpu_lower_bound > 0:
        m.lower_bound = pyo.Constraint(expr=sum(m.y[g] for g in m.G) >= P.gpu_lower_bound)


def build_model(P: PackingProblem, relax: bool = False, symmetry: bool = True):
    """The Pyomo model (every family above) and the effective data."""
    if P.splits and P.cuts:
        raise ValueError(f"problem '{P.name}': adapter-set cuts are not valid with replication "
                         "(a GPU's load is not fixed by its adapters); use capacity cuts")
    E = effective(P)
    m = pyo.ConcreteModel(name=P.name)
    add_variables(m, P, E, relax)
    add_assignment(m, P, E)
    if P.splits:
        add_home_link(m, P, E)
        add_max_homes(m, P, E)
    add_linking(m, P, E)
    add_configuration_choice(m, P, E)
    add_rank(m, P, E)
    add_feature_interval(m, P, E)
    add_capacity(m, P, E)
    if symmetry:
        add_symmetry_breaking(m, P, E)
    add_cuts(m, P, E)
    add_budget(m, P, E)
    add_lower_bound(m, P, E)
    set_objective(m, P, E)
    return m, E


def _set_start(m, P, E, start) -> None:
    slots = assign_slots(P, E, start)
    for g in range(len(E.slots)):
        used = g in slots
        m.y[g].set_value(1 if used else 0)
        for p in range(len(E.configs[E.slots[g]])):
            m.z[g, p].set_value(1 if used and slots[g][1] == p else 0)
        for i in range(P.n):
            if not m.x[i, g].fixed:
                m.x[i, g].set_value(1 if used and i in slots[g][2] else 0)
                if P.splits:
                    m.s[i, g].set_value(1 if used and i in slots[g][2] else 0)
        if P.objective == "latency":
            for p in range(len(E.configs[E.slots[g]])):
                m.w[g, p].set_value(sum(P.loads[i] for i in slots[g][2])
                                    if used and slots[g][1] == p else 0)


def _set_split_start(m, P, E, start: SolveResult) -> bool | None:
    """Values y, z, x, s from a replication start (True), None when it does not fit the slots."""
    from .split import hint_slots
    hs = hint_slots(P, E, start)
    if hs is None:
        return None
    for g, t in enumerate(E.slots):
        pe, items, shares = hs.get(g, (None, (), ()))
        m.y[g].set_value(1 if g in hs else 0)
        for p in range(len(E.configs[t])):
            m.z[g, p].set_value(1 if p == pe else 0)
        share = dict(zip(items, shares))
        for i in range(P.n):
            if not m.x[i, g].fixed:
                m.x[i, g].set_value(1 if i in share else 0)
                m.s[i, g].set_value(share.get(i, 0.0))
    return True




def solve_milp(P: PackingProblem, time_limit_s: float = 60.0, threads: int | None = None,
               warm_start: Sequence[tuple[int, Sequence[int]]] | None = None,
               mip_gap: float = 0.0, symmetry: bool = True, relax: bool = False,
               verbose: bool = False, split_hint: SolveResult | None = None) -> SolveResult:
    """Solve with HiGHS. ``warm_start``: a heuristic solution as ``(type_index, adapters)`` per
    GPU (ignored when it violates the model); with replication ``split_hint`` (a start with
    shares, ``split``) when there is no unsplit one. ``relax=True`` solves the LP
    relaxation."""
    from pyomo.contrib.appsi.solvers import Highs
    t0 = time.perf_counter()
    m, E = build_model(P, relax=relax, symmetry=symmetry)
    start = None if relax else warm_start_solution(P, E, warm_start)
    if start is not None:
        _set_start(m, P, E, start)
    elif not relax and split_hint is not None and P.splits:
        start = _set_split_start(m, P, E, split_hint)
    s = Highs()
    s.config.time_limit = max(0.1, float(time_limit_s) - (time.perf_counter() - t0))
    s.config.mip_gap = mip_gap
    s.config.load_solution = False
    s.config.stream_solver = verbose
    s.config.warmstart = start is not None
    s.highs_options = {"threads": highs_threads(threads), "random_seed": 0,
                       "mip_rel_gap": mip_gap, "mip_abs_gap": 1e-6 if P.objective != "gpus"
                       else 0.99}
    build_s = time.perf_counter() - t0
    # Ctrl-C / SIGTERM: HiGHS runs in a helper thread so that Python's handler raises in the
    # main thread; cancelSolve makes HiGHS's interrupt callback end the search with its best
    # solution so far, returned in ``Interrupted.partial``
    s.set_instance(m)         # Python work, interruptible here; the thread only solves
    uc = s.update_config      # the model is loaded: nothing to re-check before the solve
    for flag in ("check_for_new_or_removed_constraints", "check_for_new_or_removed_vars",
                 "check_for_new_or_removed_params", "check_for_new_objective",
                 "update_constraints", "update_vars", "update_params",
                 "update_named_expressions", "update_objective"):
        if hasattr(uc, flag):
            setattr(uc, flag, False)
    res, interrupted = run_interruptible(lambda: s.solve(m), lambda: _cancel(s))
    wall = time.perf_counter() - t0
    if interrupted:
        r = None
        if res is not None:
            _keep_incumbent(s, res)
            r = _result(m, P, E, res, relax, wall, start is not None,
                        {"termination": f"{res.termination_condition} (interrupted)",
                         "build_s": build_s, "interrupted": True})
        raise Interrupted(r, "milp search interrupted")
    return _result(m, P, E, res, relax, wall, start is not None,
                   {"termination": str(res.termination_condition), "build_s": build_s})


def _cancel(s) -> None:
    """Ask the appsi HiGHS solver ``s`` to stop (its highspy object exists once the model is
    loaded; pyomo enables highspy's interrupt callback for HiGHS >= 1.8)."""
    h = getattr(s, "_solver_model", None)
    if h is not None:
        h.cancelSolve()


def _keep_incumbent(s, res) -> None:
    """pyomo reports HiGHS's ``kInterrupt`` as ``unknown`` and drops the incumbent: take it
    back, as for a time limit, when HiGHS holds a valid solution."""
    from pyomo.contrib.appsi.base import TerminationCondition as TC
    sol, h = getattr(s, "_sol", None), getattr(s, "_solver_model", None)
    if res.best_feasible_objective is not None or h is None or sol is None \
            or not sol.value_valid:
        return
    info = h.getInfo()
    res.best_feasible_objective = info.objective_function_value
    res.termination_condition = TC.maxTimeLimit
    if info.mip_node_count != -1:
        res.best_objective_bound = info.mip_dual_bound


class _NoInterruptWarning(logging.Filter):
    """pyomo warns about HiGHS's ``kInterrupt`` status, which here is our own Ctrl-C."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "kInterrupt" not in record.getMessage()


logging.getLogger("pyomo.contrib.appsi.solvers.highs").addFilter(_NoInterruptWarning())


def _result(m, P: PackingProblem, E: Effective, res, relax: bool, wall: float, warm: bool,
            details: dict) -> SolveResult:
    """The ``SolveResult`` of a finished (or stopped) HiGHS solve."""
    from pyomo.contrib.appsi.base import TerminationCondition as TC
    tc = res.termination_condition
    details = {**details, "n_vars": m.nvariables(), "n_cons": m.nconstraints()}
    if tc == TC.infeasible:
        return SolveResult("milp", "infeasible", None, None, wall, (), warm, details)
    obj = res.best_feasible_objective
    bound = res.best_objective_bound
    if bound is not None and (math.isinf(bound) or math.isnan(bound)):
        bound = None
    if obj is None or (isinstance(obj, float) and math.isinf(obj)):
        return SolveResult("milp", "unknown", None, bound, wall, (), warm, details)
    res.solution_loader.load_vars()
    if relax:
        return SolveResult("milp-lp", "optimal", float(obj), float(obj), wall, (), False, details)
    gpus = []
    shares = _split_shares(m, P, E) if P.splits else None
    out_shares = []
    for g in range(len(E.slots)):
        if pyo.value(m.y[g]) > 0.5:
            items = tuple(i for i in range(P.n) if pyo.value(m.x[i, g]) > 0.5)
            p = max(range(len(E.configs[E.slots[g]])), key=lambda p: pyo.value(m.z[g, p]))
            if items:
                gpus.append((E.slots[g], E.orig[E.slots[g]][p], items))
                if shares is not None:
                    out_shares.append(tuple(shares.get((i, g), 0.0) for i in items))
    status = "optimal" if tc == TC.optimal else "feasible"
    if status == "optimal":
        bound = float(obj) if bound is None else bound
    if P.objective in ("gpus",) and bound is not None:
        bound = math.ceil(bound - 1e-6)
    return SolveResult("milp", status, float(obj), bound, wall, tuple(gpus), warm,
                       details, tuple(out_shares))


SHARE_EPS = 1e-7      # shares below this (LP-solver noise) are dropped, the rest rescaled


def _split_shares(m, P: PackingProblem, E: Effective) -> dict[tuple[int, int], float]:
    """(adapter, slot) -> share of the solved s on used slots: values under ``SHARE_EPS`` are
    dropped and each adapter's shares rescaled to sum to exactly 1 (HiGHS meets the rows only
    up to its tolerance)."""
    raw = {(i, g): float(pyo.value(m.s[i, g])) for i in range(P.n) for g in range(len(E.slots))
           if pyo.value(m.y[g]) > 0.5 and (pyo.value(m.s[i, g]) or 0.0) > SHARE_EPS}
    tot: dict[int, float] = {}
    for (i, _), v in raw.items():
        tot[i] = tot.get(i, 0.0) + v
    return {(i, g): v / tot[i] for (i, g), v in raw.items()}
