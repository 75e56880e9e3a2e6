"""Registers ``milp``, ``cpsat`` and ``auto`` in the method registry (``optim.methods``).

``auto`` runs CP-SAT (exact, twin in the loop) on small instances — at most
``AUTO_MAX_ADAPTERS`` adapters and ``AUTO_MAX_GPUS`` GPUs in the pool — and beyond that the best
available heuristic: ``greedy`` when registered, else ``maxbase``.

Method options (``MethodOptions.extra``): ``threads``, ``warm_start`` (bool), ``cut_mode``
(``capacity`` (default) / ``exact`` / ``superset``), ``max_iterations``, ``incumbent`` (a
``Placement`` to start from instead of running greedy; when verified and accepted it is also the
fallback answer), and the verification settings that ``optim.methods.solve`` passes down
(``verify``, ``duration_s``, ``workers``).

All three honour the instance's ``max_homes`` (replication with routing weights: the split
variables of ``problem``), except on instances with configurations (catalog GPU types, power).
"""

from __future__ import annotations

from ..instance import Instance
from ..methods import MethodOptions, get_method, method_names, register_method
from ..placement import Placement
from .loop import solve_exact

AUTO_MAX_ADAPTERS = 64
AUTO_MAX_GPUS = 16


def _run(solver: str, name: str):
    def fn(inst: Instance, objective, options: MethodOptions) -> Placement:
        ex = options.extra
        configs = inst.uses_configurations or objective.name == "energy"
        if configs and inst.max_homes > 1:
            return Placement(inst.name, name, "failed", notes=(
                f"max_homes {inst.max_homes}: replication is not supported with catalog GPU "
                "types, power caps, a power budget or the energy objective (set max_homes to 1)",))
        if configs:                                                    # template model
            from .templates import solve_templates
            return solve_templates(inst, objective.name, options.time_limit_s,
                                   ex.get("verify", False), ex.get("duration_s"),
                                   ex.get("workers"), ex.get("threads"), method=name,
                                   solver=solver)
        return solve_exact(inst, objective, solver=solver, time_limit_s=options.time_limit_s,
                           threads=ex.get("threads"), warm_start=ex.get("warm_start", True),
                           verify=ex.get("verify", False), duration_s=ex.get("duration_s"),
                           workers=ex.get("workers"), max_iterations=ex.get("max_iterations"),
                           cut_mode=ex.get("cut_mode", "capacity"), method_name=name,
                           given=ex.get("incumbent"))
    return fn


def auto(inst: Instance, objective, options: MethodOptions) -> Placement:
    small = len(inst.adapters) <= AUTO_MAX_ADAPTERS and inst.total_gpus_available <= AUTO_MAX_GPUS
    if small:
        p = _run("cpsat", "auto")(inst, objective, options)
        return p.with_(notes=p.notes + ("auto: exact (cpsat) for a small instance",))
    name = "greedy" if "greedy" in method_names() else "maxbase"
    info = get_method(name)
    if options.extra.get("verify") and info.repairs:   # as optim.methods.solve asks greedy
        options = MethodOptions(options.n_gpus, options.seed, options.time_limit_s,
                                {"repair": True, **options.extra})
    p = info.fn(inst, objective, options)
    return p.with_(method="auto", notes=p.notes + (f"auto: heuristic '{name}' beyond "
                                                   f"{AUTO_MAX_ADAPTERS} adapters / "
                                                   f"{AUTO_MAX_GPUS} GPUs",))


def register() -> None:
    from .. import methods
    if "milp" not in methods._REGISTRY:
        register_method("milp", _run("milp", "milp"),
                        objectives=("gpus", "cost", "latency", "energy"), max_homes=True,
                        description="exact MILP (Pyomo + HiGHS), twin in the loop")
        register_method("cpsat", _run("cpsat", "cpsat"),
                        objectives=("gpus", "cost", "latency", "energy"), max_homes=True,
                        description="exact CP-SAT (OR-Tools), twin in the loop")
        register_method("auto", auto, objectives=("gpus", "cost", "latency", "energy"),
                        max_homes=True,
                        description="cpsat on small instances, else greedy (or maxbase)")
