"""Command line of ``python -m twin serve`` (also ``python -m twin.serve``); flags mirror
``vllm serve``. Every flag and every ``--lora-modules`` adapter is checked before the server
listens; bad input is one ``error: ...`` line (exit 2)."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Sequence

from ..cli_support import (EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError, HelpFormatter,
                           int_at_least, positive_int, run_command, seed_type)
# ranges of the flags the twin can simulate (checked in config_from_args; --help states them)
from ..limits import MAX_NUM_BATCHED_TOKENS_MAX, MAX_NUM_SEQS_MAX, TIME_SCALE_RANGE

DEFAULT_PROFILE = "llama-3.1-8b-instruct"

DESCRIPTION = """\
An OpenAI-compatible HTTP server that behaves like one vLLM 0.8.5 (V1) multi-LoRA server on the
profile's GPU, with no GPU: every request is scheduled by the twin (continuous batching, chunked
prefill, KV blocks and preemption, at most --max-loras adapters per batch with LRU slots and the
profile's adapter load time, the rank-aware step time) and its tokens are sent when the twin's
clock reaches them.

Time: the twin's clock runs --time-scale times faster than wall time (--time-scale 10: one wall
second = ten twin seconds). Every latency the server reports (/metrics, twin_timing) is twin time,
i.e. what the GPU would show; a client measuring wall time multiplies by --time-scale.

Routes: GET /health, GET|POST /ping, GET /version, GET /v1/models, POST /v1/completions,
POST /v1/chat/completions, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter,
GET /metrics (vLLM's metric names of --vllm-version). Request fields are checked as vLLM checks
them; fields the twin cannot honour (n > 1, logprobs, echo, best_of, guided decoding, tools ...)
are refused by name with vLLM's 400 error body, fields that only choose token values
(temperature, top_p, seed ...) are accepted and named in the X-Twin-Not-Modelled header.
When ready it prints one line 'listening on http://HOST:PORT' (--port 0 picks a free port).
"""

EPILOG = ("example: python -m twin serve --profile llama-3.1-8b-instruct --enable-lora "
          "--max-loras 8 --max-lora-rank 16 --lora-modules a0=/path/to/peft_dir --port 0 "
          "--time-scale 10.  exit codes: 0 stopped by SIGTERM; 2 bad input (the message names "
          "the flag, adapter or file); 130 interrupted (Ctrl-C).")


MAX_NAME_LEN = 256                # longest --served-model-name / adapter name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m twin serve", description=DESCRIPTION,
                                epilog=EPILOG, formatter_class=_Formatter)
    add_arguments(p)
    return p


def _one_line_error(message: str):
    """argparse's error(), as one ``error: ...`` line (no usage block), exit 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class _Formatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``twin serve`` (shared by ``python -m twin serve`` and
    ``python -m twin.serve``). Ranges are checked by :func:`config_from_args`, so a bad value
    is one ``error: --flag ...`` line (exit 2)."""
    p.error = _one_line_error            # type: ignore[method-assign]
    lo, hi = TIME_SCALE_RANGE
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="GPU profile: a shipped name (twin/profiles/<name>.json) or a JSON path")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback default)")
    p.add_argument("--port", type=int_at_least(0, 65535), default=8000,
                   help="TCP port in [0, 65535]; 0 picks a free port")
    p.add_argument("--served-model-name", default=None,
                   help="name of the base model in the API (default: the profile's model); "
                        f"non-empty, at most {MAX_NAME_LEN} characters, no surrounding spaces")
    p.add_argument("--vllm-version", default=None, metavar="X.Y.Z",
                   help="vLLM release to speak: /metrics names and buckets, /version, the error "
                        "body shape (default: the profile's measured release, 0.8.5 for the "
                        "shipped profiles); 0.8.0 or later (earlier releases default to the V0 "
                        "engine); releases after 0.12 follow 0.12's names. Only the API "
                        "surface follows it: the scheduling rules and timing stay those of "
                        "0.8.5, which the twin was checked against")
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    p.add_argument("--max-loras", type=positive_int, default=1,
                   help="GPU adapter slots = most distinct adapters in one batch (Amax); >= 1, "
                        "and the profile must have a KV capacity for (--max-loras, "
                        "--max-lora-rank), else vLLM would not start")
    p.add_argument("--max-cpu-loras", type=positive_int, default=None,
                   help="adapters kept in CPU memory (vLLM: >= --max-loras; default "
                        "--max-loras). The twin, like the batch twin, keeps every registered "
                        "adapter's CPU copy: set it to at least the number of adapters")
    p.add_argument("--max-lora-rank", type=positive_int, default=16,
                   help="largest adapter rank; every slot is sized for it (one of the "
                        "profile's ranks, 8/16/32 for the shipped profiles)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most requests in a batch (default: the profile's value); in [1, "
                        f"{MAX_NUM_SEQS_MAX:,}] and <= --max-num-batched-tokens (as vLLM)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step (chunked prefill, as vLLM V1; default: the "
                        "profile's value); >= --max-num-seqs (vLLM refuses less) and <= "
                        f"{MAX_NUM_BATCHED_TOKENS_MAX:,} (the step-time model was fitted at the "
                        "profile's value; larger budgets extrapolate it)")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help="adapters to serve at start: name=path of a PEFT directory (its rank is "
                        "'r' in adapter_config.json)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="twin seconds per wall second (10 = ten times faster than real time); "
                        f"in [{lo:g}, {hi:g}]: beyond ~200 this machine's engine cannot keep up "
                        "and the server only falls behind (twin:virtual_clock_lag_seconds)")
    p.add_argument("--seed", type=seed_type, default=0,
                   help="seed of the output-length draws (requests without ignore_eos); in [0, "
                        "2**32 - 1]")


def config_from_args(a: argparse.Namespace):
    """Check every flag and adapter (``CliError`` naming it) and build the ``ServeConfig``."""
    from ..profile import load_profile
    from .adapters import AdapterError, AdapterRegistry, parse_lora_module
    from .app import ServeConfig
    from .engine import EngineSettings

    from .metrics import VllmRelease

    try:
        profile = load_profile(a.profile)
    except (OSError, ValueError) as e:
        raise CliError(f"--profile: {e}") from None
    _check_ranges(a, profile)
    version = a.vllm_version or (profile.serving or {}).get("vllm_version") or "0.8.5"
    try:
        VllmRelease.parse(version)
    except ValueError as e:
        raise CliError(f"--vllm-version {version}: {e}") from None

    if a.lora_modules and not a.enable_lora:
        raise CliError("--lora-modules: LoRA is not enabled; add --enable-lora")
    max_cpu = a.max_cpu_loras if a.max_cpu_loras is not None else a.max_loras
    if a.enable_lora and max_cpu < a.max_loras:
        raise CliError(f"--max-cpu-loras {max_cpu}: must be >= --max-loras {a.max_loras} "
                       "(as in vLLM)")
    max_loras = a.max_loras if a.enable_lora else 0
    try:
        settings = EngineSettings.from_profile(profile, max_loras, a.max_lora_rank,
                                               a.max_num_seqs, a.max_num_batched_tokens)
    except ValueError as e:
        raise CliError(str(e)) from None
    name = a.served_model_name or profile.model
    modules: list[tuple[str, str]] = []
    registry = AdapterRegistry(profile, a.max_lora_rank, name)
    try:
        for text in a.lora_modules:
            mname, path = parse_lora_module(text)
            registry.add(mname, path, f"--lora-modules {text}")
            modules.append((mname, path))
    except AdapterError as e:
        raise CliError(str(e)) from None
    if a.enable_lora and len(modules) > max_cpu:
        print(f"warning: {len(modules)} --lora-modules > --max-cpu-loras {max_cpu}: vLLM would "
              "reload evicted adapters from disk; the twin keeps every adapter in CPU memory "
              "(its load time is the CPU->GPU one)", file=sys.stderr)
    del settings
    return ServeConfig(profile=profile, served_model_name=name, max_loras=max_loras,
                       max_lora_rank=a.max_lora_rank, max_cpu_loras=max_cpu,
                       max_num_seqs=a.max_num_seqs,
                       max_num_batched_tokens=a.max_num_batched_tokens,
                       lora_modules=tuple(modules), time_scale=a.time_scale, seed=a.seed,
                       host=a.host, port=a.port, vllm_version=version)


def _check_ranges(a: argparse.Namespace, profile) -> None:
    """Refuse what vLLM refuses and what the twin cannot simulate, naming the flag."""
    import math

    lo, hi = TIME_SCALE_RANGE
    if not (math.isfinite(a.time_scale) and lo <= a.time_scale <= hi):
        raise CliError(f"--time-scale {a.time_scale:g}: must be in [{lo:g}, {hi:g}] twin seconds "
                       "per wall second")
    name = a.served_model_name
    if name is not None and (not name.strip() or name != name.strip()
                             or len(name) > MAX_NAME_LEN):
        raise CliError(f"--served-model-name {name!r}: must be a non-empty name of at most "
                       f"{MAX_NAME_LEN} characters without surrounding spaces")
    seqs = a.max_num_seqs if a.max_num_seqs is not None else profile.max_num_seqs
    if not 1 <= seqs <= MAX_NUM_SEQS_MAX:
        raise CliError(f"--max-num-seqs {seqs}: must be in [1, {MAX_NUM_SEQS_MAX:,}]")
    tokens = (a.max_num_batched_tokens if a.max_num_batched_tokens is not None
              else profile.max_num_batched_tokens)
    if tokens > MAX_NUM_BATCHED_TOKENS_MAX:
        raise CliError(f"--max-num-batched-tokens {tokens}: must be <= "
                       f"{MAX_NUM_BATCHED_TOKENS_MAX:,}")
    if tokens < seqs:
        raise CliError(f"--max-num-batched-tokens {tokens}: must be >= --max-num-seqs {seqs} "
                       f"(vLLM: max_num_batched_tokens ({tokens}) must be greater than or equal "
                       f"to max_num_seqs ({seqs}))")
    if not a.host.strip():
        raise CliError("--host: empty address")


def serve(a: argparse.Namespace) -> int:
    """Run the server until SIGTERM (exit 0) or Ctrl-C (exit 130)."""
    cfg = config_from_args(a)
    import asyncio                  # here, not at module level: `twin run` builds this parser

    from .app import serve_forever

    how: dict[str, int] = {}

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig, code in ((signal.SIGTERM, EXIT_OK), (signal.SIGINT, EXIT_INTERRUPTED)):
            loop.add_signal_handler(sig, lambda c=code: (how.setdefault("code", c), stop.set()))
        await serve_forever(cfg, stop)

    try:
        asyncio.run(main())
    except OSError as e:
        raise CliError(f"--host {a.host} --port {a.port}: cannot listen ({e.strerror or e})") \
            from None
    code = how.get("code", EXIT_OK)
    if code == EXIT_INTERRUPTED:
        print("interrupted", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(lambda: serve(args))
