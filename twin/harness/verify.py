"""Verify a placement on live servers: replay its workload and set the measurement beside the
twin's prediction for exactly the requests that were sent.

One server per GPU of the plan (launched, or given as endpoints). Every request goes to its
GPU's server as a streamed completion for its adapter, at its arrival time (open loop). After
the window the client stops (unsent requests are dropped, running ones cancelled); the twin then
replays the *sent* requests (their actual send times, lengths and adapters) on each GPU's
configuration, and the report gives both sides and their relative differences.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from twin import kernel as K
from twin.metrics import compute_metrics
from twin.profile import load_profile
from twin.server import ServerConfig, run_kernel
from twin.workload import Requests

from .client import (PlannedRequest, RequestResult, kv_cache_tokens, metric_value, replay,
                     scrape_metrics, served_models)
from .launch import ServerSpec, read_log
from .measurement import ServingMetrics, relative_differences, serving_metrics
from .plan_workload import GpuWorkload, PlanWorkload, prompt_ids


@dataclass(frozen=True)
class GpuOutcome:
    """One GPU: where it ran, what was measured, what the twin predicts for the same requests."""

    gpu: int
    url: str
    max_loras: int
    max_lora_rank: int
    n_adapters: int
    measured: ServingMetrics
    twin: ServingMetrics
    errors: dict[str, int]
    server_kv_tokens: int | None
    twin_kv_tokens: int | None
    server_preemptions: float | None
    twin_preemptions: int
    twin_arrivals_from: str
    transit_ms: float
    server_lag_s: float | None     # twin serve: largest lag behind its clock during the run


@dataclass(frozen=True)
class VerifyResult:
    """Per-GPU outcomes, the pooled totals and how the run was made."""

    workload: PlanWorkload
    time_scale: float
    server_kind: str
    gpus: tuple[GpuOutcome, ...]
    total_measured: ServingMetrics
    total_twin: ServingMetrics

    @property
    def verdict_agrees(self) -> bool:
        return all(g.measured.starved == g.twin.starved for g in self.gpus)


def server_specs(workload: PlanWorkload, adapter_paths: dict[str, str]) -> list[ServerSpec]:
    """The vLLM flags of every GPU: the plan's Amax and max rank, the profile's batch cap and
    token budget (the profiled servers ran with them), one LoRA module per adapter."""
    specs = []
    for g in workload.gpus:
        prof = load_profile(g.profile)
        specs.append(ServerSpec(max_loras=g.max_loras, max_lora_rank=g.max_lora_rank,
                                lora_modules=tuple((a.id, adapter_paths[a.id]) for a in g.adapters),
                                max_cpu_loras=max(g.max_loras, len(g.adapters)),
                                max_num_seqs=prof.max_num_seqs,
                                max_num_batched_tokens=prof.max_num_batched_tokens))
    return specs


def check_endpoints(workload: PlanWorkload, urls: Sequence[str]) -> None:
    """Every GPU has an endpoint that answers and serves all of its adapters."""
    if len(urls) != len(workload.gpus):
        raise ValueError(f"--endpoints: the plan has {len(workload.gpus)} GPUs, "
                         f"{len(urls)} endpoints given")
    for g, url in zip(workload.gpus, urls):
        try:
            _, loras = served_models(url)
        except ValueError as e:
            raise ValueError(f"--endpoints {url} (GPU {g.gpu}): {e}") from None
        missing = [a.id for a in g.adapters if a.id not in loras]
        if missing:
            raise ValueError(f"--endpoints {url} (GPU {g.gpu}): {len(missing)} of the GPU's "
                             f"adapters are not served, e.g. {', '.join(missing[:5])}")


def planned_requests(workload: PlanWorkload, urls: Sequence[str], time_scale: float
                     ) -> list[PlannedRequest]:
    """Every request of every GPU with its wall send time (twin arrival / time scale)."""
    out = []
    idx = 0
    for g, url in zip(workload.gpus, urls):
        r = g.requests
        prompts = g.prompts if g.prompts is not None else \
            prompt_ids(r.input_len, seed=workload.seed + 1_000_003 * (g.gpu + 1))
        for k in range(len(r)):
            out.append(PlannedRequest(idx, float(r.arrival_s[k]) / time_scale, url,
                                      g.adapters[int(r.adapter[k])].id, prompts[k],
                                      int(r.output_len[k])))
            idx += 1
    return out


def _twin_on_sent(g: GpuWorkload, arrival: np.ndarray, adapter: np.ndarray, inl: np.ndarray,
                  outl: np.ndarray, window: float, threshold: float):
    """The twin's per-request first/finish times and metrics for exactly these requests."""
    prof = load_profile(g.profile)
    order = np.argsort(arrival, kind="stable")
    reqs = Requests(arrival[order], adapter[order], inl[order], outl[order])
    cfg = ServerConfig(max_loras=g.max_loras, max_lora_rank=g.max_lora_rank,
                       starvation_threshold=threshold)
    run = run_kernel(prof, list(g.adapters), reqs, cfg, window)
    if run is None:
        raise ValueError(f"GPU {g.gpu}: profile {prof.name} has no KV capacity for max_loras "
                         f"{g.max_loras}, max_lora_rank {g.max_lora_rank} (a memory error)")
    rm = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                         run.finish_t, run.stats, run.itl_hist, window, 0.0, run.kv_blocks,
                         prof.block_size, threshold)
    first = np.where(run.first_t >= 0, run.first_t, np.nan)
    finish = np.where(run.finish_t >= 0, run.finish_t, np.nan)
    return reqs, first, finish, run, rm


def transit_wall_s(results: Sequence[RequestResult], time_scale: float) -> np.ndarray:
    """Wall seconds of each request's TTFT that are transport, not serving (loopback HTTP, event
    loops): client TTFT minus the server's own TTFT over the scale, when the server reports it
    (``twin serve``); the median of those for a request without the server's figure; else 0. A
    real GPU server has this transport too, at its wall value, so when the time scale converts
    wall to twin time only the served part is multiplied (at ``time_scale`` 1 nothing changes).
    Per request, not one median: on a busy machine the client's event loop delays a few first
    tokens by milliseconds, and multiplied by the scale those would read as serving time."""
    out = np.zeros(len(results))
    if time_scale == 1.0:
        return out
    have = np.array([r.ok and r.server_ttft_s is not None and math.isfinite(r.server_ttft_s)
                     for r in results], bool)
    d = np.array([r.first_t - r.send_t - r.server_ttft_s / time_scale if h else np.nan
                  for r, h in zip(results, have)], float)
    if have.any():
        out[have] = np.maximum(d[have], 0.0)
        out[~have] = max(float(np.median(d[have])), 0.0)
    return out


def twin_arrivals(send_twin_s: np.ndarray, results: Sequence[RequestResult], time_scale: float
                  ) -> tuple[np.ndarray, str]:
    """Arrival times (client clock, twin seconds) the twin replays: when the server reported when
    each request reached it (``twin serve``'s ``twin_timing``), those, shifted onto the client's
    clock by the smallest transit; else the client's send times. With a time-scaled stand-in
    the loopback transit is multiplied by the scale and could move a request into a later engine
    step than its send time suggests; the server's own arrivals make the replay exact."""
    srv = np.array([np.nan if r.server_arrival_s is None else r.server_arrival_s
                    for r in results], float)
    have = np.isfinite(srv)
    if len(srv) == 0 or not have.any():
        return send_twin_s, "client send times"
    shift = float(np.max(send_twin_s[have] - srv[have]))
    out = np.array(send_twin_s, float)
    out[have] = srv[have] + shift
    if (~have).any():   # cancelled before their last chunk: the median transit
        out[~have] = send_twin_s[~have] + float(np.median(out[have] - send_twin_s[have]))
    return out, "server-reported arrivals (twin serve)"


def _hist_p99(hist: np.ndarray) -> float:
    """p99 of a twin ITL histogram (same bins as ``twin.metrics``)."""
    total = hist.sum()
    if total == 0:
        return float("nan")
    i = int(np.searchsorted(np.cumsum(hist), 0.99 * total))
    lo = K.ITL_HIST_LO_MS * 10 ** (i / K.ITL_HIST_BINS * K.ITL_HIST_DECADES)
    hi = K.ITL_HIST_LO_MS * 10 ** ((i + 1) / K.ITL_HIST_BINS * K.ITL_HIST_DECADES)
    return float(math.sqrt(lo * hi))


WARM_UP_REQUESTS = 3


async def warm_up(urls: Sequence[str]) -> None:
    """A few short requests to each server's base model, one after another, before the run:
    first requests pay one-off costs (imports, caches, CUDA graphs on a GPU) that are not
    serving. The base model takes no adapter slot, so the plan's adapters start cold as in
    the twin; the servers are idle again when the run starts."""
    import aiohttp

    from .client import stream_completion
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for url in urls:
            base, _ = await asyncio.to_thread(served_models, url)
            for i in range(WARM_UP_REQUESTS):
                r = await stream_completion(s, url, -1 - i, base or "", list(range(1000, 1016)), 4)
                if not r.ok:
                    raise ValueError(f"{url}: warm-up request to the base model failed: {r.error}")


def _lag(url: str) -> float | None:
    """``twin:virtual_clock_lag_seconds`` of a twin serve stand-in (None for real vLLM)."""
    try:
        return metric_value(scrape_metrics(url), "twin:virtual_clock_lag_seconds")
    except ValueError:
        return None


def run_verify(workload: PlanWorkload, urls: Sequence[str], time_scale: float = 1.0,
               server_kind: str = "endpoints", quiet: bool = True,
               logs: Sequence[Path] | None = None) -> VerifyResult:
    """Replay the workload on ``urls`` (one per GPU, in plan order) and compare with the twin.
    ``logs``: the launched servers' log files (their KV capacity when ``/metrics`` lacks it)."""
    from twin.cli_support import progress

    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"--time-scale: must be > 0, got {time_scale!r}")
    planned = planned_requests(workload, urls, time_scale)
    asyncio.run(warm_up(urls))
    lag_before = [_lag(url) for url in urls]
    wall_window = workload.duration_s / time_scale
    bar = progress(total=len(planned), desc="requests sent", unit="req", quiet=quiet)
    try:
        t0, results = asyncio.run(replay(planned, wall_window, bar))
    finally:
        bar.close()
    by_index = {r.index: r for r in results}
    outcomes = []
    pooled_m: dict[str, list] = {k: [] for k in ("arr", "in", "out", "first", "finish", "gaps")}
    pooled_t: dict[str, list] = {k: [] for k in ("arr", "in", "out", "first", "finish")}
    twin_hist = np.zeros(K.ITL_HIST_BINS, np.int64)
    failed_total = 0
    base = 0
    for g, url in zip(workload.gpus, urls):
        n = len(g.requests)
        mine: list[RequestResult] = [by_index[i] for i in range(base, base + n) if i in by_index]
        base += n
        if mine:
            ks = np.array([r.index for r in mine]) - (base - n)
        else:
            ks = np.zeros(0, np.int64)
        arr = np.array([(r.send_t - t0) * time_scale for r in mine], float)
        inl = g.requests.input_len[ks].astype(float)
        outl = g.requests.output_len[ks].astype(float)
        transit = transit_wall_s(mine, time_scale)
        first = np.array([arr[i] + (r.first_t - r.send_t - transit[i]) * time_scale + transit[i]
                          if r.ok else np.nan for i, r in enumerate(mine)], float)
        finish = np.array([first[i] + (r.finish_t - r.first_t) * time_scale
                           if r.ok else np.nan for i, r in enumerate(mine)], float)
        gaps = np.concatenate([np.diff(r.token_t) * 1000.0 * time_scale for r in mine
                               if r.ok and (r.finish_t - t0) * time_scale <= workload.duration_s]
                              or [np.zeros(0)])
        errors: dict[str, int] = {}
        for r in mine:
            if not r.ok:
                key = r.error.split(":")[0][:60]
                errors[key] = errors.get(key, 0) + 1
        hard_fail = sum(v for k, v in errors.items() if not k.startswith("cancelled"))
        failed_total += hard_fail
        measured = serving_metrics(arr, inl, outl, first, finish, workload.duration_s,
                                   workload.threshold, itl_gaps_ms=gaps, failed=hard_fail)
        adapter = g.requests.adapter[ks]
        pred_arr, arrivals_from = twin_arrivals(arr, mine, time_scale)
        reqs, tfirst, tfinish, run, rm = _twin_on_sent(g, pred_arr, adapter, inl, outl,
                                                       workload.duration_s, workload.threshold)
        twin = serving_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, tfirst, tfinish,
                               workload.duration_s, workload.threshold, p99_itl_ms=rm.p99_itl_ms)
        twin_hist += run.itl_hist
        try:
            samples = scrape_metrics(url)
            kv = kv_cache_tokens(samples, read_log(logs[g.gpu] if logs else None))
            pre = metric_value(samples, "vllm:num_preemptions_total")
            lag = metric_value(samples, "twin:virtual_clock_lag_seconds")
            # the gauge is the largest lag since start: count it only if the run raised it
            before = lag_before[g.gpu]
            if lag is not None and before is not None and lag <= before:
                lag = 0.0
        except (ValueError, KeyError):
            kv, pre, lag = None, None, None
        outcomes.append(GpuOutcome(g.gpu, url, g.max_loras, g.max_lora_rank, len(g.adapters),
                                   measured, twin, errors, kv, run.kv_blocks * load_profile(
                                       g.profile).block_size, pre, int(rm.preemptions),
                                   arrivals_from,
                                   1000.0 * float(transit.mean()) if len(transit) else 0.0, lag))
        for key, v in (("arr", arr), ("in", inl), ("out", outl), ("first", first),
                       ("finish", finish), ("gaps", gaps)):
            pooled_m[key].append(v)
        for key, v in (("arr", reqs.arrival_s), ("in", reqs.input_len), ("out", reqs.output_len),
                       ("first", tfirst), ("finish", tfinish)):
            pooled_t[key].append(np.asarray(v, float))
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in pooled_m.items()}
    tcat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in pooled_t.items()}
    total_m = serving_metrics(cat["arr"], cat["in"], cat["out"], cat["first"], cat["finish"],
                              workload.duration_s, workload.threshold, itl_gaps_ms=cat["gaps"],
                              failed=failed_total)
    total_t = serving_metrics(tcat["arr"], tcat["in"], tcat["out"], tcat["first"],
                              tcat["finish"], workload.duration_s, workload.threshold,
                              p99_itl_ms=_hist_p99(twin_hist))
    # the fleet starves when any GPU does (the placement's verdict)
    total_m = _with_starved(total_m, any(o.measured.starved for o in outcomes))
    total_t = _with_starved(total_t, any(o.twin.starved for o in outcomes))
    return VerifyResult(workload, float(time_scale), server_kind, tuple(outcomes), total_m,
                        total_t)


def _with_starved(m: ServingMetrics, starved: bool) -> ServingMetrics:
    from dataclasses import replace
    return replace(m, starved=starved)


def relative(result: VerifyResult) -> dict:
    """Relative differences per GPU and in total."""
    return {"total": relative_differences(result.total_measured, result.total_twin),
            **{f"gpu{g.gpu}": relative_differences(g.measured, g.twin) for g in result.gpus}}
