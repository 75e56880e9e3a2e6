"""Method registry and the one entry point that runs a method on an instance.

A method is a function ``fn(instance, objective, options) -> Placement`` registered under a name
with ``register_method``. ``solve`` runs the infeasibility pre-checks, the method (timed),
scores the result with the objective, and optionally verifies it in the twin. The built-in
methods (the baselines, ``greedy``, ``milp``, ``cpsat`` and ``auto``) are registered here, in one
place, the first time the registry is asked (``_load_builtin``); a new method plugs in the same
way::

    from optim.methods import register_method
    register_method("mine", my_fn, objectives=("gpus", "cost"), description="...")

Replication. An instance's ``max_homes`` k (``--max-homes``) lets the methods registered with
``max_homes=True`` (greedy, milp, cpsat, auto) route one adapter to up to k GPUs with weights
(``GpuPlan.adapters`` shares summing to 1); ``solve`` then pre-checks that no adapter offers
more than k GPUs' limit (naming it) and lists every split adapter's homes and weights in a note.
Other methods ignore it (a note says so).
"""

from __future__ import annotations

import time
from dataclasses import replace

from .feasibility import precheck
from .feasibility_report import FeasibilityReport, Reason
from .instance import Instance
from .objectives import Objective, make_objective
from .placement import Placement
from .registry import (_REGISTRY, MethodFn, MethodInfo, MethodOptions,  # noqa: F401
                       register_method)
from .verify import verify as twin_verify

_BUILTIN_LOADED = False


def get_method(name: str) -> MethodInfo:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown method '{name}' (registered: {', '.join(method_names())})")
    return _REGISTRY[name]


def method_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    """Register the built-in methods, once: the one place that lists them."""
    global _BUILTIN_LOADED
    if _BUILTIN_LOADED:
        return
    from .baselines import dlora, loraserve, maxbase, maxbase_half, random_placement
    from .exact.methods import auto, exact_method
    from .greedy import greedy
    builtin = [
        ("maxbase", maxbase, dict(objectives=("gpus", "cost"),
                                  description="first fit to the backbone max throughput, Amax = N")),
        ("maxbase-half", maxbase_half, dict(objectives=("gpus", "cost"),
                                            description="MaxBase with Amax = ceil(N/2)")),
        ("random", random_placement, dict(objectives=("gpus", "cost", "latency"), fixed_fleet=True,
                                          description="uniform GPU per adapter, Amax uniform in "
                                                      "[1, N]")),
        ("dlora", dlora, dict(objectives=("gpus", "cost", "latency"), fixed_fleet=True,
                              splits=True,
                              description="dLoRA proactive replication, uniform request split")),
        ("loraserve", loraserve, dict(objectives=("gpus", "cost", "latency"), fixed_fleet=True,
                                      splits=True,
                                      description="rank-aware GPU budgets, fractional packing")),
        ("milp", exact_method("milp", "milp"), dict(
            objectives=("gpus", "cost", "latency", "energy"), max_homes=True,
            description="exact MILP (Pyomo + HiGHS), twin in the loop")),
        ("cpsat", exact_method("cpsat", "cpsat"), dict(
            objectives=("gpus", "cost", "latency", "energy"), max_homes=True,
            description="exact CP-SAT (OR-Tools), twin in the loop")),
        ("auto", auto, dict(objectives=("gpus", "cost", "latency", "energy"), max_homes=True,
                            description="cpsat on small instances, else greedy")),
        ("greedy", greedy, dict(objectives=("gpus", "cost", "energy"), repairs=True,
                                max_homes=True,
                                description="Maxpack first-fit decreasing with fast-surrogate "
                                            "testing points; twin repair with --verify")),
    ]
    for name, fn, kw in builtin:
        if name not in _REGISTRY:          # a user's registration of the name is kept
            register_method(name, fn, **kw)
    _BUILTIN_LOADED = True


def solve(inst: Instance, method: str, objective: str | Objective | None = None,
          options: MethodOptions | None = None, verify: bool = False,
          duration_s: float | None = None, workers: int | None = None) -> Placement:
    """Pre-check, run ``method``, score, and (with ``verify``) replay the placement in the twin;
    a twin-accepted placement then gets each GPU's best integer Amax in the twin
    (``optim.amax_tuning``; option ``tune_amax``, default on: studies that count GPUs turn it
    off, the count does not change)."""
    info = get_method(method)
    obj = objective if objective is not None and not isinstance(objective, str) \
        else make_objective(inst, objective)
    options = options or MethodOptions()
    # methods that verify inside their search (exact, twin in the loop) read these
    options = replace(options, extra={"verify": verify, "duration_s": duration_s,
                                      "workers": workers, **options.extra})
    replicate = info.max_homes and inst.max_homes > 1
    report = precheck(inst, allow_split=info.splits or replicate)
    if replicate:
        report = homes_check(inst, report)
    if not report.feasible:
        return Placement(inst.name, method, "infeasible", objective=obj.name,
                         feasibility=report, notes=("pre-check proved the instance infeasible",))
    if verify and info.repairs:   # the method verifies in the twin itself and repairs
        extra = {"repair": True, **options.extra}
        if duration_s is not None:
            extra.setdefault("duration_s", duration_s)
        options = MethodOptions(options.n_gpus, options.seed, options.time_limit_s, extra)
    t0 = time.perf_counter()
    p = info.fn(inst, obj, options)
    wall = time.perf_counter() - t0
    p = p.with_(wall_time_s=wall, objective=obj.name, feasibility=report)
    if obj.name not in info.objectives:
        p = p.with_(notes=p.notes + (f"method '{method}' does not target objective "
                                     f"'{obj.name}'; the value is reported only",))
    if inst.max_homes > 1 and not info.max_homes and not info.splits:
        p = p.with_(notes=p.notes + (f"method '{method}' places each adapter on one GPU; "
                                     f"max_homes {inst.max_homes} is ignored",))
    if verify and p.gpus and p.verdict is None:
        p = twin_verify(p, inst, duration_s=duration_s, workers=workers)
    if verify and p.verdict == "accepted" and options.extra.get("tune_amax", True) \
            and not any(t.constant_capacity for t in inst.gpu_types):
        from twin.cli_support import Interrupted

        from .amax_tuning import tune_amax       # constant-capacity types: no twin to ask
        try:
            p = tune_amax(inst, p, duration_s, workers)
        except KeyboardInterrupt as e:           # Ctrl-C: the accepted placement, untuned
            raise Interrupted(agree_claim(p), "max_loras tuning interrupted") from e
    line = homes_line(p)
    if line:
        p = p.with_(notes=p.notes + (line,))
    return agree_claim(p).with_(objective_value=obj.value(p) if p.gpus else None)


def agree_claim(p: Placement) -> Placement:
    """``p`` with status, printed claim and JSON in agreement: a twin-accepted GPU-count answer
    that meets its twin-sound lower bound (``params.lower_bound``) is ``optimal`` with
    ``params.claim`` = "optimal in the twin"; an ``optimal`` status without any claim falls back
    to ``solved``."""
    from .feasibility import TWIN_OPTIMAL
    lb = p.params.get("lower_bound")
    if (p.objective == "gpus" and p.verdict == "accepted" and p.gpus and lb is not None
            and p.n_gpus == lb):
        return p.with_(status="optimal", params={**p.params, "claim": TWIN_OPTIMAL})
    if p.status == "optimal" and not p.params.get("claim"):
        return p.with_(status="solved")
    return p


def homes_check(inst: Instance, report: FeasibilityReport) -> FeasibilityReport:
    """``report`` plus an ``adapter_overload`` reason naming every adapter that offers more than
    ``inst.max_homes`` GPUs can carry (k x the best single-GPU limit of the report, capacity /
    threshold: necessary, like the other pre-checks)."""
    k = inst.max_homes
    limit = max(report.capacity_tps.values()) / inst.starvation_threshold
    heavy = [a for a in inst.adapters if inst.load_tps(a) > k * limit]
    if not heavy:
        return report
    worst = max(heavy, key=inst.load_tps)
    ids = [a.id for a in heavy]
    msg = (f"{len(heavy)} adapter(s) offer more than max_homes={k} GPUs can serve "
           f"({k} x {limit:.0f} tok/s = capacity / threshold); largest: '{worst.id}' with "
           f"{inst.load_tps(worst):.0f} tok/s: {', '.join(ids[:5])}"
           + (f" (+{len(ids) - 5} more)" if len(ids) > 5 else ""))
    return replace(report, reasons=report.reasons + (Reason("adapter_overload", msg,
                                                            tuple(ids)),))


def adapter_homes(p: Placement) -> dict[str, list[tuple[int, float]]]:
    """Adapter id -> [(GPU index, routing weight), ...] over the GPUs that serve it."""
    out: dict[str, list[tuple[int, float]]] = {}
    for g, plan in enumerate(p.gpus):
        for a, s in plan.adapters:
            out.setdefault(a.id, []).append((g, s))
    return out


def homes_line(p: Placement, max_listed: int = 8) -> str | None:
    """``homes of N split adapter(s): hot -> gpu0 0.333, gpu1 0.333, gpu2 0.334; ...`` (the
    adapters routed to several GPUs with their weights; the JSON has all), None without any."""
    split = {a: hs for a, hs in adapter_homes(p).items() if len(hs) > 1}
    if not split:
        return None
    parts = [f"{a} -> " + ", ".join(f"gpu{g} {s:.3f}" for g, s in hs)
             for a, hs in list(split.items())[:max_listed]]
    more = f"; (+{len(split) - max_listed} more in the JSON)" if len(split) > max_listed else ""
    return f"homes of {len(split)} split adapter(s): " + "; ".join(parts) + more
