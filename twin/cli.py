"""Command line of the twin: ``python -m twin run|maxpack|calibrate|derive|calibrate-power|serve``.

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

from .cli_support import (EXIT_CODES_EPILOG, SLO_HELP, CliError, HelpFormatter,
                          check_input_file, check_output, float_above, positive_float,
                          positive_int, progress, run_command, seed_type, slo_argument,
                          write_output)
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
    from .lengths import FixedLengths
    from .sharegpt import default_lengths, sharegpt_lengths

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


def _load_profile(name: str, option: str = "--profile") -> GpuProfile:
    try:
        return load_profile(name)
    except (OSError, ValueError) as e:
        raise CliError(f"{option}: {e}") from None


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
    "gpu_busy_frac": "fraction", "avg_power_w": "W", "energy_j": "J",
    "joules_per_token": "J/token", "joules_per_output_token": "J/output token",
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
                       client_max_waiting=a.client_max_waiting, power_cap_w=a.power_cap)
    _check_power_cap(profile, a.power_cap)
    if a.trace:
        check_input_file(a.trace, "--trace")
        # rates are set from the window below (1 s only lets the loader skip inferring them)
        adapters, requests = load_trace_csv(a.trace, duration_s=a.duration or 1.0,
                                            max_model_len=profile.max_model_len)
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
              "client_max_waiting": a.client_max_waiting, "power_cap_w": a.power_cap,
              "derived_from": profile.derived_from.get("profile") if profile.is_derived else None}
    cap_text = "" if a.power_cap is None else f", --power-cap {a.power_cap:g} W"
    print(f"configuration: profile {profile.label()} ({profile.gpu}, {profile.model}); "
          f"--max-loras (Amax) {a.amax}, --max-lora-rank {max_rank}{cap_text}")
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
    from .headroom import describe as describe_headroom       # twin.headroom
    for line in describe_headroom(profile, a.amax, len(adapters), m, cfg.starvation_threshold):
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
    slo = slo_argument(a.slo)
    plot = _check_plot(a.plot, a.force)
    cliff = slo is not None or plot is not None or a.adapters is not None
    if slo is not None and a.duration <= slo.warmup_s:
        raise CliError(f"--duration {a.duration:g}: must exceed the SLO's warm-up of "
                       f"{slo.warmup_s:g} s (--slo warmup_s), else no request is judged")
    if a.adapters is not None:
        n = a.adapters
        _check_cliff_size(rates, n, a.duration)
        print(f"configuration: profile {profile.label()} ({profile.gpu}); {n} adapters, rates "
              f"{a.rates} req/s and ranks {a.ranks} cycled over them; window {a.duration:g} s; "
              f"seed {a.seed} (--adapters: no Maxpack search)", flush=True)
        return _maxpack_cliff(a, profile, rates, ranks, lengths, slo, plot, n)
    check_run_size(max(N_GRID), max(rates) * max(N_GRID), a.duration, "--rates/--duration")
    if cliff:
        _check_cliff_size(rates, max(N_GRID), a.duration)
    amaxes = [x for x in AMAX_GRID if profile.kv_tokens(x, max(ranks)) is not None]
    if not amaxes:
        raise CliError(f"--ranks: no Amax of the grid {list(AMAX_GRID)} starts at max rank "
                       f"{max(ranks)} on profile '{profile.name}'")
    bound = sum(sum(1 for n in N_GRID if n >= x) for x in amaxes)
    print(f"configuration: profile {profile.label()} ({profile.gpu}); rates {a.rates} req/s and "
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
        print("maxpack: no configuration serves even the smallest count of the grid without "
              "starving (served_adapters=0): lower the rates or use another GPU profile")
        return 1
    print(f"maxpack served_adapters={res.served_adapters} max_loras={res.max_loras} "
          f"throughput_tps={res.throughput_tps:.1f} (tok/s)")
    if not cliff:
        return 0
    print()
    print(f"residency cliff of the {res.served_adapters} adapters Maxpack serves "
          "(--adapters N: another count)")
    return _maxpack_cliff(a, profile, rates, ranks, lengths, slo, plot, res.served_adapters)


def _mix_rate(rates: Sequence[float], n: int) -> float:
    """Total request rate of ``n`` adapters with ``rates`` cycled over them."""
    return (n // len(rates)) * sum(rates) + sum(rates[:n % len(rates)])


def _check_cliff_size(rates: Sequence[float], n: int, duration: float) -> None:
    """The cliff's largest replay (2n adapters of the mix: its adapter sweep) within limits."""
    check_run_size(n, _mix_rate(rates, n), duration, "--adapters/--rates/--duration")
    check_run_size(2 * n, _mix_rate(rates, 2 * n), duration,
                   f"--adapters/--rates/--duration (the cliff's adapter sweep goes to 2 x {n} "
                   "adapters)")


def _check_plot(path: str | None, force: bool) -> Path | None:
    """``--plot``: a new file (or ``--force``) whose extension matplotlib writes."""
    out = check_output(path, "--plot", force)
    if out is None:
        return None
    from .cliff import plot_formats
    ext = out.suffix.lower().lstrip(".")
    formats = plot_formats()
    if ext not in formats:
        raise CliError(f"--plot {path}: the file name must end in an image format matplotlib "
                       f"writes ({', '.join('.' + f for f in sorted(formats))}), e.g. cliff.png")
    return out


def _maxpack_cliff(a: argparse.Namespace, profile: GpuProfile, rates, ranks, lengths, slo,
                   plot: Path | None, n: int) -> int:
    """The residency-cliff sweeps of ``n`` adapters (``twin.cliff``): tables, the recommended
    vLLM flags, the figure; exit 1 when no max_loras is accepted."""
    from .cliff import ladder, cliff_sweep, plot_cliff, table_lines

    _check_cliff_size(rates, n, a.duration)
    top = profile.max_startable_amax(max(ranks))
    if top < 1:
        raise CliError(f"--ranks: no max_loras starts at max rank {max(ranks)} on profile "
                       f"'{profile.name}'")
    hi = min(n + 1, top)
    runs = len(ladder(hi, near=(n,))) + len(ladder(2 * n, near=(n, min(n, top))))
    slo_text = f"; SLO {slo.describe()}" if slo is not None else "; no latency SLO (--slo)"
    print(f"sweeps: max_loras 1..{hi} with {n} adapters, then adapters 1..{2 * n} at the "
          f"recommended max_loras; max_lora_rank {max(ranks)}; window {a.duration:g} s; seed "
          f"{a.seed}{slo_text}", flush=True)
    with progress(total=runs, desc="cliff (twin runs, about)", quiet=a.quiet, unit="run") as bar:
        rep = cliff_sweep(profile, rates, ranks, n, slo=slo, duration_s=a.duration,
                          lengths=lengths, seed=a.seed, on_point=lambda p: bar.update(1))
    print()
    print(f"against max_loras ({n} adapters; * recommended, > more adapters than slots):")
    for line in table_lines(rep.by_max_loras, rep.recommended):
        print(line)
    if rep.by_adapters is not None:
        print()
        print(f"against the number of adapters (max_loras {rep.by_adapters.fixed}"
              f"{'' if rep.recommended is not None else ', none accepted: min(adapters, largest startable)'}):")
        for line in table_lines(rep.by_adapters):
            print(line)
    print()
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_cliff(rep, plot)
    if rep.recommended is None:
        why = ("meets the SLO without starving" if slo is not None
               else "serves the mix without starving")
        print(f"cliff: no max_loras in 1..{hi} {why} with {n} adapters: fewer adapters per GPU "
              "(the Maxpack search above, or a smaller --adapters), a looser --slo or another "
              "GPU profile")
        b = rep.by_adapters
        most = max((q.adapters for q in b.points if q.accepted), default=None) if b else None
        if most is not None:
            print(f"  the adapter sweep: at max_loras {b.fixed}, at most {most} adapters of the "
                  "mix are accepted (--adapters "
                  f"{most} recommends a max_loras for that count)")
        if plot is not None:
            print(f"wrote {plot}")
        return 1
    p = rep.point(rep.recommended)
    print(f"recommended: max_loras {rep.recommended} for {n} adapters: throughput "
          f"{p.throughput_tps:,.1f} of {p.offered_tps:,.1f} tok/s offered, p99 TTFT "
          f"{p.p99_ttft_ms:,.1f} ms, p99 ITL {p.p99_itl_ms:,.1f} ms"
          + (f", meets {slo.describe()}" if slo is not None else ""))
    edge = rep.point(rep.recommended - 1)
    if edge is not None and not edge.accepted:
        why = ("starved" if edge.starved else "misses the SLO" if edge.slo_met is False
               else "not accepted")
        print(f"  one slot fewer (max_loras {edge.max_loras}): {why}, p99 TTFT "
              f"{edge.p99_ttft_ms:,.1f} ms")
    if slo is None and rep.recommended < n:
        print(f"  note: no --slo, and the 90 % rule does not bound latency: with {n} adapters "
              f"on {rep.recommended} slots requests wait for a slot (p99 TTFT "
              f"{p.p99_ttft_ms / 1000:,.1f} s); state --slo to stay off the residency cliff")
    print("vLLM flags: " + " ".join(rep.flags) + f"  (plus --lora-modules for the {n} adapters)")
    if plot is not None:
        print(f"wrote {plot}")
    return 0


# ------------------------------------------------------------------------------ calibrate
def cmd_calibrate(a: argparse.Namespace) -> int:
    out = check_output(a.out, "--out", a.force)
    data = Path(a.data)
    if not data.exists():
        raise CliError(f"--data: {data} does not exist")
    if not data.is_dir():
        raise CliError(f"--data: {data} is not a directory")
    if a.workers is not None and a.workers < 1:
        raise CliError(f"--workers: must be >= 1, got {a.workers}")
    from .calibrate import calibrate
    from .profile import GpuProfile

    profile, report = calibrate(data, a.model, name=a.name, refine=a.refine,
                                slots=not a.no_slot_fit, workers=a.workers)
    print(json.dumps(report, indent=2, default=float))
    kept = _sections_calibrate_does_not_fit(out)
    if kept:
        profile = GpuProfile.from_dict({**profile.to_dict(include_serving=True), **kept})
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.to_json(out)
    if kept:
        print(f"kept the {', '.join(sorted(kept))} section(s) of the existing {out} "
              "(calibration does not fit them)")
    print(f"wrote {out}")
    return 0


def _sections_calibrate_does_not_fit(path: Path) -> dict:
    """The serving settings and power model of a profile about to be overwritten (``--force``):
    calibration fits neither, so regenerating a profile keeps them."""
    if not path.is_file():
        return {}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in ("serving", "power") if isinstance(old, dict) and old.get(k)}


# ------------------------------------------------------------------------------ power, derive
def _check_power_cap(profile: GpuProfile, cap: float | None) -> None:
    """A cap needs a power model and must lie above the GPU's idle power."""
    if cap is None:
        return
    from .power import PowerModelError, check_cap, power_model_for

    pm = power_model_for(profile)
    if pm is None:
        raise CliError(f"--power-cap: profile '{profile.name}' has no power model (GPU "
                       f"'{profile.gpu}' or model '{profile.model}' is not in the catalog)")
    try:
        check_cap(cap, pm)
    except PowerModelError as e:
        raise CliError(f"--power-cap: {e}") from None


def cmd_derive(a: argparse.Namespace) -> int:
    from .derive import derive_profile, measured_profile
    from .gpu_catalog import gpu_spec
    from .model_configs import model_config

    out = check_output(a.out, "--out", a.force)
    source = _load_profile(a.source, "--from")
    try:
        gpu = gpu_spec(a.gpu)
    except ValueError as e:
        raise CliError(f"--gpu: {e}") from None
    try:
        model = model_config(a.model)
    except ValueError as e:
        raise CliError(f"--model: {e}") from None
    src_gpu = src_model = None
    try:
        if a.from_gpu:
            src_gpu = gpu_spec(a.from_gpu)
    except ValueError as e:
        raise CliError(f"--from-gpu: {e}") from None
    try:
        if a.from_model:
            src_model = model_config(a.from_model)
    except ValueError as e:
        raise CliError(f"--from-model: {e}") from None
    measured = measured_profile(gpu.id, model.id)
    if measured is not None and measured.name != source.name:
        print(f"note: a measured profile exists for ({gpu.id}, {model.id}): '{measured.name}'; "
              "a measured profile always wins - use it rather than this derived one")
    prof = derive_profile(source, gpu, model, src_gpu=src_gpu, src_model=src_model, name=a.name)
    r = prof.derived_from["step_time_ratios"]
    mem = prof.derived_from["memory"]
    print(f"derived profile {prof.name} ({gpu.id}, {model.id}) from {source.name} "
          f"({source.gpu}, {source.model}); public facts only")
    print(f"  memory: budget {mem['budget_bytes'] / 2**30:.2f} GiB (0.9 x usable), weights "
          f"{mem['weight_bytes'] / 2**30:.2f} GiB, reserve {mem['backbone_reserve_bytes'] / 2**30:.2f}"
          f" GiB, KV {mem['kv_bytes_per_token']:,} B/token -> backbone "
          f"{prof.backbone_kv_tokens:,} KV tokens; {len(prof.kv_capacity)} (max_loras, rank) "
          f"configurations start")
    print(f"  step time: compute x{r['compute_time'] * r['model_flops_per_token']:.3f} per token, "
          f"memory x{r['memory_time']:.3f} per byte, weights x{r['weight_bytes']:.3f}, KV bytes "
          f"x{r['kv_bytes_per_token']:.3f}; adapter load x{r['link_time']:.3f} (host link)")
    print(f"  power: idle {prof.power['idle_w']:g} W, max {prof.power['max_w']:g} W "
          f"({prof.power['source']})")
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.to_json(out)
    print(f"wrote {out}")
    return 0


def cmd_calibrate_power(a: argparse.Namespace) -> int:
    from dataclasses import replace as dc_replace
    from .power import PowerModelError, fit_power_model, power_model_for, read_nvidia_smi_log

    out = check_output(a.out, "--out", a.force)
    check_input_file(a.nvidia_smi, "--nvidia-smi")
    profile = _load_profile(a.profile)
    base = power_model_for(profile)
    if base is None:
        raise CliError(f"--profile: '{profile.name}' has no power model to refine (GPU "
                       f"'{profile.gpu}' or model '{profile.model}' is not in the catalog)")
    try:
        fit = fit_power_model(read_nvidia_smi_log(a.nvidia_smi), base, load=a.load)
    except PowerModelError as e:
        raise CliError(str(e)) from None
    pm = fit.model
    print(f"fitted on {fit.n_samples} samples of {a.nvidia_smi} ({a.load} load): idle "
          f"{pm.idle_w:.1f} W, max {pm.max_w:.1f} W, memory-bound power {pm.memory_power_w:.1f} W"
          f", alpha {pm.alpha:.3f}, clock exponent {pm.clock_exponent:.3f} "
          f"({'fitted' if fit.clock_exponent_fitted else 'kept: no busy samples at reduced clocks'}"
          f"); RMSE {fit.rmse_w:.1f} W")
    prof = dc_replace(profile, power=pm.to_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.to_json(out)
    print(f"wrote {out} (profile {profile.name} with the measured power model)")
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
    r.add_argument("--power-cap", type=positive_float, default=None, metavar="W",
                   help="GPU power cap in watts (like nvidia-smi -pl): compute-bound step terms "
                        "slow down (twin.power); default: no cap")
    r.add_argument("--json", default=None, help="also write the configuration and every metric "
                                                "(JSON) to this file")
    r.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("maxpack", help="largest non-starving adapter count and best Amax",
                       formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                       description="For each Amax of the grid, walk the adapter count N up "
                                   "while one GPU serves the mix without starving; report the "
                                   "best point (exit 1 when no point passes). With --slo, "
                                   "--plot or --adapters, then sweep max_loras for those "
                                   "adapters (the residency cliff: tail TTFT collapses once "
                                   "more adapters are active than slots) and print the "
                                   "recommended vLLM flags (exit 1 when no max_loras is "
                                   "accepted).")
    m.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="GPU profile: a shipped name or a JSON path")
    m.add_argument("--rates", required=True, help="request rates (req/s) cycled over the adapters")
    m.add_argument("--ranks", required=True, help="LoRA ranks cycled over the adapters")
    m.add_argument("--lengths", default="sharegpt",
                   help="sharegpt | sharegpt:IN,OUT (mean tokens) | fixed:IN,OUT")
    m.add_argument("--duration", type=float_above(0.0), default=DEFAULT_DURATION_S,
                   help="simulated window of each twin run, seconds")
    m.add_argument("--seed", type=seed_type, default=0, help="workload seed (0 .. 2^32-1)")
    m.add_argument("--slo", default=None, metavar="NAME=MS,...",
                   help=SLO_HELP + "; here: after the search, sweep max_loras and the adapter "
                        "count (twin.cliff), print the tables and the recommended vLLM flags "
                        "(the smallest accepted max_loras of best throughput)")
    m.add_argument("--plot", default=None, metavar="PNG",
                   help="after the search, sweep as --slo does and draw the residency cliff "
                        "(throughput, p99 TTFT, p99 ITL and active adapters against max_loras "
                        "and against the adapter count) to this image file")
    m.add_argument("--adapters", type=positive_int, default=None, metavar="N",
                   help="sweep N adapters of the mix instead of searching (default with --slo "
                        "or --plot: the count the search serves)")
    m.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
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
    c.add_argument("--no-slot-fit", action="store_true",
                   help="skip stage 4 (slot-dependent LoRA terms refitted on the model's "
                        "max-search runs, twin.slot_fit)")
    c.add_argument("--workers", type=int, default=None,
                   help="processes for the stage-4 replays (default: all cores)")
    c.add_argument("--force", action="store_true",
                   help="overwrite an existing --out file (its serving and power sections, "
                        "which calibration does not fit, are kept)")
    c.set_defaults(func=cmd_calibrate)

    dv = sub.add_parser("derive", help="profile for another GPU and/or base model from public facts",
                        formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                        description="Derive a profile from a measured one with the GPU catalog "
                                    "(twin/data/gpus.json) and model configs "
                                    "(twin/data/models.json): KV capacity by memory arithmetic, "
                                    "step-time terms by FLOPs/bandwidth ratios, adapter loads by "
                                    "host-link bandwidth (twin.derive). The result says it is "
                                    "derived in every report.")
    dv.add_argument("--from", dest="source", default=DEFAULT_PROFILE,
                    help="measured source profile: a shipped name or a JSON path")
    from .derive import GPU_SPEC_HELP, MODEL_CONFIG_HELP
    dv.add_argument("--gpu", required=True, help="GPU catalog id (H100-64GB, H100-80GB, "
                                                 "A100-80GB, H200, L40S) or a JSON spec file; "
                                                 + GPU_SPEC_HELP)
    dv.add_argument("--model", required=True, help="model config id (llama-3.1-8b-instruct, "
                                                   "qwen-2.5-7b-instruct) or a JSON config "
                                                   "file; " + MODEL_CONFIG_HELP)
    dv.add_argument("--from-gpu", default=None,
                    help="catalog id or JSON spec of the source profile's GPU (default: the "
                         "catalog entry named by its 'gpu' field); " + GPU_SPEC_HELP)
    dv.add_argument("--from-model", default=None,
                    help="config id or JSON of the source profile's model (default: the config "
                         "named by its 'model' field); " + MODEL_CONFIG_HELP)
    dv.add_argument("--name", default=None, help="profile name (default: <model>@<gpu>-derived)")
    dv.add_argument("--out", required=True, help="profile JSON to write")
    dv.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    dv.set_defaults(func=cmd_derive)

    cp = sub.add_parser("calibrate-power", help="fit a profile's power model on an nvidia-smi log",
                        formatter_class=fmt, epilog=EXIT_CODES_EPILOG,
                        description="Fit P = P_idle + (P_busy - P_idle) * u^alpha (u = "
                                    "utilization.gpu) and, when the log has busy samples at "
                                    "reduced SM clocks, the clock exponent of the cap model, on "
                                    "a log of nvidia-smi --query-gpu=timestamp,power.draw,"
                                    "utilization.gpu,clocks.sm --format=csv -l 1; write the "
                                    "profile with that power model.")
    cp.add_argument("--nvidia-smi", required=True, metavar="LOG", help="nvidia-smi CSV log")
    cp.add_argument("--profile", default=DEFAULT_PROFILE,
                    help="profile of the logged GPU and model: a shipped name or a JSON path")
    cp.add_argument("--load", choices=("compute", "decode"), default="compute",
                    help="what the log's busy phase ran: a compute-bound load (sets the maximum "
                         "power) or decode-heavy serving (sets the memory-bound power)")
    cp.add_argument("--out", required=True, help="profile JSON to write")
    cp.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    cp.set_defaults(func=cmd_calibrate_power)

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
