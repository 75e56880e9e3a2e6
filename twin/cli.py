"""Command line of the twin: ``python -m twin run|maxpack|calibrate``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

from .lengths import FixedLengths, default_lengths, sharegpt_lengths
from .profile import load_profile
from .workload import (GammaArrivals, LognormalArrivals, PoissonArrivals, adapters_from_cycles,
                       load_adapters_csv, load_trace_csv)


class CliError(ValueError):
    """A bad command-line argument; printed without a traceback."""


def _parse_list(name: str, text: str, conv, what: str) -> list:
    try:
        vals = [conv(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--{name}: expected comma-separated {what}, got {text!r}") from None
    if not vals:
        raise CliError(f"--{name}: empty list")
    return vals


def parse_float_list(name: str, text: str) -> list[float]:
    vals = _parse_list(name, text, float, "numbers")
    for v in vals:
        if not math.isfinite(v) or v <= 0:
            raise CliError(f"--{name}: every value must be a finite number > 0, got {v}")
    return vals


def parse_int_list(name: str, text: str) -> list[int]:
    return _parse_list(name, text, int, "integers")


def parse_arrivals(text: str):
    kind, _, arg = text.partition(":")
    if kind == "poisson" and not arg:
        return PoissonArrivals()
    if kind in ("gamma", "lognormal"):
        try:
            cv = float(arg)
        except ValueError:
            raise CliError(f"--arrivals: '{kind}:CV' needs a number CV, got {text!r}") from None
        return GammaArrivals(cv=cv) if kind == "gamma" else LognormalArrivals(cv=cv)
    raise CliError(f"--arrivals: expected poisson, gamma:CV or lognormal:CV, got {text!r}")


def parse_lengths(text: str):
    if text == "sharegpt":
        return default_lengths()
    kind, _, arg = text.partition(":")
    if kind == "sharegpt":
        vals = parse_float_list("lengths", arg)
        if len(vals) != 2:
            raise CliError("--lengths: sharegpt needs two mean lengths, e.g. sharegpt:223,196")
        return sharegpt_lengths(mean_input=vals[0], mean_output=vals[1])
    if kind == "fixed":
        vals = parse_int_list("lengths", arg)
        if len(vals) != 2:
            raise CliError("--lengths: fixed needs two integers, e.g. fixed:223,196")
        return FixedLengths(vals[0], vals[1])
    raise CliError(f"--lengths: expected sharegpt, sharegpt:IN,OUT or fixed:IN,OUT, got {text!r}")


def write_json(path: str, payload: dict, force: bool) -> None:
    p = Path(path)
    if p.exists() and not force:
        raise CliError(f"--json: {p} exists; pass --force to overwrite it")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=float) + "\n")


def _print_metrics(d: dict) -> None:
    width = max(len(k) for k in d)
    for k, v in d.items():
        if isinstance(v, float):
            v = f"{v:.4g}" if abs(v) < 1e5 else f"{v:.1f}"
        print(f"{k:<{width}}  {v}")


def cmd_run(a: argparse.Namespace) -> int:
    from .server import ServerConfig, simulate_requests, simulate_server

    profile = load_profile(a.profile)
    lengths = parse_lengths(a.lengths)
    if a.duration <= 0:
        raise CliError(f"--duration: must be > 0 seconds, got {a.duration}")
    cfg = ServerConfig(max_loras=a.amax, max_lora_rank=a.max_lora_rank)
    if a.trace:
        adapters, requests = load_trace_csv(a.trace)
        m = simulate_requests(profile, adapters, requests, cfg, a.duration)
    else:
        if a.adapters_file:
            adapters = load_adapters_csv(a.adapters_file)
        else:
            if a.adapters < 1:
                raise CliError(f"--adapters: must be >= 1, got {a.adapters}")
            adapters = adapters_from_cycles(a.adapters, parse_int_list("ranks", a.ranks),
                                            parse_float_list("rates", a.rates))
        m = simulate_server(profile, adapters, cfg, a.duration, lengths=lengths,
                            arrivals=parse_arrivals(a.arrivals), seed=a.seed)
    d = m.to_dict()
    _print_metrics(d)
    if a.json:
        payload = {"profile": profile.name, "max_loras": a.amax, "adapters": len(adapters),
                   "seed": a.seed, **d}
        write_json(a.json, payload, a.force)
    return 0


def cmd_maxpack(a: argparse.Namespace) -> int:
    from .maxpack import maxpack_search

    profile = load_profile(a.profile)
    res = maxpack_search(profile, parse_float_list("rates", a.rates),
                         parse_int_list("ranks", a.ranks), lengths=parse_lengths(a.lengths),
                         duration_s=a.duration, seed=a.seed)
    for p in res.points:
        print(f"amax={p.max_loras:4d} n={p.served_adapters:4d} "
              f"throughput={p.metrics.throughput_tps:9.1f} offered={p.metrics.offered_tps:9.1f} "
              f"starved={p.metrics.starved} memory_error={p.metrics.memory_error}")
    print(f"maxpack served_adapters={res.served_adapters} max_loras={res.max_loras} "
          f"throughput_tps={res.throughput_tps:.1f}")
    return 0


def cmd_calibrate(a: argparse.Namespace) -> int:
    from .calibrate import calibrate

    out = Path(a.out)
    if out.exists() and not a.force:
        raise CliError(f"--out: {out} exists; pass --force to overwrite it")
    data = Path(a.data)
    if not data.exists():
        raise CliError(f"--data: {data} does not exist")
    profile, report = calibrate(data, a.model, name=a.name, refine=a.refine)
    print(json.dumps(report, indent=2, default=float))
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.to_json(out)
    print(f"wrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m twin",
                                description="Digital twin of a vLLM multi-LoRA server.")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="simulate one server and print its metrics")
    r.add_argument("--profile", default="llama-3.1-8b-instruct")
    r.add_argument("--amax", type=int, default=32, help="max_loras (GPU adapter slots)")
    r.add_argument("--max-lora-rank", type=int, default=None)
    r.add_argument("--adapters", type=int, default=384, help="number of adapters")
    r.add_argument("--ranks", default="16", help="ranks cycled over adapters, e.g. 8,16,32")
    r.add_argument("--rates", default="0.1,0.05,0.025", help="req/s cycled over adapters")
    r.add_argument("--adapters-file", default=None, help="CSV with columns id,rank,rate")
    r.add_argument("--trace", default=None,
                   help="CSV arrival_s,adapter_id,input_tokens,output_tokens[,rank] to replay")
    r.add_argument("--arrivals", default="poisson", help="poisson | gamma:CV | lognormal:CV")
    r.add_argument("--lengths", default="sharegpt", help="sharegpt | sharegpt:IN,OUT | fixed:IN,OUT")
    r.add_argument("--duration", type=float, default=3600.0, help="simulated seconds")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", default=None, help="write every metric (and wall_s) here")
    r.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("maxpack", help="largest non-starving adapter count and best Amax")
    m.add_argument("--profile", default="llama-3.1-8b-instruct")
    m.add_argument("--rates", required=True)
    m.add_argument("--ranks", required=True)
    m.add_argument("--lengths", default="sharegpt")
    m.add_argument("--duration", type=float, default=3600.0)
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=cmd_maxpack)

    c = sub.add_parser("calibrate", help="fit a GpuProfile from profiling CSVs")
    c.add_argument("--data", required=True, help="folder with a calibration/ subfolder")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--name", default=None)
    c.add_argument("--refine", action="store_true",
                   help="add the simulation-consistent refit on the shared scheduler runs")
    c.add_argument("--force", action="store_true")
    c.set_defaults(func=cmd_calibrate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:   # our errors name the field and the reason
        print(f"error: {e}", file=sys.stderr)
        return 2
