"""Command line: ``python -m optim plan|solve|generate|methods|deploy|replan``.

``plan`` lives in ``optim.cli_plan``, ``deploy`` and ``replan`` in ``optim.cli_deploy``.

``solve <instance.json> --method NAME [--verify/--no-verify] [--json OUT] [--vllm-args OUT]
[--objective gpus|cost|latency] [--time-limit S] [--gpus K] [--seed S] [--duration S] [--workers W]
[--backend local|ray [--address A]] [--max-homes K] [--no-compact] [--quiet]`` prints the
per-GPU table and a summary; ``generate --set paper|small|large --out DIR --seed S [--force]``
writes an instance set; ``methods`` lists the registered methods.

Every option and output path is checked before the work starts. ``--vllm-args`` is written only
for a placement the twin accepted (or with ``--no-verify``, marked unverified); a rejected
placement's arguments are refused unless ``--allow-rejected``, and the file always records the
twin's verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import replace
from typing import Sequence

from twin.cli_support import (EXIT_CODES_EPILOG, EXIT_INFEASIBLE, EXIT_REJECTED, CliError,
                              HelpFormatter, check_output, check_output_dir, float_above,
                              int_at_least, nonneg_int, positive_int, run_command, seed_type,
                              slo_argument, write_output, SLO_HELP)
from twin.cli_support import Interrupted
from twin.limits import MAX_DURATION_S

from .generate import SETS, generate_set
from .instance import InstanceError, check_twin_window, load_instance
from .methods import MethodOptions, get_method, method_names, solve

UNITS_NOTE = ("units: offered, pred_tps, twin_tps in tok/s (input+output tokens per second); "
              "objective[gpus] in GPUs, objective[cost] in $/hour (sum of price_per_hour), "
              "objective[latency] in ms (load-weighted mean inter-token latency), "
              "objective[energy] in J/hour (3600 x the GPUs' average power); wall times in s")


def _vllm_payload(inst, a: argparse.Namespace, p) -> dict:
    verdict = p.verdict or "unverified"
    failed = sum(1 for g in p.gpus if g.verified and not g.verified.ok)
    return {"instance": inst.name, "method": a.method, "twin_verdict": verdict,
            "twin_failed_gpus": failed if p.verdict else None,
            "gpus": p.vllm_args(adapter_dir=a.adapter_dir)}


def cmd_solve(a: argparse.Namespace) -> int:
    json_out = check_output(a.json, "--json", a.force)
    vllm_out = check_output(a.vllm_args, "--vllm-args", a.force)
    if json_out is not None and vllm_out is not None and json_out.resolve() == vllm_out.resolve():
        raise CliError(f"--json and --vllm-args name the same file {json_out}")
    if not a.adapter_dir.strip():
        raise CliError("--adapter-dir: empty path")
    try:
        info = get_method(a.method)
    except KeyError as e:
        raise CliError(f"--method: {e.args[0]}") from None
    if a.gpus is not None and not info.fixed_fleet:
        fixed = ", ".join(n for n in method_names() if get_method(n).fixed_fleet)
        raise CliError(f"--gpus {a.gpus}: method '{a.method}' chooses the fleet size itself; "
                       f"--gpus applies to the fixed-fleet methods ({fixed})")
    try:
        inst = load_instance(a.instance)
    except InstanceError as e:
        raise CliError(str(e)) from None
    if a.duration is not None:
        try:
            check_twin_window(inst.adapters, inst.total_gpus_available, a.duration)
        except ValueError as e:
            raise CliError(f"--duration: {e}") from None
    if a.max_homes is not None:
        inst = _with_max_homes(inst, a.max_homes, a.method, info)
    if a.slo is not None:
        slo = slo_argument(a.slo)
        if slo.warmup_s >= (a.duration or inst.duration_s):
            raise CliError(f"--slo: warmup_s {slo.warmup_s:g} s leaves nothing of the "
                           f"{a.duration or inst.duration_s:g} s twin window to judge")
        if inst.slo is not None and inst.slo.classes:   # --slo sets the top level; classes stay
            slo = replace(slo, classes=inst.slo.classes)
        inst = replace(inst, slo=slo)
    if a.headroom:                      # twin.headroom: judge every GPU with it too
        inst = replace(inst, headroom=True)
    import twin.fleet
    with contextlib.ExitStack() as stack:   # Ray starts / joins its cluster before solving
        try:
            pool = stack.enter_context(twin.fleet.use_backend(a.backend, a.address, a.workers))
        except twin.fleet.FleetBackendError as e:
            raise CliError(f"--{e.field}: {e.reason}") from None
        return _solve_and_report(a, inst, json_out, vllm_out,
                                 None if pool is not None else a.workers)


def _solve_and_report(a: argparse.Namespace, inst, json_out, vllm_out, workers) -> int:
    import twin.fleet
    extra = {} if a.compact else {"compact": False}
    if not a.tune_amax:
        extra["tune_amax"] = False
    opts = MethodOptions(n_gpus=a.gpus, seed=a.seed, time_limit_s=a.time_limit, extra=extra)
    if not a.quiet and a.verify:
        print(f"solving {inst.name} with {a.method}, then replaying it in the twin "
              f"({a.duration or inst.duration_s:g} s window; progress on stderr)", file=sys.stderr)
    twin.fleet.show_progress = not a.quiet
    from .exact.loop import interruptible_c_solvers
    try:
        with interruptible_c_solvers():    # CP-SAT / HiGHS of any method stop on Ctrl-C
            p = solve(inst, a.method, objective=a.objective, options=opts, verify=a.verify,
                      duration_s=a.duration, workers=workers)
    except Interrupted as e:     # Ctrl-C / SIGTERM: keep the best placement found so far
        _write_interrupted(e.partial, json_out)
        raise
    finally:
        twin.fleet.show_progress = False
    print(p.table(max_ids=a.show_ids))
    print(UNITS_NOTE)
    rc = 0
    if p.status == "infeasible":
        rc = EXIT_INFEASIBLE
    elif not p.feasible:
        rc = EXIT_REJECTED
    if json_out is not None:
        write_output(json_out, p.to_json())
        print(f"wrote {json_out}")
    if vllm_out is not None:
        if not p.gpus:
            print(f"not writing --vllm-args {vllm_out}: the placement has no GPUs "
                  f"(status {p.status})", file=sys.stderr)
        elif p.verdict == "rejected" and not a.allow_rejected:
            print(f"not writing --vllm-args {vllm_out}: the twin rejected this placement "
                  "(see the twin column); pass --allow-rejected to write it anyway (the file "
                  "then records twin_verdict=rejected)", file=sys.stderr)
        else:
            write_output(vllm_out, json.dumps(_vllm_payload(inst, a, p), indent=1))
            note = "" if p.verdict == "accepted" else f" (twin_verdict={p.verdict or 'unverified'})"
            print(f"wrote {vllm_out}{note}")
    return rc


def _write_interrupted(p, json_out) -> None:
    """On Ctrl-C / SIGTERM: write the best placement found so far to ``--json``, marked
    ``"interrupted": true`` (``--vllm-args`` is not written: nothing was verified to the end)."""
    if json_out is None:
        return
    if p is None or not getattr(p, "gpus", None):
        print(f"not writing --json {json_out}: interrupted before any placement was found",
              file=sys.stderr)
        return
    write_output(json_out, json.dumps({"interrupted": True, **json.loads(p.to_json())},
                                      indent=1))
    print(f"interrupted: wrote the best placement found so far ({p.n_gpus} GPUs, "
          f"{p.params.get('interrupted_source', 'status ' + p.status)}) to {json_out}",
          file=sys.stderr)


def _with_max_homes(inst, k: int, method: str, info):
    """``inst`` with ``max_homes`` k (``--max-homes``), refused for a method that does not
    replicate or beyond the pool."""
    if k > 1 and not info.max_homes:
        which = ", ".join(n for n in method_names() if get_method(n).max_homes)
        raise CliError(f"--max-homes {k}: method '{method}' does not split adapters within "
                       f"max_homes; it applies to {which}")
    if k > inst.total_gpus_available:
        raise CliError(f"--max-homes {k}: exceeds the {inst.total_gpus_available} GPU(s) of "
                       "the pool")
    return replace(inst, max_homes=k)


def cmd_generate(a: argparse.Namespace) -> int:
    check_output_dir(a.out, "--out", force=True)
    try:
        files = generate_set(a.set, a.out, seed=a.seed, force=a.force)
    except FileExistsError as e:
        raise CliError(f"--out {a.out}: {e}") from None
    n_json = sum(1 for f in files if f.suffix == ".json")
    print(f"wrote {n_json} instances ({len(files)} files) to {a.out}")
    return 0


def cmd_methods(_: argparse.Namespace) -> int:
    for name in method_names():
        m = get_method(name)
        kind = "fixed fleet" if m.fixed_fleet else "sizes fleet"
        print(f"{name:<14} {kind:<12} objectives={','.join(sorted(m.objectives)):<19} "
              f"{m.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    fmt = HelpFormatter
    ap = argparse.ArgumentParser(prog="python -m optim", description=__doc__.split("\n")[0],
                                 epilog=EXIT_CODES_EPILOG)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="place the adapters of an instance", formatter_class=fmt,
                       epilog=EXIT_CODES_EPILOG + ". " + UNITS_NOTE,
                       description="Place the adapters of an instance file (schema: "
                                   "instances/README.md), verify the placement in the fleet "
                                   "twin, print the per-GPU table and a summary.")
    s.add_argument("instance", help="instance JSON file")
    s.add_argument("--method", required=True, help=f"one of: {', '.join(method_names())}")
    s.add_argument("--objective", choices=("gpus", "cost", "latency", "energy"), default=None,
                   help="default: the instance's objective")
    s.add_argument("--time-limit", type=float_above(0.0), default=None, metavar="S",
                   help="time limit of searching methods (milp, cpsat, auto) in seconds "
                        "(default: the instance's solver.time_limit_s, else 60)")
    s.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="replay the placement in the fleet twin")
    s.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy with --verify: after repair, take GPUs away while the twin "
                        "accepts, each GPU's Amax chosen by the twin")
    s.add_argument("--tune-amax", action=argparse.BooleanOptionalAction, default=True,
                   help="with --verify: once the twin accepts, each GPU's --max-loras is its best "
                        "integer in the twin (every value 1..adapters + 1 replayed; "
                        "optim.amax_tuning)")
    s.add_argument("--gpus", type=positive_int, default=None,
                   help="fleet size for fixed-fleet methods (random, dlora, loraserve)")
    s.add_argument("--max-homes", type=positive_int, default=None, metavar="K",
                   help="route one adapter to at most K GPUs with weights (greedy, milp, cpsat, "
                        "auto): greedy splits the adapters no GPU serves alone, the exact "
                        "models get split variables (default: the instance's max_homes, else 1)")
    s.add_argument("--seed", type=seed_type, default=None,
                   help="seed of random methods and of the twin workload (default: the "
                        "instance's seed)")
    s.add_argument("--duration", type=float_above(0.0, MAX_DURATION_S), default=None, metavar="S",
                   help="twin window in seconds (default: the instance's duration_s)")
    s.add_argument("--workers", type=int_at_least(1, 256), default=None,
                   help="processes for the twin replay (default: all cores); with --backend "
                        "ray and no --address, the CPUs of the local Ray instance")
    s.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="where the twin replays the GPUs: local processes, or Ray tasks")
    s.add_argument("--address", default=None, metavar="A",
                   help="--backend ray: the Ray cluster to run on (HOST:PORT as printed by `ray "
                        "start --head`, ray://HOST:PORT or auto; default: a local Ray instance)")
    s.add_argument("--slo", default=None, metavar="NAME=MS[,...]", help=SLO_HELP)
    s.add_argument("--headroom", action="store_true",
                   help="every GPU must also pass with the twin's measured headroom of its "
                        "regime (twin.headroom; as optim plan does by default, and an instance's "
                        "\"headroom\": true); without it the verdict is the plain 90 %% rule and "
                        "the headroom verdict is printed beside it")
    s.add_argument("--json", default=None, help="write the full placement record (JSON)")
    s.add_argument("--vllm-args", default=None,
                   help="write per-GPU vLLM server arguments (JSON, with the twin's verdict); "
                        "refused for a placement the twin rejected unless --allow-rejected")
    s.add_argument("--allow-rejected", action="store_true",
                   help="write --vllm-args even when the twin rejected the placement")
    s.add_argument("--adapter-dir", default="adapters",
                   help="directory holding the adapters, for --lora-modules id=DIR/id")
    s.add_argument("--show-ids", type=nonneg_int, default=0, metavar="K",
                   help="list up to K adapter ids under each GPU")
    s.add_argument("--force", action="store_true", help="overwrite --json / --vllm-args files")
    s.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    s.set_defaults(func=cmd_solve)
    g = sub.add_parser("generate", help="write a benchmark instance set", formatter_class=fmt,
                       epilog=EXIT_CODES_EPILOG)
    g.add_argument("--set", required=True, choices=SETS,
                   help="paper: the earlier study's scenarios; small: 36 for exact solving; "
                        "large: 1,000-10,000 adapters")
    g.add_argument("--out", required=True, help="directory to write the instances to")
    g.add_argument("--seed", type=seed_type, default=0, help="generator seed (0 .. 2^32-1)")
    g.add_argument("--force", action="store_true", help="overwrite existing files")
    g.set_defaults(func=cmd_generate)
    m = sub.add_parser("methods", help="list the registered methods", epilog=EXIT_CODES_EPILOG)
    m.set_defaults(func=cmd_methods)
    from .cli_deploy import add_subcommands
    add_subcommands(sub)              # deploy, replan
    from .cli_plan import add_subcommand as add_plan
    add_plan(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return run_command(lambda: a.func(a))
