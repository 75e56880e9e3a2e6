"""Exact placement over (GPU type, power cap, Amax, max rank) configurations: an integer model
with a configuration index per GPU slot, in the spirit of serving templates, solved by CP-SAT
(``cpsat``) or HiGHS (``milp``) with the same integer coefficients.

Model (the configuration index of ``optim.gpu_configs``; loads in whole tok/s rounded up,
capacities rounded down, power in units of 0.1 mW, prices in cents):

* slots k = 0..K-1 (K = min(pool size, adapters)); ``y[k, c]`` = slot k runs configuration c
  (at most one), ``x[i, k]`` = adapter i on slot k (exactly one slot per adapter);
* a slot holds at most Amax_c adapters, of rank <= the configuration's, with total load <=
  capacity_c; a used slot holds at least one adapter;
* availability: Σ_k Σ_{c of type t} y[k, c] <= units of t;
* power: ``l[k, c]`` = load of slot k under c (0 unless y[k, c]); predicted power of slot k =
  Σ_c idle_c y[k, c] + slope_c l[k, c] (the configuration's fitted line); with a power budget
  Σ_k power_k <= budget;
* objective: GPUs Σ y, cost Σ price_c y, or energy Σ power_k (x 3600 for J/h);
* symmetry: adapters sorted by load (heaviest first); adapter i only on slots <= i, used slots
  first; configurations dominated by another of the same type (``undominated``) are left out.

The search starts from the greedy plan (``optim.config_greedy``) as a hint. *Optimal* means
proven for this model: the twin-measured configuration capacities and the linear power lines;
the twin then replays the placement (each GPU with its own profile and cap); a GPU it rejects is
searched at every integer Amax first (``loop.integer_amax_rescue``; not with a power budget or
the energy objective, whose power depends on Amax) and, where no Amax serves it, cuts its
configuration's capacity below the load it failed at and the model is solved again.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from ..config_greedy import (MAX_TWIN_ROUNDS, Bin, best_plan, derate_rejected, plan_power,
                             plan_value, refit, to_placement)
from ..gpu_configs import GpuConfig, config_index, derived_note
from ..instance import Instance
from ..placement import Placement
from .common import highs_threads

POWER_UNIT_W = 1e-4        # 0.1 mW


class _Model:
    """A small integer linear model: integer variables with bounds, rows lo <= a.x <= hi, a
    linear objective (minimised) and a hint; solved by CP-SAT or HiGHS with the same
    (integer) coefficients."""

    def __init__(self) -> None:
        self.lb: list[int] = []
        self.ub: list[int] = []
        self.rows: list[tuple[list[tuple[int, int]], float, float]] = []
        self.obj: list[tuple[int, int]] = []
        self.hint: dict[int, int] = {}

    def var(self, lb: int, ub: int) -> int:
        self.lb.append(int(lb))
        self.ub.append(int(ub))
        return len(self.lb) - 1

    def row(self, terms: list[tuple[int, int]], lo: float, hi: float) -> None:
        self.rows.append(([(j, int(a)) for j, a in terms if a != 0], lo, hi))

    def solve_cpsat(self, time_limit_s: float, threads: int, seed: int
                    ) -> tuple[str, list[int] | None, float]:
        from ortools.sat.python import cp_model
        m = cp_model.CpModel()
        v = [m.NewIntVar(lo, hi, f"v{j}") for j, (lo, hi) in enumerate(zip(self.lb, self.ub))]
        for terms, lo, hi in self.rows:
            expr = sum(a * v[j] for j, a in terms)
            lo_i = -(2**62) if lo == -math.inf else int(math.ceil(lo))
            hi_i = 2**62 if hi == math.inf else int(math.floor(hi))
            m.AddLinearConstraint(expr, lo_i, hi_i)
        m.Minimize(sum(a * v[j] for j, a in self.obj))
        for j, x in self.hint.items():
            m.AddHint(v[j], x)
        solver = cp_model.CpSolver()
        solver.parameters.catch_sigint_signal = False   # leave Ctrl-C to Python
        solver.parameters.max_time_in_seconds = max(float(time_limit_s), 0.1)
        solver.parameters.num_workers = max(int(threads), 1)
        solver.parameters.random_seed = seed
        solver.parameters.linearization_level = 2
        st = solver.Solve(m)
        if st == cp_model.INFEASIBLE:
            return "infeasible", None, math.inf
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return "unknown", None, math.inf
        vals = [int(solver.Value(x)) for x in v]
        return ("optimal" if st == cp_model.OPTIMAL else "feasible"), vals, \
            float(solver.BestObjectiveBound())

    def solve_highs(self, time_limit_s: float, threads: int, seed: int
                    ) -> tuple[str, list[int] | None, float]:
        import highspy
        import numpy as np
        import scipy.sparse as sp

        n = len(self.lb)
        inf = highspy.kHighsInf
        ri, cj, val = [], [], []
        for r, (terms, _, _) in enumerate(self.rows):
            for j, a in terms:
                ri.append(r), cj.append(j), val.append(float(a))
        A = sp.csc_matrix((val, (ri, cj)), shape=(len(self.rows), n))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, len(self.rows)
        cost = np.zeros(n)
        for j, a in self.obj:
            cost[j] += a
        lp.col_cost_ = cost
        lp.col_lower_ = np.array(self.lb, dtype=float)
        lp.col_upper_ = np.array(self.ub, dtype=float)
        lp.row_lower_ = np.array([-inf if lo == -math.inf else lo for _, lo, _ in self.rows])
        lp.row_upper_ = np.array([inf if hi == math.inf else hi for _, _, hi in self.rows])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_ = A.indptr, A.indices
        lp.a_matrix_.value_ = A.data
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", highs_threads(threads))
        h.setOptionValue("random_seed", seed)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 0.999)    # integer objective: within 1 is optimal
        h.setOptionValue("time_limit", max(float(time_limit_s), 0.1))
        h.passModel(lp)
        # no start from the hint: HiGHS 1.16 given one via setSolution reported a lower
        # objective than the column values it returned (seen on hetero-mixed-n12)
        h.run()
        st = h.getModelStatus()
        if st == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None, math.inf
        info = h.getInfo()
        if info.primal_solution_status != 2:      # no feasible solution
            return "unknown", None, math.inf
        vals = [int(round(x)) for x in h.getSolution().col_value]
        bound = float(info.mip_dual_bound)
        return ("optimal" if st == highspy.HighsModelStatus.kOptimal else "feasible"), vals, \
            bound


def undominated(configs: Sequence[GpuConfig], uses_power: bool) -> list[GpuConfig]:
    """The configurations no other configuration of the same type dominates: one with at least
    the capacity, Amax and max rank (and, when power enters the model, no more predicted power
    at any load up to the dominated one's capacity) can replace it in any solution at no worse
    objective (same type: same price and availability)."""
    def dominates(a: GpuConfig, b: GpuConfig) -> bool:
        if a.gpu_type != b.gpu_type or a.capacity_tps < b.capacity_tps or a.amax < b.amax \
                or a.max_rank < b.max_rank:
            return False
        if uses_power and (a.power_w(0) > b.power_w(0)
                           or a.power_w(b.capacity_tps) > b.power_w(b.capacity_tps)):
            return False
        return True

    out = []
    for j, b in enumerate(configs):
        if not any(dominates(a, b) and (a != b or k < j) for k, a in enumerate(configs)
                   if k != j):
            out.append(b)
    return out


def _solve_model(inst: Instance, configs: Sequence[GpuConfig], kind: str, time_limit_s: float,
                 hint: Sequence[Bin] | None, threads: int, solver: str = "cpsat"
                 ) -> tuple[list[Bin] | None, bool, float]:
    """(bins, proven: optimal or infeasible, best bound in objective units) of the template
    model (module docstring) solved by ``solver`` (cpsat or milp = HiGHS)."""
    configs = undominated(configs, kind == "energy" or inst.power_budget_w is not None)
    ads = inst.adapters
    loads_f = [inst.load_tps(a) for a in ads]
    order = sorted(range(len(ads)), key=lambda i: (-loads_f[i], ads[i].id))
    load = [math.ceil(loads_f[i]) for i in order]
    rank = [ads[i].rank for i in order]
    n = len(ads)
    K = min(inst.total_gpus_available, n)
    C = len(configs)
    cap = [int(math.floor(c.capacity_tps)) for c in configs]
    idle = [int(round(c.idle_fit_w / POWER_UNIT_W)) for c in configs]
    # slope in 0.1 mW per tok/s (>= ~100 on the catalog GPUs) rounds to an integer
    slope = [int(round(c.w_per_tps / POWER_UNIT_W)) for c in configs]
    m = _Model()
    y = [[m.var(0, 1) for _ in range(C)] for _ in range(K)]
    x = [[m.var(0, 1) if k <= i else None for k in range(K)] for i in range(n)]
    used = [m.var(0, 1) for _ in range(K)]
    for k in range(K):
        m.row([(y[k][c], 1) for c in range(C)] + [(used[k], -1)], 0, 0)
        if k + 1 < K:
            m.row([(used[k], 1), (used[k + 1], -1)], 0, math.inf)
        members = [x[i][k] for i in range(n) if x[i][k] is not None]
        m.row([(j, 1) for j in members] + [(used[k], -1)], 0, math.inf)
        m.row([(x[i][k], load[i]) for i in range(n) if x[i][k] is not None]
              + [(y[k][c], -cap[c]) for c in range(C)], -math.inf, 0)
        m.row([(j, 1) for j in members] + [(y[k][c], -configs[c].amax) for c in range(C)],
              -math.inf, 0)
        for i in range(n):
            if x[i][k] is not None:
                m.row([(x[i][k], 1)] + [(y[k][c], -1) for c in range(C)
                                        if configs[c].max_rank >= rank[i]], -math.inf, 0)
    for i in range(n):
        m.row([(v, 1) for v in x[i] if v is not None], 1, 1)
    # redundant aggregates (the fleet's capacity and slots cover the demand): they tighten the
    # linear relaxation both solvers bound with
    m.row([(y[k][c], cap[c]) for k in range(K) for c in range(C)], sum(load), math.inf)
    m.row([(y[k][c], configs[c].amax) for k in range(K) for c in range(C)], n, math.inf)
    for t in inst.gpu_types:
        idx = [c for c in range(C) if configs[c].gpu_type == t.name]
        m.row([(y[k][c], 1) for k in range(K) for c in idx], 0, t.count)
    power: list[tuple[int, int]] = []
    lv: list[list[int]] = []
    if kind == "energy" or inst.power_budget_w is not None:
        for k in range(K):
            lk = [m.var(0, cap[c]) for c in range(C)]
            lv.append(lk)
            for c in range(C):
                m.row([(lk[c], 1), (y[k][c], -cap[c])], -math.inf, 0)
            m.row([(j, 1) for j in lk] + [(x[i][k], -load[i]) for i in range(n)
                                          if x[i][k] is not None], 0, 0)
            power += [(y[k][c], idle[c]) for c in range(C)]
            power += [(lk[c], slope[c]) for c in range(C)]
        if inst.power_budget_w is not None:
            m.row(power, -math.inf, math.floor(inst.power_budget_w / POWER_UNIT_W))
    if kind == "cost":
        m.obj = [(y[k][c], int(round(configs[c].price_per_hour * 100)))
                 for k in range(K) for c in range(C)]
    elif kind == "energy":
        m.obj = power
    else:
        m.obj = [(u, 1) for u in used]
    if hint:
        pos = {i: p for p, i in enumerate(order)}
        cidx = {id(c): j for j, c in enumerate(configs)}
        hb = sorted(hint, key=lambda b: min(pos[i] for i in b.items))
        slot_of = {pos[i]: k for k, b in enumerate(hb) for i in b.items}
        if len(hb) <= K and all(slot_of[p] <= p for p in slot_of):
            for k in range(K):
                cj = cidx.get(id(hb[k].config)) if k < len(hb) else None
                for c in range(C):
                    m.hint[y[k][c]] = int(c == cj)
                m.hint[used[k]] = int(k < len(hb))
                if lv:
                    kl = sum(load[p] for p in slot_of if slot_of[p] == k)
                    for c in range(C):
                        m.hint[lv[k][c]] = kl if c == cj else 0
            for p in range(n):
                for k in range(K):
                    if x[p][k] is not None:
                        m.hint[x[p][k]] = int(slot_of[p] == k)
    run = m.solve_cpsat if solver == "cpsat" else m.solve_highs
    status, vals, bound = run(time_limit_s, threads, int(inst.seed) % (2**31))
    if vals is None:
        return None, status == "infeasible", math.inf
    bins = []
    for k in range(K):
        if not vals[used[k]]:
            continue
        c = next(c for c in range(C) if vals[y[k][c]])
        items = tuple(order[p] for p in range(n) if x[p][k] is not None and vals[x[p][k]])
        bins.append(Bin(configs[c], items))
    bound = bound / 100 if kind == "cost" else (bound * POWER_UNIT_W * 3600 if kind == "energy"
                                                else bound)
    return bins, status == "optimal", float(bound)


def solve_templates(inst: Instance, kind: str, time_limit_s: float | None, verify: bool,
                    duration_s: float | None, workers: int | None, threads: int | None = None,
                    method: str = "cpsat", solver: str = "cpsat") -> Placement:
    """CP-SAT over the configuration index with the twin loop (module docstring); the whole run
    (index, searches, replays) stays within ``time_limit_s`` (default: the instance's, else 60)
    apart from a first measurement of the index."""
    from ..verify import verify as twin_verify
    from .loop import integer_amax_rescue
    configs = config_index(inst, workers=workers, duration_s=duration_s)
    t0 = time.perf_counter()
    limit = time_limit_s or inst.solver.time_limit_s or 60.0
    notes = [n for n in (derived_note(inst),) if n]
    changes: list[str] = []
    p = None
    for _ in range(MAX_TWIN_ROUNDS + 1):
        hint, _ = best_plan(inst, configs, kind)
        left = limit - (time.perf_counter() - t0)
        bins, proven, bound = _solve_model(inst, configs, kind, left, hint, threads or 2,
                                           solver)
        if bins is None:
            status = "infeasible" if proven else "failed"
            return Placement(inst.name, method, status, wall_time_s=time.perf_counter() - t0,
                             notes=tuple(notes + ["no placement within the availability caps"
                                                  + (" and power budget" if
                                                     inst.power_budget_w is not None else "")
                                                  + (" exists in the configuration model"
                                                     if proven else " found in the limit")]),
                             repairs=tuple(changes))
        loads = [inst.load_tps(a) for a in inst.adapters]
        # equal-objective ties (e.g. caps at the same price): the lowest-power configuration
        avail = {t.name: t.count for t in inst.gpu_types}
        tied = refit(bins, configs, inst.adapters, loads, avail, kind)
        if plan_value(kind, tied, loads) <= plan_value(kind, bins, loads) and (
                inst.power_budget_w is None or plan_power(tied, loads) <= inst.power_budget_w):
            bins = tied
        value = plan_value(kind, bins, loads)
        claim = ("optimal for the configuration model (twin-measured capacity per (type, cap, "
                 "Amax, rank)" + (", linear power lines" if kind == "energy" or
                                  inst.power_budget_w is not None else "") + ")")
        p = Placement(inst.name, method, "optimal" if proven else "solved",
                      to_placement(inst, bins, method), best_bound=bound,
                      notes=tuple(notes), repairs=tuple(changes),
                      params={"configurations": len(configs), "proven": proven,
                              "model_value": value,
                              # >= 0 up to the model's rounding of loads and power
                              "gap": max(value - bound, 0.0) / value if value > 0 else 0.0,
                              "solve_wall_s": time.perf_counter() - t0,
                              **({"claim": claim} if proven else {})})
        if not verify:
            break
        p = twin_verify(p, inst, duration_s=duration_s, workers=workers)
        if p.verdict != "accepted" and kind != "energy" and inst.power_budget_w is None:
            # a configuration's Amax is a grid value; the twin may accept the GPU at another
            # integer (the GPU count and price do not depend on it; power does)
            p, _ = integer_amax_rescue(inst, p, duration_s, workers, t0 + limit)
        if p.verdict == "accepted":
            break
        configs, cut = derate_rejected(configs, p)
        if not cut or time.perf_counter() - t0 > limit:
            break
        changes += cut
    return p.with_(wall_time_s=time.perf_counter() - t0, repairs=tuple(changes))


__all__ = ["solve_templates"]
