"""``python -m optim plan [ADAPTERS.csv] [--gpu H100] [--model M] [--pool TYPE=COUNT[@PRICE] ...]
[--objective gpus|cost|energy] [--method greedy] [--duration S] [--out plan/]``: the operator's
path from a CSV of adapters to a plan folder (``optim.plan``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from twin.cli_support import (EXIT_CODES_EPILOG, EXIT_INFEASIBLE, EXIT_REJECTED, CliError,
                              HelpFormatter, float_above, int_at_least, positive_int, seed_type,
                              slo_argument, slo_class_argument, SLO_HELP)
from twin.limits import MAX_DURATION_S

from .plan import (DEFAULT_DURATION_S, EXAMPLE_CSV, PlanError, PlanInputs, make_plan, parse_pool,
                   summary_lines)


def cmd_plan(a: argparse.Namespace) -> int:
    from .methods import get_method, method_names
    try:
        info = get_method(a.method)
    except KeyError as e:
        raise CliError(f"--method: {e.args[0]}") from None
    if info.fixed_fleet:
        sizing = ", ".join(n for n in method_names() if not get_method(n).fixed_fleet)
        raise CliError(f"--method {a.method}: places onto a given fleet size; plan needs a "
                       f"method that sizes the fleet ({sizing})")
    out = Path(a.out)
    try:
        from .plan import check_plan_dir
        check_plan_dir(out, a.force)
        slo = slo_argument(a.slo)
        # twin.headroom: unless --no-headroom, every GPU must pass with it
        inputs = PlanInputs(a.gpu, a.model, tuple(parse_pool(x) for x in a.pool or ()),
                            a.objective, a.duration, a.seed, a.max_homes,
                            slo.to_dict() if slo is not None else None,
                            tuple(slo_class_argument(x) for x in a.slo_class or ()),
                            not a.no_headroom)
        inst = inputs.instance(a.adapters, a.name)
        from .cli_deploy import deploy_targets
        from .deploy import DeployOptions
        targets = deploy_targets(a.target)
        import twin.fleet
        with twin.fleet.use_backend("local", None, a.workers):   # one pool for every replay
            res = make_plan(inst, out, a.method, None, a.time_limit, a.workers, a.force,
                            a.quiet, DeployOptions(targets=targets,
                                                   allow_rejected=a.allow_rejected,
                                                   headroom=not a.no_headroom),
                            tune_amax=a.tune_amax, inputs=inputs)
    except PlanError as e:
        raise CliError(str(e)) from None
    for line in summary_lines(res, out):
        print(line)
    p = res.placement
    if p.verdict == "rejected":
        return EXIT_REJECTED
    return 0 if p.status != "infeasible" else EXIT_INFEASIBLE


def add_subcommand(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "plan", help="adapters CSV in, plan folder out (placement, vLLM commands, routing, "
                     "manifests, report)",
        formatter_class=HelpFormatter, epilog=EXIT_CODES_EPILOG,
        description="Place the adapters of a CSV (header id,rank,rate; rate in req/s) on GPUs "
                    "serving one base model, verify the placement in the fleet twin, and write "
                    "a plan folder: placement.json (claim and twin lower bound), servers/gpu-<i>.sh "
                    "(vLLM commands), routing.csv/json, control-plane manifests, report.md and "
                    "report.png.")
    s.add_argument("adapters", nargs="?", default=str(EXAMPLE_CSV),
                   help="CSV with header id,rank,rate (default: the shipped example, "
                        "instances/examples/adapters.csv: 48 adapters, 21,000 tok/s)")
    s.add_argument("--gpu", default="H100",
                   help="GPU type: a catalog id (H100-64GB, H100-80GB, A100-80GB, H200, L40S) "
                        "or a prefix of one (H100 = the measured H100 profile)")
    s.add_argument("--model", default="llama-3.1-8b-instruct",
                   help="base model (llama-3.1-8b-instruct, qwen-2.5-7b-instruct)")
    s.add_argument("--pool", action="append", metavar="TYPE=COUNT[@PRICE]",
                   help="a GPU type of a mixed pool with how many are available and its "
                        "$/GPU-hour (repeat; replaces --gpu)")
    s.add_argument("--objective", choices=("gpus", "cost", "energy"), default="gpus",
                   help="what to minimise: GPUs, $/hour of the pool's prices, or energy")
    s.add_argument("--method", default="greedy",
                   help="placement method (greedy; milp, cpsat or auto for exact search)")
    s.add_argument("--time-limit", type=float_above(0.0), default=None, metavar="S",
                   help="time limit of the exact methods in seconds")
    s.add_argument("--duration", type=float_above(0.0, MAX_DURATION_S),
                   default=DEFAULT_DURATION_S, metavar="S",
                   help="twin verification window in seconds")
    s.add_argument("--seed", type=seed_type, default=0, help="workload seed of the twin")
    s.add_argument("--max-homes", type=positive_int, default=1, metavar="K",
                   help="route one adapter to at most K GPUs (greedy, milp, cpsat, auto)")
    s.add_argument("--name", default=None, help="plan name (default: the CSV's file name)")
    s.add_argument("--workers", type=int_at_least(1, 256), default=None,
                   help="processes for the twin replays (default: all cores)")
    s.add_argument("--out", default="plan", help="plan folder (refused when it holds files, "
                                                 "unless --force)")
    from .deploy import DEFAULT_TARGETS, target_help
    s.add_argument("--target", action="append", default=None, metavar="TARGET[,TARGET...]",
                   help=f"release lines of the deployment files (default: "
                        f"{','.join(DEFAULT_TARGETS)}); {target_help()}")
    s.add_argument("--no-headroom", action="store_true",
                   help="plan on the plain twin verdict (90 %% rule) only; by default every "
                        "GPU must also pass with the twin's measured headroom of its regime "
                        "(twin.headroom), and deployment.json records it")
    s.add_argument("--allow-rejected", action="store_true",
                   help="write the deployment files even when the twin rejects the placement "
                        "(they record twin_verdict=rejected)")
    s.add_argument("--tune-amax", action=argparse.BooleanOptionalAction, default=True,
                   help="once the twin accepts the placement, each GPU's --max-loras is its best "
                        "integer in the twin (every value 1..adapters + 1 replayed; "
                        "optim.amax_tuning)")
    s.add_argument("--slo", default=None, metavar="NAME=MS[,...]", help=SLO_HELP)
    s.add_argument("--slo-class", action="append", metavar="CLASS:NAME=MS[,...]",
                   help="bounds of an adapter class, for the adapters whose slo_class column in "
                        "the CSV names it (repeatable; the other adapters keep --slo's bounds, "
                        "or none), e.g. --slo-class premium:ttft_p99_ms=300,itl_p99_ms=60")
    s.add_argument("--force", action="store_true", help="write into a non-empty --out folder")
    s.add_argument("--quiet", action="store_true", help="no stage lines or progress bars")
    s.set_defaults(func=cmd_plan)
