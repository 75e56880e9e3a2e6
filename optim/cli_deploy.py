"""Subcommands ``deploy`` and ``replan`` of ``python -m optim`` (registered by ``optim.cli``).

``deploy PLAN --out DIR [--force] [--model-id ID] [--adapter-dir D] [--namespace NS]
[--base-port P] [--gpus-per-host N] [--allow-rejected]`` writes the deployment files of one plan
(``optim.deploy``). ``replan --previous PLAN INSTANCE [--churn-weight W | --max-moves K]
[--no-resolve] [--no-transition] [--switch-schedule S] [--switch-allowance G] [--json OUT]
[--force]`` re-plans for a drifted instance (``optim.replan``) and prints the switch-over's
replay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from twin.cli_support import (EXIT_CODES_EPILOG, EXIT_REJECTED, CliError, HelpFormatter,
                              check_output, float_above, int_at_least, nonneg_int, write_output)
from twin.limits import MAX_DURATION_S

# optim.replan.SWITCH_SCHEDULES, spelled out: importing optim.replan would slow every
# `python -m optim` start-up by half a second (tests/test_replan.py checks they agree)
CLI_SWITCH_SCHEDULES = ("auto", "staggered", "parallel", "abrupt")


# optim.deploy.TARGETS and TARGET_ALIASES, spelled out for --help without importing optim.deploy
# at start-up (tests/test_deploy.py checks they agree)
CLI_DEPLOY_TARGETS = ("vllm-measured", "vllm-0.8.5", "vllm-0.33", "vllm-current", "gie-v1",
                      "gie-v1alpha2", "aibrix", "kserve", "llm-d")
CLI_DEPLOY_DEFAULT_TARGETS = ("vllm-measured", "gie-v1", "aibrix", "kserve", "llm-d")


def deploy_targets(values: list[str] | None) -> tuple[str, ...]:
    """``--target`` values (repeatable, each a comma list) as names; the defaults when none."""
    if not values:
        return CLI_DEPLOY_DEFAULT_TARGETS
    names = [t.strip() for v in values for t in v.split(",")]
    for t in names:
        if not t:
            raise CliError("--target: empty target name (give e.g. --target vllm-0.33,gie-v1)")
        if t not in CLI_DEPLOY_TARGETS:
            raise CliError(f"--target: unknown target {t!r} (known: "
                           f"{', '.join(CLI_DEPLOY_TARGETS)})")
    return tuple(names)


def cmd_deploy(a: argparse.Namespace) -> int:
    from .deploy import (DeployError, DeployOptions, Layout, check_plan, load_plan,
                         write_deployment)
    targets = deploy_targets(a.target)
    try:
        plan = load_plan(a.plan)
        check_plan(plan, str(a.plan))
        opts = DeployOptions(adapter_dir=a.adapter_dir, namespace=a.namespace,
                             model_id=a.model_id, layout=Layout(a.base_port, a.gpus_per_host),
                             allow_rejected=a.allow_rejected, targets=targets,
                             headroom=not a.no_headroom)
        files = write_deployment(plan, a.out, opts, force=a.force)
    except DeployError as e:
        raise CliError(str(e)) from None
    verdict = plan.verdict or "unverified"
    print(f"wrote {len(files)} files to {a.out} for {plan.n_gpus} server(s) of plan "
          f"'{plan.instance}' (twin_verdict={verdict}; targets {', '.join(targets)})")
    if not a.no_headroom and plan.verdict is not None:       # twin.headroom
        print(plan.headroom_lines().lstrip("\n"))
    return 0


def _new_instance(path: str, prev, prev_path: str):
    """The re-plan's instance and the plan inputs it was built with: an instance JSON (no
    inputs), or an adapters CSV built with the inputs ``optim plan`` recorded in the previous
    plan (GPU pool, model, window, seed, SLO, headroom), as ``optim plan`` would build it."""
    from .instance import InstanceError, load_instance
    from .plan import PlanError, PlanInputs
    if Path(path).suffix.lower() != ".csv":
        try:
            return load_instance(path), None
        except InstanceError as e:
            raise CliError(str(e)) from None
    raw = prev.params.get("plan_inputs")
    if raw is None:
        raise CliError(f"instance {path}: an adapters CSV needs a previous plan written by "
                       f"`optim plan` (its inputs: GPU, model, window, SLO); --previous "
                       f"{prev_path} records none: give an instance JSON")
    try:
        return PlanInputs.from_dict(raw, f"--previous {prev_path}: params.plan_inputs"
                                    ).instance(path), raw
    except PlanError as e:
        raise CliError(str(e)) from None


def cmd_replan(a: argparse.Namespace) -> int:
    from .deploy import DeployError, load_plan
    from .methods import MethodOptions, solve
    from .replan import ReplanOptions, replan
    json_out = check_output(a.json, "--json", a.force)
    try:
        prev = load_plan(a.previous)
    except DeployError as e:
        raise CliError(f"--previous: {e}") from None
    if not prev.gpus:
        raise CliError(f"--previous {a.previous}: the plan has no GPUs (status {prev.status})")
    inst, plan_inputs = _new_instance(a.instance, prev, a.previous)
    from .replan import check_same_model
    check_same_model(prev, inst, a.previous, a.instance)     # before any solve or replay
    headroom = a.headroom if a.headroom is not None else (
        inst.headroom or bool(prev.params.get("headroom")))  # twin.headroom: as the plan was
    if headroom != inst.headroom:
        from dataclasses import replace
        inst = replace(inst, headroom=headroom)
        if not a.quiet and a.headroom is None:
            print("the previous plan was judged with the twin's measured headroom; so is the "
                  "re-plan (--no-headroom: the plain 90 % rule)", file=sys.stderr)
    opts = ReplanOptions(churn_weight=a.churn_weight if a.churn_weight is not None else
                         ReplanOptions.churn_weight, max_moves=a.max_moves,
                         duration_s=a.duration, workers=a.workers, transition=a.transition,
                         switch_schedule=a.switch_schedule,
                         switch_allowance=(a.switch_allowance if a.switch_allowance is not None
                                           else ReplanOptions.switch_allowance))
    import twin.fleet
    twin.fleet.show_progress = not a.quiet
    try:
        fresh = None
        if a.resolve:
            if not a.quiet:
                print("solving the new instance from scratch (second candidate)",
                      file=sys.stderr)
            fresh = solve(inst, "greedy", verify=True, duration_s=a.duration,
                          workers=a.workers, options=MethodOptions())
        res = replan(prev, inst, opts, fresh=fresh)
    finally:
        twin.fleet.show_progress = False
    p = res.placement
    if plan_inputs is not None:         # the next re-plan of a CSV builds as this one
        p = p.with_(params={**p.params, "plan_inputs": plan_inputs})
    print(p.table())
    c = res.churn
    print(f"churn: moves={c.moves} loads={c.loads} unloads={c.unloads} "
          f"gpus_added={c.gpus_added} gpus_removed={c.gpus_removed} restarts={c.restarts} "
          f"kept_gpus={c.kept_gpus} candidate={res.candidate}")
    info = p.params["replan"]
    t = info["transition"]
    if t is not None:
        print(f"switch-over (replayed in the routed fleet twin): schedule={t['schedule']} "
              f"starved={t['starved']} late={t['late']} (steady {t['late_steady']}) "
              f"unfinished={t['unfinished']} (steady {t['unfinished_steady']}) "
              f"restarts={t['restarts']} new_homes={t['new_homes']}"
              + (f"; {info['transition_choice']}" if info["transition_choice"] else ""))
    if json_out is not None:
        write_output(json_out, p.to_json())
        print(f"wrote {json_out}")
    return 0 if p.verdict == "accepted" else EXIT_REJECTED


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register ``deploy`` and ``replan`` on ``python -m optim``'s subparsers."""
    fmt = HelpFormatter
    d = sub.add_parser("deploy", help="write deployment files for a plan", formatter_class=fmt,
                       epilog=EXIT_CODES_EPILOG,
                       description="From one plan (`optim solve --json`), checked first as the "
                                   "solver's output is (shares sum to 1 per adapter, max_loras "
                                   ">= 1, ranks vLLM accepts, max_cpu_loras >= adapters): per "
                                   "server a vLLM command (shell script + args JSON) reproducing "
                                   "the profile's calibrated settings, a routing table (JSON + "
                                   "CSV), and control-plane manifests (JSON, valid YAML) for the "
                                   "chosen --target release lines. Refused for a plan the twin "
                                   "rejected unless --allow-rejected.")
    d.add_argument("plan", help="plan JSON written by `optim solve --json` or `optim replan`")
    d.add_argument("--out", required=True, help="output directory")
    d.add_argument("--target", action="append", default=None, metavar="TARGET[,TARGET...]",
                   help="release lines to write (repeatable or a comma list; default "
                        f"{','.join(CLI_DEPLOY_DEFAULT_TARGETS)}): vllm-measured = the vLLM "
                        "release the profiles were measured on (vllm-0.8.5 for the shipped "
                        "ones, in servers/); vllm-0.8.5; vllm-0.33 = vllm-current, the current "
                        "vLLM line, not measured (servers/vllm-0.33.0/); gie-v1 = Gateway API "
                        "Inference Extension v1 InferencePool + InferenceObjective + "
                        "InferenceModelRewrite (gateway/); gie-v1alpha2 = GIE v0.3-v0.5 "
                        "InferencePool + InferenceModel (gateway-v1alpha2/); aibrix = AIBrix "
                        "ModelAdapter v1alpha1; kserve = KServe LLMInferenceService v1alpha2; "
                        "llm-d = llm-d endpoint picker config with LoRA affinity")
    d.add_argument("--force", action="store_true", help="overwrite files already in --out")
    d.add_argument("--model-id", default=None,
                   help="model id vLLM loads (default: the profile's serving.model_id)")
    d.add_argument("--adapter-dir", default="adapters",
                   help="directory or URL prefix holding the adapters (<dir>/<id>)")
    d.add_argument("--namespace", default="default", help="Kubernetes namespace of manifests")
    d.add_argument("--base-port", type=int_at_least(1, 65535 - 64), default=8000,
                   help="port of the first GPU of each host")
    d.add_argument("--gpus-per-host", type=int_at_least(1, 64), default=8,
                   help="GPUs per host (CUDA_VISIBLE_DEVICES and ports repeat per host)")
    d.add_argument("--no-headroom", action="store_true",
                   help="record the plain twin verdict only (default: deployment.json also "
                        "flags GPUs that pass only without the twin's measured headroom, "
                        "twin.headroom)")
    d.add_argument("--allow-rejected", action="store_true",
                   help="write files for a plan the twin rejected (recorded in every file)")
    d.set_defaults(func=cmd_deploy)

    r = sub.add_parser("replan", help="re-plan a previous plan for a drifted instance",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                       description="Keep GPUs and adapters where they are when the twin still "
                                   "accepts; move only the adapters of starving GPUs and place "
                                   "new ones; add GPUs when needed, drain GPUs within the churn "
                                   "budget. Prints the plan and its churn (moves, loads, GPU "
                                   "adds/removes).")
    r.add_argument("instance", help="the new instance JSON, or an adapters CSV (id,rank,rate) "
                                    "when --previous is a plan of `optim plan`: its GPU pool, "
                                    "model, window, seed, SLO and headroom are kept")
    r.add_argument("--previous", required=True, help="previous plan JSON (`optim solve --json`)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--churn-weight", type=float_above(0.0, inclusive=True), default=None,
                   metavar="W", help="cost of one adapter move in GPUs (default 0.02)")
    g.add_argument("--max-moves", type=nonneg_int, default=None, metavar="K",
                   help="at most K optional adapter moves (moves that stop starvation are "
                        "always made)")
    r.add_argument("--resolve", action=argparse.BooleanOptionalAction, default=True,
                   help="also solve from scratch and take it when cheaper")
    r.add_argument("--duration", type=float_above(0.0, MAX_DURATION_S), default=None,
                   metavar="S", help="twin window in seconds (default: the instance's)")
    r.add_argument("--workers", type=int_at_least(1, 256), default=None,
                   help="processes for twin replays (default: all cores)")
    r.add_argument("--transition", action=argparse.BooleanOptionalAction, default=True,
                   help="replay each candidate's switch-over in the routed fleet twin and "
                        "prefer one that does not starve")
    r.add_argument("--switch-schedule", choices=CLI_SWITCH_SCHEDULES, default="auto",
                   help="how servers restart at the switch-over: one at a time (staggered), "
                        "all at once (parallel), auto (the better of the two), or abrupt "
                        "(no make-before-break)")
    r.add_argument("--switch-allowance", type=float_above(0.0, inclusive=True),
                   default=None, metavar="GPUS",
                   help="extra cost (GPUs + churn weight x moves) a candidate whose switch-over "
                        "does not starve may have over a cheaper one that starves (default "
                        "0.25)")
    r.add_argument("--headroom", action=argparse.BooleanOptionalAction, default=None,
                   help="judge every GPU with the twin's measured headroom too (twin.headroom; "
                        "default: as the instance says, or as the previous plan was judged)")
    r.add_argument("--json", default=None, help="write the new plan (JSON, with params.replan)")
    r.add_argument("--force", action="store_true", help="overwrite --json")
    r.add_argument("--quiet", action="store_true", help="no progress bars on stderr")
    r.set_defaults(func=cmd_replan)
