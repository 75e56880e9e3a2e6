"""Command line of the twin: ``python -m twin run|maxpack|calibrate|serve``.

Every option is checked before the simulation starts (the message names the option and the
bad value), output files are checked before the work, and results are printed with units and
a plain-language verdict.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from .cli_support import (EXIT_CODES_EPILOG, CliError, HelpFormatter, check_input_file,
                          check_output, float_above, positive_float, positive_int, progress,
                          run_command, seed_type, write_output)
from .limits import check_run_size
from .profile import GpuProfile, load_profile

DEFAULT_PROFILE = "llama-3.1-8b-instruct"
DEFAULT_DURATION_S = 3600.0


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
    vals = _parse_list(name, text, int, "integers")
    for v in vals:
        if v < 1:
            raise CliError(f"--{name}: every value must be an integer >= 1, got {v}")
    return vals


def parse_arrivals(text: str):
    from .workload import GammaArrivals, LognormalArrivals, PoissonArrivals

    kind, _, arg = text.partition(":")
    if kind == "poisson" and not arg:
        return PoissonArrivals()
    if kind in ("gamma", "lognormal"):
        try:
            cv = float(arg)
        except ValueError:
            raise CliError(f"--arrivals: '{kind}:CV' needs a number CV, got {text!r}") from None
        if not (math.isfinite(cv) and cv > 0):
            raise CliError(f"--arrivals: CV must be a finite number > 0, got {text!r}")
        return GammaArrivals(cv=cv) if kind == "gamma" else LognormalArrivals(cv=cv)
    raise CliError(f"--arrivals: expected poisson, gamma:CV or lognormal:CV, got {text!r}")


def parse_lengths(text: str):
    from .lengths import FixedLengths, default_lengths, sharegpt_lengths

    if text == "sharegpt":
        return default_lengths()
    kind, _, arg = text.partition(":")
    if kind == "sharegpt":
        vals = parse_float_list("lengths", arg)
        if len(vals) != 2:
            raise CliError("--lengths: sharegpt needs two mean lengths, e.g. sharegpt:223,196")
        try:
            return sharegpt_lengths(mean_input=vals[0], mean_output=vals[1])
        except ValueError as e:
            raise CliError(f"--lengths {text!r}: {e}") from None
    if kind == "fixed":
        vals = parse_int_list("lengths", arg)
        if len(vals) != 2:
            raise CliError("--lengths: fixed needs two integers, e.g. fixed:223,196")
        return FixedLengths(vals[0], vals[1])
    raise CliError(f"--lengths: expected sharegpt, sharegpt:IN,OUT or fixed:IN,OUT, got {text!r}")


def check_ranks(profile: GpuProfile, ranks: Sequence[int], what: str) -> None:
    """Every rank must be one the profile was calibrated for (else the twin would report a
    memory error, which is not what happens on the real server)."""
    for r in ranks:
        if r not in profile.supported_ranks:
            raise CliError(f"{what}: rank {r} not supported by profile '{profile.name}' "
                           f"(supported: {', '.join(map(str, profile.supported_ranks))})")


def _load_profile(name: str) -> GpuProfile:
    try:
        return load_profile(name)
    except (OSError, ValueError) as e:
        raise CliError(f"--profile: {e}") from None


# ------------------------------------------------------------------------------ output
# unit of every RunMetrics field (printed next to the value)
UNITS = {
    "duration_s": "s", "throughput_tps": "tok/s", "offered_tps": "tok/s",
    "offered_realised_tps": "tok/s", "starved": "", "memory_error": "",
    "arrived_requests": "requests", "finished_requests": "requests",
    "unfinished_requests": "requests", "rejected_requests": "requests",
    "mean_itl_ms": "ms", "p50_itl_ms": "ms", "p99_itl_ms": "ms", "mean_ttft_ms": "ms",
    "p50_ttft_ms": "ms", "p99_ttft_ms": "ms", "ttft_paper_ms": "ms", "mean_tpot_ms": "ms",
    "p50_tpot_ms": "ms", "p99_tpot_ms": "ms", "preemptions": "count",
    "adapter_loads": "count", "adapter_load_s": "s", "steps": "count",
    "mean_batch_size": "requests", "max_batch_size": "requests",
    "mean_distinct_adapters": "adapters", "mean_kv_usage_frac": "fraction",
    "max_waiting": "requests", "kv_capacity_tokens": "tokens", "wall_s": "s (wall clock)",
}


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def print_metrics(d: dict) -> None:
    width = max(len(k) for k in d)
    vals = {k: _fmt(v) for k, v in d.items()}
    vwidth = max(len(v) for v in vals.values())
    for k, v in vals.items():
        print(f"{k:<{width}}  {v:>{vwidth}}  {UNITS.get(k, '')}".rstrip())


def describe_run(m, threshold: float = 0.9) -> list[str]:
    """What the numbers of a run mean, in sentences (the verdict first)."""
    if m.memory_error:
        return ["verdict: MEMORY ERROR - this (Amax, max_lora_rank) configuration has no "
                "KV-capacity entry in the profile: vLLM would not start it."]
    if m.arrived_requests == 0:
        return ["verdict: NO REQUEST arrived in the window, so there is nothing to measure: "
                "lengthen --duration or raise the rates."]
    lines = []
    ratio = m.throughput_tps / m.offered_realised_tps if m.offered_realised_tps > 0 else float("nan")
    if m.starved:
        lines.append(f"verdict: STARVED - throughput {m.throughput_tps:,.0f} tok/s is "
                     f"{ratio:.1%} of the {m.offered_realised_tps:,.0f} tok/s that arrived "
                     f"(below the {threshold:.0%} rule).")
    else:
        lines.append(f"verdict: not starved by the {threshold:.0%} rule - throughput "
                     f"{m.throughput_tps:,.0f} tok/s is {ratio:.1%} of the "
                     f"{m.offered_realised_tps:,.0f} tok/s that arrived.")
    if m.arrived_requests and m.unfinished_requests:
        frac = m.unfinished_requests / m.arrived_requests
        ttft = "" if math.isnan(m.mean_ttft_ms) else \
            f"; mean TTFT of the finished ones {m.mean_ttft_ms / 1000:,.1f} s"
        lines.append(f"  {'' if m.starved else 'but '}{m.unfinished_requests:,} of "
                     f"{m.arrived_requests:,} requests "
                     f"({frac:.1%}) were unfinished when the window closed{ttft}.")
        if frac > 0.01:
            lines.append("  The queue was still growing (at most "
                         f"{m.max_waiting:,} waiting): the load is at or beyond this server's "
                         "capacity, and a longer window would show more delay.")
    if m.rejected_requests:
        lines.append(f"  {m.rejected_requests:,} requests were rejected by the client's queue "
                     "cap (they count as offered, not served).")
    lines.append("  throughput = input+output tokens of requests finished in the window / window; "
                 "offered_tps = expected load, offered_realised_tps = tokens of the requests "
                 "that arrived; TTFT/ITL over finished requests.")
    return lines


# ------------------------------------------------------------------------------ run
def _trace_window(requests, trace: str, duration: float | None) -> float:
    """The replay window: ``--duration`` if given, else the trace's span (its last arrival
    rounded down to a whole second, plus one). Refuses a window that no arrival falls in."""
    t = requests.arrival_s
    if duration is None:
        return float(math.floor(float(t.max())) + 1)
    inside = int((t < duration).sum())
    if inside == 0:
        raise CliError(f"--duration {duration:g}: no arrival of trace {trace} falls in the "
                       f"window [0, {duration:g}) s (first arrival at {float(t.min()):g} s); "
                       "omit --duration to use the trace's span")
    return duration


def cmd_run(a: argparse.Namespace) -> int:
    profile = _load_profile(a.profile)
    json_out = check_output(a.json, "--json", a.force)
    if a.max_lora_rank is not None:
        check_ranks(profile, [a.max_lora_rank], "--max-lora-rank")
    if a.trace and (a.adapters_file or a.adapters_given):
        raise CliError("--trace defines the adapters; do not combine it with --adapters or "
                       "--adapters-file")
    from .server import ServerConfig, simulate_requests, simulate_server
    from .workload import adapters_from_cycles, load_adapters_csv, load_trace_csv
    import numpy as np

    cfg = ServerConfig(max_loras=a.amax, max_lora_rank=a.max_lora_rank,
                       client_max_waiting=a.client_max_waiting)
    if a.trace:
        check_input_file(a.trace, "--trace")
        # rates are set from the window below (1 s only lets the loader skip inferring them)
        adapters, requests = load_trace_csv(a.trace, duration_s=a.duration or 1.0)
        window = _trace_window(requests, a.trace, a.duration)
        counts = np.bincount(requests.adapter, minlength=len(adapters))
        adapters = [replace(x, rate=int(c) / window) for x, c in zip(adapters, counts)]
        check_ranks(profile, sorted({x.rank for x in adapters}), f"--trace {a.trace}")
        check_run_size(len(adapters), 0.0, window, "--trace")
        lengths_text = "from the trace"
        arrivals_text = "from the trace"
        late = int(np.count_nonzero(requests.arrival_s >= window))
    else:
        window = DEFAULT_DURATION_S if a.duration is None else a.duration
        lengths = parse_lengths(a.lengths)
        arrivals = parse_arrivals(a.arrivals)
        if a.adapters_file:
            check_input_file(a.adapters_file, "--adapters-file")
            adapters = load_adapters_csv(a.adapters_file)
            check_ranks(profile, sorted({x.rank for x in adapters}), f"--adapters-file {a.adapters_file}")
        else:
            ranks = parse_int_list("ranks", a.ranks)
            check_ranks(profile, ranks, "--ranks")
            rates = parse_float_list("rates", a.rates)
            n = a.adapters
            total = (n // len(rates)) * sum(rates) + sum(rates[:n % len(rates)])
            check_run_size(n, total, window, "--adapters/--rates/--duration")
            adapters = adapters_from_cycles(n, ranks, rates)
        check_run_size(len(adapters), sum(x.rate for x in adapters), window, "workload")
        lengths_text = (f"{a.lengths} (mean {lengths.mean_input:.0f} input / "
                        f"{lengths.mean_output:.0f} output tokens)")
        arrivals_text = a.arrivals
        late = 0
    top_rank = max(x.rank for x in adapters)
    if a.max_lora_rank is not None and a.max_lora_rank < top_rank:
        raise CliError(f"--max-lora-rank {a.max_lora_rank}: below the largest adapter rank "
                       f"{top_rank}")
    max_rank = a.max_lora_rank or top_rank
    total_rate = sum(x.rate for x in adapters)
    config = {"profile": profile.name, "gpu": profile.gpu, "model": profile.model,
              "max_loras": a.amax, "max_lora_rank": max_rank, "adapters": len(adapters),
              "total_rate_rps": total_rate, "ranks": sorted({x.rank for x in adapters}),
              "arrivals": arrivals_text, "lengths": lengths_text, "window_s": window,
              "seed": a.seed, "trace": a.trace, "adapters_file": a.adapters_file,
              "client_max_waiting": a.client_max_waiting}
    print(f"configuration: profile {profile.name} ({profile.gpu}, {profile.model}); "
          f"--max-loras (Amax) {a.amax}, --max-lora-rank {max_rank}")
    print(f"  workload: {len(adapters):,} adapters (ranks {', '.join(map(str, config['ranks']))}; "
          f"total {total_rate:,.4g} req/s), arrivals {arrivals_text}, lengths {lengths_text}")
    src = f"trace {a.trace}" if a.trace else (f"adapters file {a.adapters_file}" if a.adapters_file
                                              else f"--ranks {a.ranks} --rates {a.rates} cycled")
    default_note = " (the trace's span)" if a.trace and a.duration is None else ""
    print(f"  source: {src}; window {window:g} s{default_note}; seed {a.seed}")
    if a.trace and float(requests.arrival_s.min()) > 0.1 * window:
        print(f"  note: the first arrival is at {float(requests.arrival_s.min()):g} s; the window "
              "starts at 0 s (arrival_s counts from the start of the trace)")
    if late:
        print(f"  note: {late:,} requests of the trace arrive after the window and are not "
              "replayed")
    if a.trace:
        m = simulate_requests(profile, adapters, requests, cfg, window)
    else:
        m = simulate_server(profile, adapters, cfg, window, lengths=lengths, arrivals=arrivals,
                            seed=a.seed)
    d = m.to_dict()
    print()
    print_metrics(d)
    print()
    for line in describe_run(m, cfg.starvation_threshold):
        print(line)
    if json_out is not None:
        write_output(json_out, json.dumps({"configuration": config, **d}, indent=2,
                                          default=float))
        print(f"wrote {json_out}")
    return 0


# ------------------------------------------------------------------------------ maxpack
def cmd_maxpack(a: argparse.Namespace) -> int:
    from .maxpack import AMAX_GRID, N_GRID, maxpack_search

    profile = _load_profile(a.profile)
    rates = parse_float_list("rates", a.rates)
    ranks = parse_int_list("ranks", a.ranks)
    check_ranks(profile, ranks, "--ranks")
    lengths = parse_lengths(a.lengths)
    check_run_size(max(N_GRID), max(rates) * max(N_GRID), a.duration, "--rates/--duration")
    amaxes = [x for x in AMAX_GRID if profile.kv_tokens(x, max(ranks)) is not None]
    if not amaxes:
        raise CliError(f"--ranks: no Amax of the grid {list(AMAX_GRID)} starts at max rank "
                       f"{max(ranks)} on profile '{profile.name}'")
    bound = sum(sum(1 for n in N_GRID if n >= x) for x in amaxes)
    print(f"configuration: profile {profile.name} ({profile.gpu}); rates {a.rates} req/s and "
          f"ranks {a.ranks} cycled over the adapters; Amax grid {amaxes}; N grid "
          f"{list(N_GRID)}; window {a.duration:g} s; seed {a.seed}", flush=True)
    with progress(total=bound, desc="maxpack (twin runs, at most)", quiet=a.quiet,
                  unit="run") as bar:
        res = maxpack_search(profile, rates, ranks, lengths=lengths, duration_s=a.duration,
                             seed=a.seed, on_point=lambda p: bar.update(1))
    print(f"{'amax':>5} {'n':>5} {'throughput':>12} {'offered':>12}  starved  memory_error")
    print(f"{'':>5} {'':>5} {'tok/s':>12} {'tok/s':>12}")
    for p in res.points:
        print(f"{p.max_loras:5d} {p.served_adapters:5d} {p.metrics.throughput_tps:12,.1f} "
              f"{p.metrics.offered_realised_tps:12,.1f}  {str(p.metrics.starved):7}  "
              f"{p.metrics.memory_error}")
    if res.served_adapters == 0:
        print(f"maxpack: no configuration serves even the smallest count of the grid without "
              f"starving (served_adapters=0): lower the rates or use another GPU profile")
        return 1
    print(f"maxpack served_adapters={res.served_adapters} max_loras={res.max_loras} "
          f"throughput_tps={res.throughput_tps:.1f} (tok/s)")
    return 0


# ------------------------------------------------------------------------------ calibrate
def cmd_calibrate(a: argparse.Namespace) -> int:
    out = check_output(a.out, "--out", a.force)
    data = Path(a.data)
    if not data.exists():
        raise CliError(f"--data: {data} does not exist")
    if not data.is_dir():
        raise CliError(f"--data: {data} is not a directory")
    from .calibrate import calibrate

    profile, report = calibrate(data, a.model, name=a.name, refine=a.refine)
    print(json.dumps(report, indent=2, default=float))
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.to_json(out)
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    fmt = HelpFormatter
    p = argparse.ArgumentParser(prog="python -m twin",
                                description="Digital twin of a vLLM multi-LoRA server.",
                                epilog=EXIT_CODES_EPILOG)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="simulate one server and print its metrics", formatter_class=fmt,
                       epilog=EXIT_CODES_EPILOG,
                       description="Simulate one vLLM server: print the configuration, every "
                                   "metric with its unit, and what they mean.")
    r.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="GPU profile: a shipped name (twin/profiles/<name>.json) or a JSON path")
    r.add_argument("--amax", type=positive_int, default=32,
                   help="--max-loras of the server (GPU adapter slots)")
    r.add_argument("--max-lora-rank", type=positive_int, default=None,
                   help="--max-lora-rank of the server (default: the largest adapter rank); "
                        "must be a rank the profile supports")
    r.add_argument("--client-max-waiting", type=positive_int, default=None, metavar="N",
                   help="load generator property: the client keeps at most N requests waiting "
                        "at the server and arrivals beyond that fail (the shared benchmark's "
                        "client: ~25500); default: unbounded")
    r.add_argument("--adapters", type=positive_int, default=None,
                   help="number of adapters, ranks and rates cycled over them (default 384)")
    r.add_argument("--ranks", default="16", help="LoRA ranks cycled over the adapters, e.g. 8,16,32")
    r.add_argument("--rates", default="0.1,0.05,0.025",
                   help="request rates (req/s) cycled over the adapters")
    r.add_argument("--adapters-file", default=None,
                   help="CSV with columns id,rank,rate (rate in req/s) instead of --adapters")
    r.add_argument("--trace", default=None,
                   help="CSV arrival_s,adapter_id,input_tokens,output_tokens,rank to replay "
                        "(adapters and lengths come from it)")
    r.add_argument("--arrivals", default="poisson", help="poisson | gamma:CV | lognormal:CV")
    r.add_argument("--lengths", default="sharegpt",
                   help="sharegpt | sharegpt:IN,OUT (mean tokens) | fixed:IN,OUT")
    r.add_argument("--duration", type=positive_float, default=None,
                   help="simulated window in seconds (default: 3600, or a trace's span)")
    r.add_argument("--seed", type=seed_type, default=0, help="workload seed (0 .. 2^32-1)")
    r.add_argument("--json", default=None, help="also write the configuration and every metric "
                                                "(JSON) to this file")
    r.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("maxpack", help="largest non-starving adapter count and best Amax",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                       description="For each Amax of the grid, walk the adapter count N up "
                                   "while one GPU serves the mix without starving; report the "
                                   "best point (exit 1 when no point passes).")
    m.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="GPU profile: a shipped name or a JSON path")
    m.add_argument("--rates", required=True, help="request rates (req/s) cycled over the adapters")
    m.add_argument("--ranks", required=True, help="LoRA ranks cycled over the adapters")
    m.add_argument("--lengths", default="sharegpt",
                   help="sharegpt | sharegpt:IN,OUT (mean tokens) | fixed:IN,OUT")
    m.add_argument("--duration", type=float_above(0.0), default=DEFAULT_DURATION_S,
                   help="simulated window of each twin run, seconds")
    m.add_argument("--seed", type=seed_type, default=0, help="workload seed (0 .. 2^32-1)")
    m.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    m.set_defaults(func=cmd_maxpack)

    c = sub.add_parser("calibrate", help="fit a GpuProfile from profiling CSVs",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG)
    c.add_argument("--data", required=True,
                   help="folder with the profiling CSVs (or with a calibration/ subfolder)")
    c.add_argument("--model", required=True, help="base model name as in the CSVs")
    c.add_argument("--out", required=True, help="profile JSON to write")
    c.add_argument("--name", default=None, help="profile name (default: the model name)")
    c.add_argument("--refine", action="store_true",
                   help="add the simulation-consistent refit on the shared scheduler runs")
    c.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    c.set_defaults(func=cmd_calibrate)

    from .serve import cli as serve_cli      # argparse only; the server loads when it runs
    s = sub.add_parser("serve", help="OpenAI-compatible vLLM stand-in timed by the twin",
                       description=serve_cli.DESCRIPTION, epilog=serve_cli.EPILOG,
                       formatter_class=serve_cli._Formatter)
    serve_cli.add_arguments(s)
    s.set_defaults(func=serve_cli.serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "run":
        args.adapters_given = args.adapters is not None
        if args.adapters is None:
            args.adapters = 384
    return run_command(lambda: args.func(args))
