"""Twin in the loop: solve exactly, replay the placement in the fleet twin, cut, re-solve.

``solve_exact(inst, objective, solver=...)``:

1. builds the ``PackingProblem`` (``capacity.build_problem``) and checks that every adapter
   fits some configuration (else: ``infeasible`` with the adapters named);
2. takes a warm start from the best available heuristic (``greedy`` when registered, else
   ``maxbase``) when it satisfies the model (optional: ``warm_start=False``);
3. solves (MILP or CP-SAT) within the time limit;
4. with ``verify``, replays every GPU in the fleet twin (``optim.verify``, window
   ``duration_s``, default the instance's); for every GPU that starves or fails memory it cuts
   and re-solves — until the twin accepts, the iteration limit
   (``instance.solver.max_repair_iterations``, default 30) or the time limit is reached. Every
   iteration is reported in ``params``. Cuts (``cut_mode``):

   * ``"capacity"`` (default): the rejected adapter set is also replayed under every other
     (rank, Amax) configuration the model admits it with, and each configuration the twin
     rejects gets a ``CapacityCut`` — its capacity pieces are lowered below the set's load from
     the set's adapter count on (``problem`` module docstring). One iteration thus corrects the
     surrogate wherever the twin disagrees with it for that set, instead of trying Amax values
     one solve at a time;
   * ``"exact"`` / ``"superset"``: a ``Cut`` forbidding that adapter set (or any superset of it)
     on any GPU of that type with that (rank, Amax).

The returned ``Placement`` has status ``optimal`` (proven optimal for the model with the cuts
added so far), ``solved`` (feasible, with ``best_bound``), ``infeasible`` or ``failed``; its
``params`` hold the solver status, objective, bound, gap, solve time, iterations, cuts, the
bounds and where the capacity model came from.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from ..instance import Instance
from ..placement import GpuMetrics, Placement, plan_gpu
from .bounds import infeasible_adapters, lower_bounds
from .capacity import build_problem
from .common import SolveResult
from .problem import LOAD_SCALE, CapacityCut, Cut, PackingProblem, scale_load

DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_MAX_ITERATIONS = 30
CUT_MODES = ("capacity", "exact", "superset")


def heuristic_solution(inst: Instance, objective, P: PackingProblem
                       ) -> tuple[str | None, list[tuple[int, list[int]]] | None]:
    """(method name, solution as (type index, adapter indices) per GPU) from the best available
    heuristic: ``greedy`` when registered, else ``maxbase``; ``None`` when it splits adapters
    or fails."""
    from ..methods import MethodOptions, get_method, method_names
    name = "greedy" if "greedy" in method_names() else "maxbase"
    try:
        p = get_method(name).fn(inst, objective, MethodOptions(seed=inst.seed))
    except Exception:       # a heuristic failing must not stop the exact method
        return name, None
    if not p.gpus:
        return name, None
    idx = {a: i for i, a in enumerate(P.ids)}
    tix = {t.name: k for k, t in enumerate(P.types)}
    out = []
    for g in p.gpus:
        if any(s < 1 - 1e-9 for _, s in g.adapters) or g.gpu_type not in tix:
            return name, None
        out.append((tix[g.gpu_type], [idx[a.id] for a, _ in g.adapters]))
    return name, out


def _preferred_config(P: PackingProblem, t: int, p: int, items: Sequence[int]) -> int:
    """Among the configurations admitting the GPU, keep the solver's choice for latency; for
    gpus/cost prefer the smallest rank class, then the most load slack (objective unchanged)."""
    if P.objective == "latency":
        return p
    ps = P.configs_admitting(t, items)
    if not ps:
        return p
    cf = P.types[t].configs
    return min(ps, key=lambda q: (cf[q].rank, -cf[q].cap, cf[q].amax))


def to_placement(inst: Instance, P: PackingProblem, r: SolveResult, method: str) -> Placement:
    """A ``Placement`` from a solve result (predicted metrics from the configuration)."""
    plans = []
    for t, p, items in sorted(r.gpus, key=lambda g: (g[0], min(g[2]))):
        p = _preferred_config(P, t, p, items)
        c = P.types[t].configs[p]
        gt = inst.gpu_types[t]
        pairs = [(inst.adapters[i], 1.0) for i in items]
        offered = sum(inst.load_tps(inst.adapters[i]) for i in items)
        pred = GpuMetrics(offered, min(offered, c.cap / 1000.0), False, False, c.itl_ms)
        plans.append(plan_gpu(gt.name, gt.profile, c.amax, pairs, inst.mean_tokens,
                              max_lora_rank=c.rank, predicted=pred))
    status = {"optimal": "optimal", "feasible": "solved", "infeasible": "infeasible"}.get(
        r.status, "failed")
    return Placement(inst.name, method, status, tuple(plans), best_bound=r.bound)


def capacity_cuts(inst: Instance, P: PackingProblem,
                  rejected: Sequence[tuple[int, int, int, Sequence[int], float | None]],
                  duration_s: float | None, workers: int | None) -> list[CapacityCut]:
    """Capacity cuts for GPUs the twin rejected, given as (type index, rank, Amax, adapters,
    twin throughput or None): the rejected configuration, plus every other (rank, Amax)
    configuration admitting the set that the twin also rejects (all replays in parallel)."""
    from twin.fleet import simulate_fleet

    from ..placement import plan_gpu
    theta = inst.starvation_threshold
    out: list[CapacityCut] = []
    probes: list[tuple[int, int, int, Sequence[int]]] = []
    for t, rank, amax, items, served in rejected:
        out.append(_cut_for(P, t, rank, amax, items, served, theta))
        cf = P.types[t].configs
        seen = {(rank, amax)}
        for p in P.configs_admitting(t, items):
            key = (cf[p].rank, cf[p].amax)
            if key not in seen:
                seen.add(key)
                probes.append((t, *key, items))
    if not probes:
        return out
    jobs = []
    for t, rank, amax, items in probes:
        gt = inst.gpu_types[t]
        plan = plan_gpu(gt.name, gt.profile, amax, [(inst.adapters[i], 1.0) for i in items],
                        inst.mean_tokens, max_lora_rank=rank)
        jobs.append(plan.twin_assignment(theta))
    res = simulate_fleet(jobs, duration_s=float(duration_s or inst.duration_s),
                         lengths=inst.lengths, seed=inst.seed, workers=workers,
                         check_routing=False)
    for (t, rank, amax, items), m in zip(probes, res.per_gpu):
        if m.starved or m.memory_error:
            out.append(_cut_for(P, t, rank, amax, items,
                                0.0 if m.memory_error else m.throughput_tps, theta))
    return out


def _cut_for(P: PackingProblem, t: int, rank: int, amax: int, items: Sequence[int],
             served_tps: float | None, theta: float) -> CapacityCut:
    """The cut at ``L_cut = min(L*, T*/theta)`` (``problem`` module docstring)."""
    load = sum(P.loads[i] for i in items)
    if served_tps is not None:
        load = min(load, scale_load(served_tps / theta))
    return CapacityCut(t, rank, amax, sum(P.xs[i] for i in items), load)


def solve_exact(inst: Instance, objective=None, solver: str = "milp",
                time_limit_s: float | None = None, threads: int | None = None,
                warm_start: bool = True, verify: bool = True, duration_s: float | None = None,
                workers: int | None = None, max_iterations: int | None = None,
                cut_mode: str = "capacity", models: dict[str, Any] | None = None,
                problem: PackingProblem | None = None, bounds: bool = True,
                method_name: str | None = None) -> Placement:
    """Exact placement with the twin in the loop (module docstring)."""
    from ..objectives import make_objective
    from ..verify import verify as twin_verify
    from .cpsat import solve_cpsat
    from .milp import solve_milp

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
    P = problem or build_problem(inst, obj.name, getattr(obj, "gpu_budget", None), models=models)
    sources = sorted({t.source for t in P.types})
    bad = infeasible_adapters(P)
    params: dict[str, Any] = {"solver": solver, "capacity_source": sources,
                              "time_limit_s": tl, "cut_mode": cut_mode}
    if bad:
        ids = [P.ids[i] for i in bad]
        return Placement(inst.name, method, "infeasible", objective=obj.name, params=params,
                         notes=(f"{len(bad)} adapter(s) fit no configuration of any GPU type "
                                f"(rank, load or memory): {', '.join(ids[:5])}",))
    if bounds:
        b = lower_bounds(P, lp=True, time_limit_s=min(10.0, tl), threads=threads)
        params["bounds"] = b.to_dict()
    start = None
    if warm_start:
        hname, start = heuristic_solution(inst, obj, P)
        params["warm_start_method"] = hname
    iterations = []
    cuts: list[Cut] = []
    cap_cuts: list[CapacityCut] = []
    tix = {t.name: k for k, t in enumerate(P.types)}
    idx = {a: i for i, a in enumerate(P.ids)}
    placement = None
    r = None
    for it in range(max_it + 1):
        left = tl - (time.perf_counter() - t_start)
        if left <= 0.5 and r is not None:
            break
        Pc = P.with_cuts(cuts).with_capacity_cuts(cap_cuts)
        fn = solve_milp if solver == "milp" else solve_cpsat
        r = fn(Pc, time_limit_s=max(1.0, left), threads=threads, warm_start=start)
        rec = {"iteration": it, "status": r.status, "objective": r.objective, "bound": r.bound,
               "gap": r.gap, "solve_time_s": round(r.solve_time_s, 3),
               "warm_start_used": r.warm_start_used, "cuts": len(cuts) + len(cap_cuts),
               "termination": r.details.get("termination")}
        if r.status in ("infeasible", "unknown"):
            iterations.append(rec)
            placement = to_placement(inst, Pc, r, method)
            break
        placement = to_placement(inst, Pc, r, method)
        if not verify:
            iterations.append(rec)
            break
        placement = twin_verify(placement, inst, duration_s=duration_s, workers=workers)
        rec["verdict"] = placement.verdict
        bad_gpus = [g for g in placement.gpus if g.verified is not None and not g.verified.ok]
        rec["rejected_gpus"] = len(bad_gpus)
        iterations.append(rec)
        if placement.verdict == "accepted":
            break
        if cut_mode == "capacity":
            new = capacity_cuts(inst, Pc, [(tix[g.gpu_type], g.max_lora_rank, g.max_loras,
                                            [idx[a.id] for a, _ in g.adapters],
                                            0.0 if g.verified.memory_error
                                            else g.verified.throughput_tps)
                                           for g in bad_gpus], duration_s, workers)
            cap_cuts += new
            rec["new_cuts"] = len(new)
        else:
            for g in bad_gpus:
                cuts.append(Cut(tix[g.gpu_type], g.max_lora_rank, g.max_loras,
                                frozenset(idx[a.id] for a, _ in g.adapters),
                                superset=cut_mode == "superset"))
        start = None            # the previous solution violates the new cuts
    assert r is not None and placement is not None
    params.update({"status": r.status, "objective": r.objective, "best_bound": r.bound,
                   "gap": r.gap, "solve_time_s": sum(x["solve_time_s"] for x in iterations),
                   "iterations": iterations, "n_iterations": len(iterations),
                   "n_cuts": len(cuts) + len(cap_cuts), "threads": threads,
                   "capacity_cuts": [{"type": P.types[c.type_index].name, "rank": c.rank,
                                      "amax": c.amax, "x": c.x, "load_tps": c.load / LOAD_SCALE}
                                     for c in cap_cuts],
                   "wall_s": time.perf_counter() - t_start})
    notes = list(placement.notes)
    if r.status == "infeasible":
        notes.append("the exact model proved that no placement satisfies the capacity model"
                     + (f" and the {len(cuts) + len(cap_cuts)} twin cut(s)"
                        if cuts or cap_cuts else ""))
    if verify and placement.verdict == "rejected":
        notes.append(f"twin still rejects after {len(iterations)} iteration(s) "
                     "(iteration or time limit)")
    if any(s.startswith("provisional") for s in sources):
        notes.append("capacity model: provisional twin-measured table (no trained "
                     "surrogates/trained/<profile>/capacity.json yet)")
    return placement.with_(params=params, notes=tuple(notes), objective=obj.name)
