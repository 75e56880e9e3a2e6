"""The exact methods ``milp``, ``cpsat`` and ``auto`` as registry entries (``optim.methods``
registers them with the other built-ins).

``auto`` runs CP-SAT (exact, twin in the loop) on small instances — at most
``AUTO_MAX_ADAPTERS`` adapters and ``AUTO_MAX_GPUS`` GPUs in the pool — and greedy beyond.

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
from ..registry import MethodOptions
from ..placement import Placement
from .loop import solve_exact

AUTO_MAX_ADAPTERS = 64
AUTO_MAX_GPUS = 16


def exact_method(solver: str, name: str):
    """The registry function of an exact method: ``solver`` (``milp`` / ``cpsat``) reported as
    ``name``."""
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
    """CP-SAT on a small instance, greedy (with its twin repair when verifying) beyond."""
    small = len(inst.adapters) <= AUTO_MAX_ADAPTERS and inst.total_gpus_available <= AUTO_MAX_GPUS
    if small:
        p = exact_method("cpsat", "auto")(inst, objective, options)
        return p.with_(notes=p.notes + ("auto: exact (cpsat) for a small instance",))
    from ..greedy import greedy
    if options.extra.get("verify"):   # as optim.methods.solve asks greedy: twin repair
        options = MethodOptions(options.n_gpus, options.seed, options.time_limit_s,
                                {"repair": True, **options.extra})
    p = greedy(inst, objective, options)
    return p.with_(method="auto", notes=p.notes + (f"auto: heuristic 'greedy' beyond "
                                                   f"{AUTO_MAX_ADAPTERS} adapters / "
                                                   f"{AUTO_MAX_GPUS} GPUs",))
