"""Command line: ``python -m optim solve|generate|methods``.

``solve <instance.json> --method NAME [--verify/--no-verify] [--json OUT] [--vllm-args OUT]
[--objective gpus|cost|latency] [--time-limit S] [--gpus K] [--seed S] [--duration S] [--workers W]
[--no-compact]`` prints the
per-GPU table and a summary; ``generate --set paper|small|large --out DIR --seed S [--force]``
writes an instance set; ``methods`` lists the registered methods.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from .generate import SETS, generate_set
from .instance import InstanceError, load_instance
from .methods import MethodOptions, get_method, method_names, solve


def _write(path: str, text: str, force: bool) -> None:
    p = Path(path)
    if p.exists() and not force:
        raise SystemExit(f"error: {p} exists; pass --force to overwrite it")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n", encoding="utf-8")


def cmd_solve(a: argparse.Namespace) -> int:
    try:
        inst = load_instance(a.instance)
    except InstanceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        get_method(a.method)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if a.time_limit is not None and a.time_limit <= 0:
        print("error: --time-limit must be > 0", file=sys.stderr)
        return 2
    opts = MethodOptions(n_gpus=a.gpus, seed=a.seed, time_limit_s=a.time_limit,
                         extra={} if a.compact else {"compact": False})
    try:
        p = solve(inst, a.method, objective=a.objective, options=opts, verify=a.verify,
                  duration_s=a.duration, workers=a.workers)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(p.table(max_ids=a.show_ids))
    if a.json:
        _write(a.json, p.to_json(), a.force)
        print(f"wrote {a.json}")
    if a.vllm_args:
        _write(a.vllm_args, json.dumps({"instance": inst.name, "method": a.method,
                                        "gpus": p.vllm_args(adapter_dir=a.adapter_dir)},
                                       indent=1), a.force)
        print(f"wrote {a.vllm_args}")
    if p.status == "infeasible":
        return 3
    return 0 if p.feasible else 1


def cmd_generate(a: argparse.Namespace) -> int:
    try:
        files = generate_set(a.set, a.out, seed=a.seed, force=a.force)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    ap = argparse.ArgumentParser(prog="python -m optim", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="place the adapters of an instance")
    s.add_argument("instance")
    s.add_argument("--method", required=True, help=f"one of: {', '.join(method_names())}")
    s.add_argument("--objective", choices=("gpus", "cost", "latency"), default=None,
                   help="default: the instance's objective")
    s.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="time limit of searching methods (milp, cpsat, auto) in seconds "
                        "(default: the instance's solver.time_limit_s, else 60)")
    s.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                   help="replay the placement in the fleet twin (default: on)")
    s.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                   help="greedy with --verify: after repair, take GPUs away while the twin "
                        "accepts, each GPU's Amax chosen by the twin (default: on)")
    s.add_argument("--gpus", type=int, default=None,
                   help="fleet size for fixed-fleet methods (random, dlora, loraserve)")
    s.add_argument("--seed", type=int, default=None, help="default: the instance's seed")
    s.add_argument("--duration", type=float, default=None,
                   help="twin window in seconds (default: the instance's duration_s)")
    s.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    s.add_argument("--json", default=None, help="write the full placement record")
    s.add_argument("--vllm-args", default=None, help="write per-GPU vLLM server arguments (JSON)")
    s.add_argument("--adapter-dir", default="adapters",
                   help="directory holding the adapters, for --lora-modules id=DIR/id")
    s.add_argument("--show-ids", type=int, default=0, metavar="K",
                   help="list up to K adapter ids under each GPU")
    s.add_argument("--force", action="store_true", help="overwrite output files")
    s.set_defaults(func=cmd_solve)
    g = sub.add_parser("generate", help="write a benchmark instance set")
    g.add_argument("--set", required=True, choices=SETS)
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--force", action="store_true", help="overwrite existing files")
    g.set_defaults(func=cmd_generate)
    m = sub.add_parser("methods", help="list the registered methods")
    m.set_defaults(func=cmd_methods)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if getattr(a, "gpus", None) is not None and a.gpus < 1:
        print("error: --gpus must be >= 1", file=sys.stderr)
        return 2
    return a.func(a)
