"""Command line: ``python -m twin.harness verify|profile``.

``verify`` replays a placement's workload on one live server per GPU (real vLLM, or ``twin
serve`` stand-ins on this machine) and reports throughput, starvation, TTFT/TPOT/ITL beside the
twin's prediction for the same requests. ``profile`` runs the profiling studies ``python -m twin
calibrate`` needs against a server and writes them in the calibration CSV schema.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from twin.cli_support import (EXIT_OK, EXIT_REJECTED, CliError, HelpFormatter, check_input_file,
                              check_output, float_above, positive_int, run_command, seed_type,
                              write_output)
from twin.limits import MAX_DURATION_S

EXIT_CODES = ("exit codes: 0 the run finished and no GPU starved (verify) / CSVs written "
              "(profile); 1 a GPU starved in the measurement (verify); 2 bad input or a server "
              "that fails (the message names the option, file or server); 130 interrupted")

VERIFY_ABOUT = """\
Replay a placement's workload on one live server per GPU and compare with the twin. The workload
is the one the twin verified the plan with (Poisson per adapter at rate x share, the instance's
length model, seed + GPU index) or a trace; prompts are random token-id lists of the drawn
lengths, outputs exact (ignore_eos). The report gives throughput (input+output tokens of
requests completed in the window / window), the 90 % starvation verdict, TTFT, TPOT and ITL per
GPU and pooled, beside the twin's replay of exactly the requests sent."""

VERIFY_GPU_STEPS = """\
Run on real GPUs (vLLM 0.8.5, the version the twin's scheduler rules were checked against):
  1. pip install -e ".[gpu]"     # vllm==0.8.5 and torch, on the GPU machine
  2. python -m optim solve INSTANCE.json --method greedy --json plan.json
  3. python -m twin.harness verify plan.json --instance INSTANCE.json --launch --server vllm \\
         --model meta-llama/Llama-3.1-8B-Instruct --gpu-ids 0,1 --duration 600 --out run/verify
     (one `vllm serve` per GPU of the plan on 127.0.0.1 with CUDA_VISIBLE_DEVICES=<id>, dummy
     PEFT adapters of the plan's ranks under --work-dir, the plan's --max-loras/--max-cpu-loras/
     --max-lora-rank and the profile's --max-num-seqs/--max-num-batched-tokens; servers are
     stopped at the end; their logs are in --work-dir/logs)
  or start the servers yourself (same flags; `vllm serve ... --lora-modules id=DIR ...`) and pass
     --endpoints http://HOST:PORT ... (one per GPU, plan order; every adapter id must be served)
  4. read run/verify.md (tables: measured | twin on the same requests | difference) and
     run/verify.json (all numbers). Use --time-scale 1 with real servers.
On a machine without GPU: --launch --server twin --time-scale 3 starts `python -m twin serve`
stand-ins instead (latencies are converted back to twin time; keep the scale low, the client's
and loopback jitter is multiplied by it)."""

PROFILE_GPU_STEPS = """\
Profile a new GPU or base model (vLLM 0.8.5):
  1. pip install -e ".[gpu]" on the GPU machine
  2. python -m twin.harness profile --model meta-llama/Llama-3.1-8B-Instruct --out prof/ \\
         --launch --server vllm --gpu-ids 0 --study full
     (restarts one `vllm serve` per configuration: no-LoRA decode and prefill runs, LoRA decode
     runs over adapter counts, with queues of skipped requests for the waiting-queue scan, LoRA
     prefill runs at max_lora_rank 8/16/32 for the rank term, the KV capacity of every
     (max_loras, max_lora_rank) from vllm:cache_config_info or the start-up log, adapter load
     times; several hours)
  3. python -m twin calibrate --data prof/ --model MODEL_NAME --out my-profile.json
  4. python -m twin run --profile my-profile.json ...   (or copy it into twin/profiles/)
Without GPU: --launch --server twin --profile NAME --time-scale 20 --study quick profiles twin
serve stand-ins (round trip: python -m experiments.profile_round_trip; the README lists which
coefficients it recovers)."""


class _Formatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown, description kept as written (the step-by-step GPU run)."""


def _work_dir(a: argparse.Namespace) -> Path:
    if a.work_dir:
        return Path(a.work_dir)
    d = Path(tempfile.mkdtemp(prefix="harness-"))
    print(f"work dir (dummy adapters, server logs): {d}", file=sys.stderr)
    return d


def cmd_verify(a: argparse.Namespace) -> int:
    from .dummy_adapters import write_rank_adapters
    from .launch import launch_servers
    from .plan_workload import plan_workload
    from .report import plot, to_json, to_markdown
    from .verify import check_endpoints, run_verify, server_specs

    out_json = check_output(f"{a.out}.json", "--out", a.force)
    out_md = check_output(f"{a.out}.md", "--out", a.force)
    out_plot = check_output(a.plot, "--plot", a.force)
    check_input_file(a.plan, "plan")
    if a.instance:
        check_input_file(a.instance, "--instance")
    if a.trace:
        check_input_file(a.trace, "--trace")
    if bool(a.endpoints) == bool(a.launch):
        raise CliError("give either --endpoints URL ... (running servers) or --launch")
    if a.endpoints and a.time_scale != 1.0 and a.server == "vllm":
        raise CliError("--time-scale: real vLLM runs in wall time; use 1")
    _check_servers_match_plan(a)       # mismatches first, before workloads, binaries, servers
    wl = plan_workload(a.plan, duration_s=a.duration, seed=a.seed, instance_path=a.instance,
                       trace=a.trace, max_requests=a.max_requests)
    if a.profile:
        from dataclasses import replace
        wl = replace(wl, gpus=tuple(replace(g, profile=a.profile) for g in wl.gpus))
    from twin.profile import ProfileError, load_profile
    for g in wl.gpus:
        try:
            load_profile(g.profile)
        except (ProfileError, FileNotFoundError, ValueError) as e:
            raise CliError(f"profile of GPU {g.gpu}: {e} (pass --profile)") from None
    if a.prompts:
        from .plan_workload import with_prompt_file
        check_input_file(a.prompts, "--prompts")
        wl = with_prompt_file(wl, a.prompts)
    if not a.quiet:
        print(f"{len(wl.gpus)} GPUs, {wl.n_requests} requests over {wl.duration_s:g} s "
              f"(twin time; {wl.duration_s / a.time_scale:.1f} s wall at time scale "
              f"{a.time_scale:g})", file=sys.stderr)
    if a.endpoints:
        urls = [u.rstrip("/") for u in a.endpoints]
        check_endpoints(wl, urls)
        result = run_verify(wl, urls, a.time_scale, "endpoints", quiet=a.quiet)
    else:
        work = _work_dir(a)
        ranks = {ad.rank for g in wl.gpus for ad in g.adapters}
        if a.adapter_dir:
            paths = {}
            for g in wl.gpus:
                for ad in g.adapters:
                    p = Path(a.adapter_dir) / ad.id
                    if not (p / "adapter_config.json").is_file():
                        raise CliError(f"--adapter-dir {a.adapter_dir}: no adapter "
                                       f"{ad.id}/adapter_config.json")
                    paths[ad.id] = str(p.resolve())
        else:
            model = load_profile(wl.gpus[0].profile).model
            dirs = write_rank_adapters(work / "adapters", ranks, model, a.model_config, a.seed or 0)
            paths = {ad.id: str(dirs[ad.rank].resolve()) for g in wl.gpus for ad in g.adapters}
        specs = server_specs(wl, paths)
        gpu_ids = a.gpu_ids.split(",") if a.gpu_ids else None
        profile = wl.gpus[0].profile
        if a.server == "twin" and len({g.profile for g in wl.gpus}) > 1:
            raise CliError("--profile: the plan's GPUs use different profiles; twin servers are "
                           "launched with one --profile")
        with launch_servers(specs, work / "logs", a.server, profile=profile,
                            time_scale=a.time_scale, seed=wl.seed, model=a.model,
                            gpu_ids=gpu_ids) as servers:
            urls = [s.url for s in servers]
            if not a.quiet:
                print("servers: " + " ".join(urls), file=sys.stderr)
            result = run_verify(wl, urls, a.time_scale, a.server, quiet=a.quiet,
                                logs=[s.log for s in servers])
    write_output(out_json, to_json(result))
    md = to_markdown(result)
    write_output(out_md, md)
    print(md)
    print(f"wrote {out_json} and {out_md}")
    if out_plot is not None:
        plot(result, out_plot)
        print(f"wrote {out_plot}")
    return EXIT_REJECTED if result.total_measured.starved else EXIT_OK


def _check_servers_match_plan(a: argparse.Namespace) -> None:
    """The plan's GPU count against --endpoints and --gpu-ids, and what a vLLM launch needs
    (--model, --gpu-ids, the `vllm` binary), checked before anything is built or started: a
    mismatch is named as such, not as a later failure (a missing binary, a refused
    connection)."""
    import shutil

    from .plan_workload import load_plan
    plan = load_plan(a.plan)
    n = len(plan.gpus)
    if a.endpoints and len(a.endpoints) != n:
        raise CliError(f"--endpoints: the plan has {n} GPUs, {len(a.endpoints)} endpoints "
                       f"given ({a.plan}: one endpoint per GPU, in plan order)")
    ids = [x.strip() for x in a.gpu_ids.split(",")] if a.gpu_ids else None
    if ids is not None:
        if any(not x for x in ids):
            raise CliError(f"--gpu-ids {a.gpu_ids!r}: an empty id (give comma-separated CUDA "
                           "device ids)")
        if len(set(ids)) != len(ids):
            raise CliError(f"--gpu-ids {a.gpu_ids!r}: a device id appears twice (one GPU per "
                           "server)")
        if a.launch and a.server == "vllm" and len(ids) != n:
            raise CliError(f"--gpu-ids {a.gpu_ids}: the plan has {n} GPUs, {len(ids)} GPU ids "
                           f"given ({a.plan}: one CUDA device per server, in plan order)")
    if a.launch and a.server == "vllm":
        if not a.model:
            raise CliError("--model: needed to launch vllm servers (HF id or local path)")
        if ids is None:
            raise CliError(f"--gpu-ids: needed to launch vllm servers (the plan {a.plan} has "
                           f"{n} GPU(s): one CUDA device id each)")
        if shutil.which("vllm") is None:
            raise CliError("--server vllm: no `vllm` command on PATH (install the [gpu] extra: "
                           "pip install -e \".[gpu]\")")


def cmd_profile(a: argparse.Namespace) -> int:
    from .profile_runs import run_profile_cli
    return run_profile_cli(a)


def _add_server_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launch", action="store_true",
                   help="start one server per GPU (see --server) and stop them at the end")
    p.add_argument("--server", choices=("twin", "vllm"), default="twin",
                   help="what --launch starts: `python -m twin serve` (CPU stand-in) or "
                        "`vllm serve` (needs the [gpu] extra and GPUs)")
    p.add_argument("--time-scale", type=float_above(0.0, 1000.0), default=1.0, metavar="X",
                   help="twin servers: the twin clock runs X times faster than wall time; "
                        "measured times are multiplied by X (1 for real vLLM)")
    p.add_argument("--model", default=None,
                   help="vllm: the base model to serve (HF id or local path)")
    p.add_argument("--model-config", default=None, metavar="CONFIG_JSON",
                   help="HF config.json of the base model, to shape dummy adapters (built in "
                        "for the profiled Llama-3.1-8B and Qwen-2.5-7B)")
    p.add_argument("--gpu-ids", default=None, metavar="IDS",
                   help="vllm: comma-separated CUDA device ids, one per server")
    p.add_argument("--work-dir", default=None,
                   help="folder for dummy adapters and server logs (default: a new temp dir)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m twin.harness", description=__doc__.split("\n")[0],
                                 epilog=EXIT_CODES)
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser(
        "verify", formatter_class=_Formatter,
        help="replay a plan on live servers and compare with the twin",
        description=VERIFY_ABOUT + "\n\n" + VERIFY_GPU_STEPS, epilog=EXIT_CODES)
    v.add_argument("plan", help="placement JSON written by `python -m optim solve --json`")
    v.add_argument("--endpoints", nargs="+", default=None, metavar="URL",
                   help="running servers, one per GPU in plan order (http://host:port)")
    _add_server_options(v)
    v.add_argument("--profile", default=None,
                   help="twin profile (name or JSON) for every GPU (default: the plan's)")
    v.add_argument("--instance", default=None,
                   help="the plan's instance JSON: length model, seed, window, threshold")
    v.add_argument("--trace", default=None,
                   help="replay this trace CSV (arrival_s,adapter_id,input_tokens,"
                        "output_tokens) instead of Poisson arrivals")
    v.add_argument("--prompts", default=None, metavar="JSONL",
                   help="prompt file, one JSON object per line: {\"prompt\": text[, "
                        "\"prompt_tokens\": n]} or {\"prompt_token_ids\": [...]}; each "
                        "request draws one (seeded) and takes its length (default: random "
                        "token ids of the length model's input lengths)")
    v.add_argument("--duration", type=float_above(0.0, MAX_DURATION_S), default=None,
                   metavar="S", help="window in twin seconds (default: the instance's)")
    v.add_argument("--seed", type=seed_type, default=None,
                   help="workload seed (default: the instance's, else 0)")
    v.add_argument("--max-requests", type=positive_int, default=200_000,
                   help="refuse a workload with more requests than this")
    v.add_argument("--adapter-dir", default=None,
                   help="folder with one PEFT adapter per adapter id (default: dummy adapters)")
    v.add_argument("--out", required=True, metavar="PREFIX",
                   help="write PREFIX.json and PREFIX.md")
    v.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw measured vs twin per metric and GPU")
    v.add_argument("--force", action="store_true", help="overwrite the report files")
    v.set_defaults(func=cmd_verify)

    from .profile_runs import add_profile_arguments
    p = sub.add_parser("profile", help="profile a server for `twin calibrate`",
                       description=PROFILE_GPU_STEPS, epilog=EXIT_CODES,
                       formatter_class=_Formatter)
    _add_server_options(p)
    add_profile_arguments(p)
    p.set_defaults(func=cmd_profile)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return run_command(lambda: a.func(a))
