"""Exact placement over (GPU type, power cap, Amax, max rank) configurations: a CP-SAT model with
a configuration index per GPU slot, in the spirit of serving templates.

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
  first.

The search starts from the greedy plan (``optim.config_greedy``) as a hint. *Optimal* means
proven for this model: the twin-measured configuration capacities and the linear power lines;
the twin then replays the placement (each GPU with its own profile and cap); a GPU it rejects
cuts its configuration's capacity below the load it failed at and the model is solved again.
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

POWER_UNIT_W = 1e-4        # 0.1 mW


def _solve_model(inst: Instance, configs: Sequence[GpuConfig], kind: str, time_limit_s: float,
                 hint: Sequence[Bin] | None, threads: int) -> tuple[list[Bin] | None, bool, float]:
    """(bins, proven optimal, best bound in objective units) of the template model."""
    from ortools.sat.python import cp_model

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
    slope = [c.w_per_tps / POWER_UNIT_W for c in configs]
    m = cp_model.CpModel()
    y = [[m.NewBoolVar(f"y{k}_{c}") for c in range(C)] for k in range(K)]
    x = [[m.NewBoolVar(f"x{i}_{k}") if k <= i else None for k in range(K)] for i in range(n)]
    used = [m.NewBoolVar(f"u{k}") for k in range(K)]
    for k in range(K):
        m.Add(sum(y[k]) == used[k])
        if k + 1 < K:
            m.Add(used[k] >= used[k + 1])
        members = [x[i][k] for i in range(n) if x[i][k] is not None]
        m.Add(sum(members) >= used[k])
        m.Add(sum(load[i] * x[i][k] for i in range(n) if x[i][k] is not None)
              <= sum(cap[c] * y[k][c] for c in range(C)))
        m.Add(sum(members) <= sum(configs[c].amax * y[k][c] for c in range(C)))
        for i in range(n):
            if x[i][k] is None:
                continue
            ok = [y[k][c] for c in range(C) if configs[c].max_rank >= rank[i]]
            m.Add(x[i][k] <= sum(ok))
    for i in range(n):
        m.AddExactlyOne([v for v in x[i] if v is not None])
    for t in inst.gpu_types:
        idx = [c for c in range(C) if configs[c].gpu_type == t.name]
        m.Add(sum(y[k][c] for k in range(K) for c in idx) <= t.count)
    need_power = kind == "energy" or inst.power_budget_w is not None
    power_terms = []
    if need_power:
        # slope in 0.1 mW per tok/s is large enough (>= ~100) to round to an integer
        for k in range(K):
            slot_load = sum(load[i] * x[i][k] for i in range(n) if x[i][k] is not None)
            lv = [m.NewIntVar(0, cap[c], f"l{k}_{c}") for c in range(C)]
            for c in range(C):
                m.Add(lv[c] <= cap[c] * y[k][c])
            m.Add(sum(lv) == slot_load)
            power_terms += [idle[c] * y[k][c] + int(round(slope[c])) * lv[c] for c in range(C)]
        if inst.power_budget_w is not None:
            m.Add(sum(power_terms) <= int(math.floor(inst.power_budget_w / POWER_UNIT_W)))
    if kind == "cost":
        m.Minimize(sum(int(round(configs[c].price_per_hour * 100)) * y[k][c]
                       for k in range(K) for c in range(C)))
    elif kind == "energy":
        m.Minimize(sum(power_terms))
    else:
        m.Minimize(sum(used))
    if hint:
        pos = {i: p for p, i in enumerate(order)}
        cidx = {id(c): j for j, c in enumerate(configs)}
        hb = sorted(hint, key=lambda b: min(pos[i] for i in b.items))
        slot_of = {}
        for k, b in enumerate(hb):
            for i in b.items:
                slot_of[pos[i]] = k
        if len(hb) <= K and all(slot_of[p] <= p for p in slot_of):
            for k in range(K):
                cj = cidx.get(id(hb[k].config)) if k < len(hb) else None
                for c in range(C):
                    m.AddHint(y[k][c], 1 if c == cj else 0)
                m.AddHint(used[k], 1 if k < len(hb) else 0)
            for p in range(n):
                for k in range(K):
                    if x[p][k] is not None:
                        m.AddHint(x[p][k], 1 if slot_of[p] == k else 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit_s), 0.1)
    solver.parameters.num_workers = max(int(threads), 1)
    solver.parameters.random_seed = int(inst.seed) % (2**31)
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, st == cp_model.INFEASIBLE, math.inf
    bins = []
    for k in range(K):
        if not solver.Value(used[k]):
            continue
        c = next(c for c in range(C) if solver.Value(y[k][c]))
        items = tuple(order[p] for p in range(n) if x[p][k] is not None
                      and solver.Value(x[p][k]))
        bins.append(Bin(configs[c], items))
    bound = solver.BestObjectiveBound()
    bound = bound / 100 if kind == "cost" else (bound * POWER_UNIT_W * 3600 if kind == "energy"
                                                else bound)
    return bins, st == cp_model.OPTIMAL, float(bound)


def solve_templates(inst: Instance, kind: str, time_limit_s: float | None, verify: bool,
                    duration_s: float | None, workers: int | None, threads: int | None = None,
                    method: str = "cpsat") -> Placement:
    """CP-SAT over the configuration index with the twin loop (module docstring); the whole run
    (index, searches, replays) stays within ``time_limit_s`` (default: the instance's, else 60)
    apart from a first measurement of the index."""
    from ..verify import verify as twin_verify
    configs = config_index(inst, workers=workers)
    t0 = time.perf_counter()
    limit = time_limit_s or inst.solver.time_limit_s or 60.0
    notes = [n for n in (derived_note(inst),) if n]
    changes: list[str] = []
    p = None
    for _ in range(MAX_TWIN_ROUNDS + 1):
        hint, _ = best_plan(inst, configs, kind)
        left = limit - (time.perf_counter() - t0)
        bins, proven, bound = _solve_model(inst, configs, kind, left, hint, threads or 2)
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
                              "gap": (value - bound) / value if value > 0 else 0.0,
                              "solve_wall_s": time.perf_counter() - t0,
                              **({"claim": claim} if proven else {})})
        if not verify:
            break
        p = twin_verify(p, inst, duration_s=duration_s, workers=workers)
        if p.verdict == "accepted":
            break
        configs, cut = derate_rejected(configs, p)
        if not cut or time.perf_counter() - t0 > limit:
            break
        changes += cut
    return p.with_(wall_time_s=time.perf_counter() - t0, repairs=tuple(changes))


__all__ = ["solve_templates"]
