"""Profiling studies for ``python -m twin calibrate``, using only what a stock vLLM exposes.

Every study restarts the server with the configuration it needs (``--launch``) and measures
from the outside: saturated synthetic runs (all prompts sent at once as token-id lists, exact
output lengths with ``ignore_eos``, non-streamed) with ``/metrics`` scraped while they run.
Step times come from the server's own ``vllm:time_per_output_token_seconds`` histogram (Δsum /
Δcount between two scrapes: every inter-token gap of a running request is one engine step), so
they are GPU (twin) time whatever the client's or a stand-in's speed. Written in the
calibration CSV schema (``<out>/calibration/*.csv``, columns as in the shared data README):

* ``step_latency_windows.csv`` — decode studies as the original profiling ran them: 1-token
  prompts and equal outputs, so ``max_num_seqs`` requests run in cohorts, every step schedules
  one token per running request (``batched_tokens_mean`` = the running gauge) and a window
  spans whole cohort periods (counted in server-recorded gaps), so its mean context is the
  steady-state mean. ``decode_baseline`` (LoRA off; several ``--max-num-seqs`` and output
  lengths) and ``lora_decode_overhead`` (LoRA on; several ``--max-loras`` / batch sizes and
  numbers of distinct adapters, pre-loaded). A decode run starts on a full queue: blocker
  requests hold the batch while the client sends (see :func:`_saturated`). With as many
  adapters as slots the batch is full of adapters and the scheduler scans the whole waiting
  queue every step (the term c9); those runs are repeated with queues of one-token requests
  for another adapter behind them (``queue_lengths``), which the scheduler skips, so the
  scanned queue is long and known; ``waiting_mean`` is the waiting gauge averaged over the
  window. ``prefill_baseline``: prompt-only runs (two output tokens: each request's one gap is
  the next step, as full of prompt tokens as the others; long prompts, so that a few hundred
  requests, all sent at once, fill hundreds of steps). ``lora_prefill``: the same on LoRA
  servers, one adapter, at every slot count and at ``max_lora_rank`` 8, 16 and 32: full
  2048-token steps whose LoRA part is about half the step, the windows from which ``twin
  calibrate`` fits the per-slot-and-token cost c6 and the rank term c10. Only windows with
  requests waiting throughout (a saturated server) are kept.
* ``step_latency_runs.csv`` — one row per run (totals of the run's own requests, mean
  ITL/TTFT, KV capacity, the numbers of blockers and queue fillers, ``attempts``: a run that
  gave no saturated window is repeated, up to three times). vLLM does not expose the
  scheduler's own time: those columns stay empty and ``twin calibrate`` then fits the
  waiting-queue term with the step time.
* ``memory_capacity.csv`` — KV tokens = ``num_gpu_blocks x block_size`` of
  ``vllm:cache_config_info`` at start-up (vLLM 0.8.5 reports ``None`` there: then the
  ``GPU KV cache size`` line of the server's log), for every (max_loras, max_lora_rank) of the
  KV grid; a server that does not start is a ``failed`` row.
* ``adapter_loading_samples.csv`` — CPU->GPU load time per (adapter rank, max_lora_rank): with
  one slot (``--max-loras 1``), sequential one-token requests alternating two adapters (each
  swaps) minus the same requests to one resident adapter (server-side TTFT histogram).
* ``scheduler_overhead_runs.csv`` — the shared runs of the original study (patched vLLM); a
  stock server cannot produce them, so the file has the header only.

``--study quick`` is a small subset (minutes against ``twin serve``); ``full`` is what a GPU
owner runs (hours on a real GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import aiohttp
import numpy as np
import pandas as pd

from .client import metric_labels, metric_value, parse_prometheus
from .plan_workload import prompt_ids

TPOT = "vllm:time_per_output_token_seconds"
SCRAPES_PER_PERIOD = 12     # scrapes per lockstep cohort period (decode runs)
MIN_SCRAPE_WALL_S = 0.004   # never scrape more often than this
PERIOD_TOLERANCE = 0.03     # a window may differ from whole periods by this share of a period
TTFT = "vllm:time_to_first_token_seconds"
def _connection_limit() -> int:
    """Concurrent HTTP connections of a saturated run: every prompt in flight at once (so the
    server's queue never waits for the client), within the open-file limit."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 1024
    return int(max(64, min(4096, soft - 256)))


CONNECTIONS = _connection_limit()
# A stand-in at a high --time-scale serves a large no-LoRA batch of short requests faster than
# one client can send them (thousands of requests per wall second), and its blockers can hold
# the batch only as long as the KV cache lasts (max_num_seqs x their length): twin servers with
# at least SLOW_SERVER_SEQS sequences and LoRA off run max_num_seqs / SLOW_SERVER_SEQS_PER_X
# times slower.
SLOW_SERVER_SEQS = 192
SLOW_SERVER_SEQS_PER_X = 96.0
RUN_TIMEOUT_S = 3600.0      # wall bound of one run
RUN_ATTEMPTS = 3            # a run without a saturated window is repeated up to this often


@dataclass(frozen=True)
class StudyPlan:
    """What to measure (see the module docstring)."""

    no_lora_seqs: tuple[int, ...]
    decode_lengths: tuple[tuple[int, int], ...]
    prefill_inputs: tuple[int, ...]
    lora_configs: tuple[tuple[int, int], ...]   # (max_loras, max_num_seqs) of the LoRA servers
    # distinct adapters = factor x max_loras (>= 1, <= 1: more adapters than slots would add
    # adapter loads to the steps, which the windows' step-time model does not include)
    lora_adapter_factors: tuple[float, ...]
    rank_runs: tuple[int, ...]                # max_lora_rank values of the rank study
    # fillers queued behind the runs whose batch holds max_loras adapters (0 = none)
    queue_lengths: tuple[int, ...]
    kv_grid: tuple[tuple[int, int], ...]
    load_ranks: tuple[int, ...]
    steady_steps: int      # engine steps a saturated decode run lasts (about)
    load_requests: int


STUDIES = {
    "quick": StudyPlan(no_lora_seqs=(16, 64, 192, 256, 320, 384, 448, 512),
                       decode_lengths=((1, 64), (1, 256)),
                       prefill_inputs=(1000, 3000),
                       lora_configs=((8, 64), (8, 160), (64, 64), (64, 160)),
                       lora_adapter_factors=(0.125, 0.5, 1.0), rank_runs=(8, 16, 32),
                       queue_lengths=(0, 2000),
                       kv_grid=((8, 8), (64, 8), (32, 16), (64, 32), (384, 8), (384, 32)),
                       load_ranks=(8, 16, 32), steady_steps=500, load_requests=4),
    "full": StudyPlan(no_lora_seqs=(8, 16, 32, 64, 128, 192, 256, 320, 384, 512),
                      decode_lengths=((1, 100), (1, 200), (1, 400)),
                      prefill_inputs=(700, 1000, 1500, 3000, 6000),
                      lora_configs=tuple((a, n) for a in (8, 32, 64, 128, 256) for n in (64, 192)),
                      lora_adapter_factors=(0.0625, 0.25, 0.5, 1.0),
                      rank_runs=(8, 16, 32), queue_lengths=(0, 1000, 2000),
                      kv_grid=tuple((a, r) for r in (8, 16, 32) for a in
                                    (8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352,
                                     384)),
                      load_ranks=(8, 16, 32), steady_steps=2000, load_requests=50),
}


@dataclass(frozen=True)
class ServerSetup:
    """One server configuration (``max_loras`` 0 = LoRA off) and its adapters' ranks: the
    runs' adapters, then ``fillers`` (0/1) adapter for queue fillers, then ``blockers``
    adapters for blocker requests (see :func:`_saturated`)."""

    max_loras: int
    max_lora_rank: int
    max_num_seqs: int
    adapter_ranks: tuple[int, ...] = ()
    fillers: int = 0
    blockers: int = 0

    @property
    def adapter_names(self) -> list[str]:
        return [f"r{r}-{i}" for i, r in enumerate(self.adapter_ranks)]

    @property
    def run_adapters(self) -> list[str]:
        return self.adapter_names[:len(self.adapter_ranks) - self.fillers - self.blockers]

    @property
    def filler_adapter(self) -> str | None:
        n = len(self.adapter_ranks) - self.blockers
        return self.adapter_names[n - 1] if self.fillers else None

    @property
    def blocker_adapters(self) -> list[str]:
        return self.adapter_names[len(self.adapter_ranks) - self.blockers:]


@dataclass
class ProfileTables:
    """Rows of every CSV, filled study by study."""

    runs: list[dict] = field(default_factory=list)
    windows: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    loads: list[dict] = field(default_factory=list)


# ------------------------------------------------------------------------------ one run
@dataclass(frozen=True)
class Scrape:
    wall: float
    running: float
    waiting: float
    tpot_sum: float
    tpot_count: float
    ttft_sum: float
    ttft_count: float
    kv_usage: float
    running_adapters: int
    finished: float = 0.0    # vllm:request_success_total (all finish reasons)

    def held(self, finished0: float) -> float:
        """Requests the server has received since a scrape that counted ``finished0``
        finished ones: running + waiting + finished since."""
        return self.running + self.waiting + self.finished - finished0


def _scrape_of(text: str, wall: float) -> Scrape:
    s = parse_prometheus(text)
    lora = metric_labels(s, "vllm:lora_requests_info") or {}
    running_ad = [x for x in lora.get("running_lora_adapters", "").split(",") if x]
    return Scrape(wall, metric_value(s, "vllm:num_requests_running", 0.0),
                  metric_value(s, "vllm:num_requests_waiting", 0.0),
                  metric_value(s, f"{TPOT}_sum", 0.0), metric_value(s, f"{TPOT}_count", 0.0),
                  metric_value(s, f"{TTFT}_sum", 0.0), metric_value(s, f"{TTFT}_count", 0.0),
                  metric_value(s, "vllm:gpu_cache_usage_perc", 0.0), len(running_ad),
                  metric_value(s, "vllm:request_success_total", 0.0))


async def _get_scrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    async with session.get(f"{url}/metrics") as r:
        if r.status != 200:
            raise ValueError(f"{url}/metrics: HTTP {r.status}")
        return _scrape_of(await r.text(), time.perf_counter())


async def _complete(session: aiohttp.ClientSession, url: str, model: str, prompt: Sequence[int],
                    max_tokens: int) -> tuple[float, int]:
    """Non-streamed completion; (wall time it finished, completion tokens)."""
    body = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens,
            "min_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}
    async with session.post(f"{url}/v1/completions", json=body) as r:
        text = await r.text()
        if r.status != 200:
            raise ValueError(f"{url}/v1/completions ({model}): HTTP {r.status}: {text[:200]}")
        usage = json.loads(text).get("usage") or {}
        return time.perf_counter(), int(usage.get("completion_tokens", max_tokens))


@dataclass(frozen=True)
class RunResult:
    """Scrapes of one saturated run; tokens and completions count the main requests only (not
    the blockers or queue fillers). ``arrived_wall``: the first scrape at which the server held
    every request of the run and (with blockers) they had been released, None if never."""

    scrapes: tuple[Scrape, ...]
    finish_wall: tuple[float, ...]
    input_tokens: int
    output_tokens: int
    wall_s: float
    arrived_wall: float | None = None
    fillers: int = 0
    blockers: int = 0


@dataclass(frozen=True)
class Blockers:
    """Requests that hold the batch while a run's requests are being sent: ``len(models)``
    one-token-prompt requests (one per model) of ``max_tokens`` output tokens, cancelled (the
    server aborts them) once the server holds every request of the run."""

    models: tuple[str, ...]
    max_tokens: int


async def _wait_held(s: aiohttp.ClientSession, url: str, scrapes: list, f0: float, n: int,
                     pending: set, interval: float) -> None:
    """Scrape until the server holds ``n`` requests (running + waiting + finished since the
    run began); a request that failed meanwhile raises."""
    t0 = time.perf_counter()
    while scrapes[-1].held(f0) < n:
        done = [t for t in pending if t.done()]
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()
        await asyncio.sleep(interval)
        scrapes.append(await _get_scrape(s, url))
        if time.perf_counter() - t0 > RUN_TIMEOUT_S:
            raise ValueError(f"{url}: the server did not receive {n} requests in "
                             f"{RUN_TIMEOUT_S:g} s")


async def _saturated(url: str, models: Sequence[str], n_prompts: int, input_len: int,
                     output_len: int, window_s: float, time_scale: float, seed: int,
                     period_steps: int | None = None,
                     filler: tuple[str, int] | None = None,
                     blockers: Blockers | None = None) -> RunResult:
    """Send ``n_prompts`` at once and scrape ``/metrics`` every window (twin seconds).

    ``period_steps``: equal requests sent together run in lockstep cohorts of that many steps,
    over which the context length sweeps; then ``/metrics`` is scraped ``SCRAPES_PER_PERIOD``
    times per cohort period (estimated from the last interval's mean step) so that
    :func:`_windows` can cut windows of whole periods.

    ``blockers``: sent first; while they run, the batch admits none of the run's requests
    (``max_num_seqs`` of them fill it; on a LoRA server, ``max_loras`` blockers on adapters of
    their own hold every slot and the scheduler skips the other adapters' requests), so the
    run's requests queue up however slowly the client sends them; once the server holds all of
    them the blockers are cancelled and the run starts on a full queue. Without them a fast
    server (``twin serve`` at a high ``--time-scale``) drains the queue faster than one client
    fills it, and the run is never saturated.

    ``filler`` (adapter, n): once the server holds every main request, ``n`` one-token requests
    for ``adapter`` (not one of ``models``) are sent. They queue behind the main requests, and
    while the batch holds ``max_loras`` adapters the scheduler skips them at every step, so they
    lengthen the scanned waiting queue by a known, constant amount without changing the batch
    (the waiting-queue term c9)."""
    prompts = prompt_ids([input_len] * n_prompts, seed)
    conn = aiohttp.TCPConnector(limit=CONNECTIONS)
    timeout = aiohttp.ClientTimeout(total=RUN_TIMEOUT_S)
    n_block = len(blockers.models) if blockers else 0
    # every request holds a connection until it finishes: fillers beyond the limit are left out
    n_fill = max(0, min(filler[1], CONNECTIONS - n_prompts - n_block)) if filler else 0
    interval = window_s / time_scale
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        scrapes = [await _get_scrape(s, url)]
        f0 = scrapes[0].finished
        t0 = time.perf_counter()
        block_tasks: list[asyncio.Future] = []
        if n_block:
            bp = prompt_ids([1] * n_block, seed + 2)
            block_tasks = [asyncio.ensure_future(_complete(s, url, m, bp[i], blockers.max_tokens))
                           for i, m in enumerate(blockers.models)]
            await _wait_held(s, url, scrapes, f0, n_block, set(block_tasks), MIN_SCRAPE_WALL_S)
        tasks = [asyncio.ensure_future(_complete(s, url, models[i % len(models)], prompts[i],
                                                 output_len)) for i in range(n_prompts)]
        pending = set(tasks)
        arrived = None
        if n_block or n_fill:
            await _wait_held(s, url, scrapes, f0, n_block + n_prompts, pending,
                             MIN_SCRAPE_WALL_S)
            if n_fill:
                fp = prompt_ids([1] * n_fill, seed + 1)
                fill = [asyncio.ensure_future(_complete(s, url, filler[0], fp[i], 1))
                        for i in range(n_fill)]
                pending |= set(fill)
                await _wait_held(s, url, scrapes, f0, n_block + n_prompts + n_fill, pending,
                                 MIN_SCRAPE_WALL_S)
            for t in block_tasks:
                t.cancel()
            await asyncio.gather(*block_tasks, return_exceptions=True)
            scrapes.append(await _get_scrape(s, url))
            arrived = scrapes[-1].wall
        while pending:
            done, pending = await asyncio.wait(pending, timeout=interval)
            for t in done:
                if t.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise t.exception()
            scrapes.append(await _get_scrape(s, url))
            if arrived is None and scrapes[-1].held(f0) >= n_prompts:
                arrived = scrapes[-1].wall
            a, b = scrapes[-2], scrapes[-1]
            if period_steps and b.tpot_count > a.tpot_count:
                cycle = period_steps * (b.tpot_sum - a.tpot_sum) / (b.tpot_count - a.tpot_count)
                interval = max(cycle / SCRAPES_PER_PERIOD / time_scale, MIN_SCRAPE_WALL_S)
            if time.perf_counter() - t0 > RUN_TIMEOUT_S:
                for p in pending:
                    p.cancel()
                raise ValueError(f"{url}: run not finished after {RUN_TIMEOUT_S:g} s")
        res = [t.result() for t in tasks]
    return RunResult(tuple(scrapes), tuple(r[0] for r in res), n_prompts * input_len,
                     sum(r[1] for r in res), time.perf_counter() - t0, arrived, n_fill, n_block)


MAX_PERIODS = 6   # a lockstep window spans 1 to this many whole cohort periods


def _intervals(sc: Sequence[Scrape], period_gaps: float | None,
               after: float | None = None, fillers: int = 0) -> list[tuple[int, int]]:
    """Index pairs of scrapes that bound the windows: consecutive scrapes, or
    (``period_gaps``) spans of whole lockstep cohort periods: pairs whose gap count differs by
    m periods' gaps (n requests x (output - 1) each, 1 <= m <= ``MAX_PERIODS``) within
    ``PERIOD_TOLERANCE`` of one period, the shortest such span from each start. Over whole
    periods every running slot sweeps its request's whole context range, whatever the phases
    of the cohorts, so the window's mean context is the steady-state one. Counted in
    server-recorded gaps, the cut does not depend on how fast the client or server ran (a
    loaded client scrapes less often; longer spans keep the windows). Every window starts at
    or after ``after``; a period window has more than ``fillers`` requests waiting at every
    scrape in it (a run's own requests, not only queue fillers: once those are all admitted,
    the batch thins out and takes fillers)."""
    if not period_gaps:
        return [(i, i + 1) for i in range(len(sc) - 1)
                if after is None or sc[i].wall >= after]
    ok = [x.waiting > fillers and x.running > 0 and (after is None or x.wall >= after)
          for x in sc]
    out, i = [], 0
    while i < len(sc) - 1:
        found = None
        j = i + 1
        while ok[i] and j < len(sc) and ok[j]:
            d = (sc[j].tpot_count - sc[i].tpot_count) / period_gaps
            m = round(d)
            if 1 <= m <= MAX_PERIODS and abs(d - m) <= PERIOD_TOLERANCE:
                found = j
                break
            if d > MAX_PERIODS + PERIOD_TOLERANCE:
                break
            j += 1
        if found is not None:
            out.append((i, found))
            i = found
        else:
            i += 1
    return out


def _lockstep_ctx(n: float, inl: int, outl: int) -> float:
    """Mean context (tokens computed before the step, summed over the batch) of ``n`` slots
    over whole periods, each slot running requests of ``inl`` prompt tokens (one step) and
    ``outl`` output tokens: its request's steps see 0, then inl, inl + 1, ..., inl + outl - 2."""
    return n * ((outl - 1) * inl + (outl - 1) * (outl - 2) / 2.0) / outl


def _prefill_ctx(inl: int, budget: int, steps: int = 3000, warmup: int = 200) -> float:
    """Mean context per step (tokens computed before the step, summed over the batch) of a
    saturated prompt-only run: equal requests of ``inl`` prompt tokens and two output tokens,
    vLLM V1's rule of ``budget`` tokens per step (running requests first in admission order:
    the second token's decode step of the ones whose prompt is done and the continuing chunk;
    then new requests, the last one cut at the budget). Counted step by step; the decode
    requests' own contexts (``inl`` each) are most of it, which the prompt-chunk estimate
    ``inl / 2`` leaves out."""
    running: list[int] = []          # tokens computed, admission order
    total = 0.0
    for step in range(steps):
        left, ctx, keep = budget, 0, []
        for done in running:
            if left <= 0:
                keep.append(done)
                continue
            ctx += done
            if done < inl:               # prompt chunk
                new = min(inl - done, left)
                keep.append(done + new)
                left -= new
            else:                        # decode of the second output token: finishes
                left -= 1
        while left > 0:
            new = min(inl, left)
            keep.append(new)
            left -= new
        running = keep
        if step >= warmup:
            total += ctx
    return total / (steps - warmup)


def _mean_waiting(sc: Sequence[Scrape], i: int, j: int) -> float:
    """Mean waiting gauge over scrapes i..j, each interval weighted by the inter-token gaps
    recorded in it (the window's step time is a mean over those gaps), trapezoid rule."""
    w = np.array([sc[k + 1].tpot_count - sc[k].tpot_count for k in range(i, j)], dtype=float)
    v = np.array([0.5 * (sc[k].waiting + sc[k + 1].waiting) for k in range(i, j)])
    return float(np.sum(w * v) / np.sum(w)) if np.sum(w) > 0 else float(sc[j].waiting)


def _windows(run: RunResult, base: dict, restrict: int, lockstep: bool = False,
             period_gaps: float | None = None, prefill_budget: int | None = None) -> list[dict]:
    """One row per window in which the server was saturated (requests waiting at both ends,
    so every step ran a full batch) and recorded inter-token gaps; windows are scrape intervals
    or, with ``period_gaps``, whole lockstep periods (see :func:`_intervals`).

    ``lockstep`` (decode runs of 1-token prompts): every step schedules exactly one token per
    running request (a decode token, or the one prompt token of a newly admitted request), so
    ``batched_tokens_mean`` is the running count (vLLM exposes no per-step token count).
    ``waiting_mean``: the waiting gauge averaged over the window's scrapes (the queue shrinks by
    a cohort once per period; ``waiting_end`` alone is its low end). ``ctx_tokens_mean``: the
    steps' mean context, known from the design: whole lockstep periods (:func:`_lockstep_ctx`)
    or saturated prompt-only runs with ``prefill_budget`` tokens per step
    (:func:`_prefill_ctx`)."""
    rows = []
    sc = run.scrapes
    full = max(x.running for x in sc[1:])
    inl, outl = base["input_len_set"], base["output_len_set"]
    if lockstep and period_gaps:
        ctx = _lockstep_ctx(full, inl, outl)
    elif prefill_budget and outl == 2:
        ctx = _prefill_ctx(inl, prefill_budget)
    else:
        ctx = np.nan
    # windows start once the server holds every request of the run: from then on the queue
    # only shrinks, so requests waiting at both ends of a window waited throughout it (before,
    # a server faster than the client drains the queue between scrapes and runs part-full
    # steps: 1 % short prefill steps in one window moved the context term c3 by 20 %)
    after = run.arrived_wall
    if after is not None and run.blockers:
        # released from blockers: the server aborts them when it notices the closed connections,
        # then admits the first cohort (the queue shrinks), whose first period holds its
        # adapter loads: windows start a period after that (a prompt-only run: one scrape
        # interval after that, while its steps' context reaches the steady state)
        k0 = next((k for k, x in enumerate(sc) if x.wall >= after), len(sc) - 1)
        k0 = next((k for k in range(k0, len(sc)) if sc[k].waiting < sc[k0].waiting), k0)
        if period_gaps:
            k1 = next((k for k in range(k0, len(sc))
                       if sc[k].tpot_count >= sc[k0].tpot_count + period_gaps), None)
        else:
            k1 = k0 + 1 if k0 + 1 < len(sc) else None
        after = sc[k1].wall if k1 is not None else float("inf")
    for i, j in _intervals(sc, period_gaps, after, run.fillers):
        a, b = sc[i], sc[j]
        dn = b.tpot_count - a.tpot_count
        if dn <= 0 or a.waiting <= run.fillers or b.waiting <= run.fillers:
            continue
        # a scrape taken after some requests of a cohort finished and before their successors
        # were admitted shows fewer running; one a period later shows the same dip (same
        # phase) and would pass calibrate's equality test with the wrong batch size
        if period_gaps and (a.running < full or b.running < full):
            continue
        # a LoRA window counts only while the batch holds every adapter of the run: in cohorts
        # admitted unevenly it holds fewer for a while (54 of 64 in one run), its steps are
        # shorter and, below max_loras adapters, scan no queue, which calibrate cannot tell
        if restrict and min(a.running_adapters, b.running_adapters) < restrict:
            continue
        rows.append({**base, "window_start_s": a.wall - sc[0].wall, "window_len_s": b.wall - a.wall,
                     "n_steps": np.nan,
                     "step_interval_mean_ms": 1000.0 * (b.tpot_sum - a.tpot_sum) / dn,
                     "scheduler_time_mean_ms": np.nan,
                     # at the ends the batch is full (checked above); a scrape inside may
                     # fall on a cohort boundary, between finished requests and successors
                     "unique_adapters_mean": (0.5 * (a.running_adapters + b.running_adapters)
                                              if restrict else 0.0),
                     "batched_tokens_mean": (a.running if lockstep and a.running == b.running
                                             else np.nan), "running_start": a.running,
                     "running_end": b.running, "waiting_end": b.waiting,
                     "waiting_mean": _mean_waiting(sc, i, j),
                     "ctx_tokens_mean": ctx,
                     "kv_usage_end_frac": b.kv_usage})
    return rows


# ------------------------------------------------------------------------------ servers
LORA_TILE_TOKENS = 16   # tokens per LoRA kernel tile (BLOCK_M of vLLM 0.8.5's punica kernels)
# A run on as many adapters as slots needs at least this many requests per slot: with about one
# request per adapter, cohorts admitted a few steps apart (the server aborts the blockers one
# connection at a time) hold some adapter twice and miss another, so the batch holds fewer
# than max_loras adapters at times and the scheduler does not scan its queue then.
FULL_RUN_SEQS_PER_SLOT = 2


def _adapter_count(factor: float, max_loras: int, seqs: int) -> int:
    """Distinct adapters of a LoRA decode run: ``factor`` x ``max_loras`` (at least 1), moved
    up by one when fewer than ``max_loras`` adapters would each get a whole number of 16-token
    tiles (64 requests on 4 adapters): there, one request more or less on an adapter in a
    cohort changes its tile count, and the step time jumps by a tile's cost."""
    k = max(1, int(round(factor * max_loras)))
    if 1 < k < max_loras and seqs % (LORA_TILE_TOKENS * k) == 0:
        k += 1
    return k


class Profiler:
    """Runs the studies against servers it starts (twin serve or vllm), one per configuration."""

    def __init__(self, a: argparse.Namespace, model_name: str, work: Path, quiet: bool):
        self.a = a
        self.model_name = model_name
        self.work = work
        self.quiet = quiet
        self.tables = ProfileTables()
        self.kv_seen: dict[tuple[int, int], int | None] = {}
        self.adapter_dirs: dict[int, Path] = {}
        self.max_model_len: int | None = None
        self.backbone_kv: int | None = None
        self.n_started = 0
        self.bar = None

    def say(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(msg[:60])

    def repeated_runs(self) -> int:
        """Runs that needed more than one attempt (see :meth:`_attempts`)."""
        return sum(r.get("attempts", 1) > 1 for r in self.tables.runs)

    def warn(self, msg: str) -> None:
        """A line on stderr (above the progress bar) unless quiet."""
        if not self.quiet:
            from tqdm import tqdm
            tqdm.write(f"twin.harness profile: {msg}", file=sys.stderr)

    def _spec(self, setup: ServerSetup):
        from .launch import ServerSpec
        mods = tuple((n, str(self.adapter_dirs[r].resolve()))
                     for n, r in zip(setup.adapter_names, setup.adapter_ranks))
        return ServerSpec(max_loras=max(setup.max_loras, 1), max_lora_rank=setup.max_lora_rank,
                          lora_modules=mods,
                          max_cpu_loras=max(setup.max_loras, len(mods), 1),
                          max_num_seqs=setup.max_num_seqs,
                          max_num_batched_tokens=self.a.max_num_batched_tokens,
                          enable_lora=setup.max_loras > 0)

    def start(self, setup: ServerSetup, slow: bool = False):
        """Context manager: one launched server of ``setup``. ``slow``: a twin server runs at
        ``--time-scale`` x SLOW_SERVER_SEQS_PER_X / max_num_seqs (its measurements are twin
        time either way)."""
        from .launch import launch_servers
        self.n_started += 1
        scale = self.a.time_scale / (max(1.0, setup.max_num_seqs / SLOW_SERVER_SEQS_PER_X)
                                     if slow else 1.0)
        return launch_servers([self._spec(setup)], self.work / "logs" / f"s{self.n_started}",
                              self.a.server, profile=self.a.profile,
                              time_scale=scale, seed=self.a.seed,
                              model=self.a.model, gpu_ids=self._gpu_ids(),
                              served_model_name=self.model_name)

    def _gpu_ids(self) -> list[str] | None:
        return self.a.gpu_ids.split(",")[:1] if self.a.gpu_ids else None

    def record_server(self, server, setup: ServerSetup) -> int | None:
        """KV capacity of a launched server (``/metrics``, else its start-up log; see
        :func:`twin.harness.client.kv_cache_tokens`) and the model's max_model_len."""
        from .client import get_json, kv_cache_tokens, scrape_metrics
        from .launch import read_log
        url = server.url
        kv = kv_cache_tokens(scrape_metrics(url), read_log(server.log))
        for m in get_json(f"{url}/v1/models").get("data", []):
            if m.get("max_model_len") and not m.get("parent"):
                self.max_model_len = int(m["max_model_len"])
        if setup.max_loras > 0:
            self.kv_seen[(setup.max_loras, setup.max_lora_rank)] = kv
        return kv

    def run_base(self, setup: ServerSetup, study: str, url: str, kv: int | None,
                 restrict: int, inl: int, outl: int, n_prompts: int,
                 period_steps: int | None = None, queue: int = 0) -> tuple[dict, RunResult]:
        """One saturated run; ``queue`` one-token fillers for the server's last adapter (not
        among the ``restrict`` ones) wait behind it (see :func:`_saturated`)."""
        models = setup.run_adapters[:restrict] if restrict else [self.model_name]
        if queue and setup.filler_adapter is None:
            raise ValueError("queue fillers need an adapter outside the run's adapters")
        if restrict:   # pre-load the adapters (one request each), as the original study did,
            asyncio.run(self._sequential(url, models))   # so no window holds a first load
        filler = (setup.filler_adapter, queue) if queue else None
        blockers = self.blockers(setup, kv)
        run = asyncio.run(_saturated(url, models, n_prompts, inl, outl, self.a.window_s,
                                     self.a.time_scale, self.a.seed + len(self.tables.runs),
                                     period_steps, filler, blockers))
        name = f"{study}_A{setup.max_loras}_R{setup.max_lora_rank}_S{setup.max_num_seqs}" \
               f"_K{restrict}_in{inl}_out{outl}" + (f"_Q{queue}" if queue else "")
        base = {"model": self.model_name, "study": study, "run_name": name,
                "max_num_seqs": setup.max_num_seqs,
                "max_loras": setup.max_loras if setup.max_loras else np.nan,
                "max_lora_rank": setup.max_lora_rank if setup.max_loras else np.nan,
                "restrict_loras": restrict if setup.max_loras else np.nan,
                "input_len_set": inl, "output_len_set": outl}
        sc = run.scrapes
        tp = (sc[-1].tpot_sum - sc[0].tpot_sum, sc[-1].tpot_count - sc[0].tpot_count)
        tt = (sc[-1].ttft_sum - sc[0].ttft_sum, sc[-1].ttft_count - sc[0].ttft_count)
        row = {**{k: base[k] for k in ("model", "study", "run_name")}, "status": "ok",
               "failure_reason": "", "max_num_seqs": setup.max_num_seqs,
               "max_loras": base["max_loras"], "max_lora_rank": base["max_lora_rank"],
               "max_cpu_loras": len(setup.adapter_ranks) if setup.max_loras else np.nan,
               "adapter_rank_list": " ".join(str(r) for r in sorted(set(setup.adapter_ranks))),
               "restrict_loras": base["restrict_loras"], "input_len_set": inl,
               "output_len_set": outl, "num_prompts_set": n_prompts,
               "enable_lora": setup.max_loras > 0, "lora_pre_loading": bool(restrict),
               "kv_cache_tokens": kv, "num_prompts": n_prompts, "completed": n_prompts,
               "total_input_tokens": run.input_tokens, "total_output_tokens": run.output_tokens,
               "mean_ttft_ms": 1000.0 * tt[0] / tt[1] if tt[1] else np.nan,
               "mean_itl_ms": 1000.0 * tp[0] / tp[1] if tp[1] else np.nan,
               "mean_tpot_ms": 1000.0 * tp[0] / tp[1] if tp[1] else np.nan,
               "mean_batch_size": float(np.mean([s.running for s in sc[1:]])),
               "max_batch_size": float(max(s.running for s in sc)),
               "n_steps": np.nan, "scheduler_time_mean_ms": np.nan,
               "step_interval_mean_ms": np.nan, "mean_batched_tokens": np.nan,
               "queue_fillers": run.fillers, "blocker_requests": run.blockers}
        return {"base": base, "row": row}, run

    def blockers(self, setup: ServerSetup, kv: int | None) -> Blockers | None:
        """Blockers of a lockstep run (see :func:`_saturated`): on a LoRA server one request
        per blocker adapter (``max_loras`` of them), else ``max_num_seqs`` base-model requests;
        as long as 90 % of the KV cache allows (they are cancelled long before, once the
        server holds the run's requests; a blocker that ends first only shortens the wait)."""
        if setup.max_loras > 0:
            if len(setup.blocker_adapters) < setup.max_loras:
                return None
            models = tuple(setup.blocker_adapters)
        else:
            models = (self.model_name,) * setup.max_num_seqs
        mml = self.max_model_len or self.a.max_model_len or 4096
        cap = int(0.9 * kv / len(models)) if kv else 512
        return Blockers(models, max(2, min(cap, mml - 2)))

    def n_prompts(self, setup: ServerSetup, outl: int) -> int:
        """Prompts that keep ``max_num_seqs`` requests running for about ``steady_steps``,
        plus the first cohort after the blockers (skipped: it loads the adapters) and the last
        (nothing waits behind it, so no window ends in it)."""
        return setup.max_num_seqs * (int(np.ceil(self.plan.steady_steps / outl)) + 2)

    def _attempts(self, what: str, once) -> list[dict]:
        """Run ``once()`` -> (info, run, windows) until it yields a window, at most
        ``RUN_ATTEMPTS`` times (a busy machine or a hiccup can leave a run without a
        saturated stretch of whole periods); record the last attempt's run row and windows
        and return the windows."""
        for attempt in range(1, RUN_ATTEMPTS + 1):
            info, run, wins = once()
            if wins:
                break
            self.warn(f"{what}: no saturated window in attempt {attempt} of {RUN_ATTEMPTS}"
                     + ("; running it again" if attempt < RUN_ATTEMPTS else "; left out"))
        row = info["row"]
        row["attempts"] = attempt
        row["duration_s"] = run.wall_s * self.a.time_scale
        row["total_throughput_tps"] = (run.input_tokens + run.output_tokens) / row["duration_s"]
        self.tables.runs.append(row)
        self.tables.windows.extend(wins)
        return wins

    def decode_run(self, setup: ServerSetup, study: str, url: str, kv: int | None, restrict: int,
                   inl: int, outl: int, queue: int = 0) -> list[dict]:
        n_prompts = self.n_prompts(setup, outl)

        def once():
            info, run = self.run_base(setup, study, url, kv, restrict, inl, outl, n_prompts,
                                      period_steps=outl + 1, queue=queue)
            return info, run, _windows(run, info["base"], restrict, lockstep=inl == 1,
                                       period_gaps=(setup.max_num_seqs * (outl - 1)
                                                    if inl == 1 else None))
        return self._attempts(f"{study} K{restrict} in{inl} out{outl} Q{queue}", once)

    def prefill_run(self, setup: ServerSetup, url: str, kv: int | None, inl: int,
                    restrict: int = 0, study: str = "prefill_baseline") -> None:
        """Saturated prefill: every step fills the token budget with prompt tokens. Two output
        tokens per request, so each request's one inter-token gap is the duration of the next
        (equally full) step, as the server records it. With ``restrict`` adapters (study
        ``lora_prefill``) the steps carry LoRA work on a full token budget: at two slot counts
        this separates the per-slot-and-token cost (c6) from the per-slot one (c5), which decode
        windows, whose token count varies little, cannot."""
        n_prompts = min(int(np.ceil(self.plan.steady_steps * self.a.max_num_batched_tokens / inl)),
                        CONNECTIONS)

        def once():
            info, run = self.run_base(setup, study, url, kv, restrict, inl, 2, n_prompts)
            return info, run, _windows(run, info["base"], restrict,
                                       prefill_budget=self.a.max_num_batched_tokens)
        self._attempts(f"{study} K{restrict} in{inl}", once)

    # ---------------------------------------------------------------- studies
    def run_all(self, plan: StudyPlan) -> None:
        from twin.cli_support import progress
        self.plan = plan
        ranks = sorted(set(plan.load_ranks) | set(plan.rank_runs) | {r for _, r in plan.kv_grid}
                       | {8})
        from .dummy_adapters import write_rank_adapters
        self.adapter_dirs = write_rank_adapters(self.work / "adapters", ranks,
                                                self.a.model_name, self.a.model_config,
                                                self.a.seed)
        n_lora_servers = len(plan.lora_configs) + len(self._rank_servers(plan))
        kv_extra = [k for k in plan.kv_grid]
        total = (len(plan.no_lora_seqs) + n_lora_servers + len(plan.load_ranks) + len(kv_extra))
        self.bar = progress(total=total, desc="profile servers", unit="server", quiet=self.quiet)
        try:
            self._no_lora(plan)
            self._lora(plan)
            self._rank(plan)
            self._loading(plan)
            self._kv(plan)
        finally:
            self.bar.close()

    def _no_lora(self, plan: StudyPlan) -> None:
        pre_i = max((i for i, n in enumerate(plan.no_lora_seqs) if n < SLOW_SERVER_SEQS),
                    default=len(plan.no_lora_seqs) // 2)
        for i, n in enumerate(plan.no_lora_seqs):
            setup = ServerSetup(0, 8, n)
            self.say(f"decode baseline max_num_seqs {n}")
            with self.start(setup, slow=n >= SLOW_SERVER_SEQS) as servers:
                url = servers[0].url
                kv = self.record_server(servers[0], setup)
                self.backbone_kv = kv
                for inl, outl in plan.decode_lengths:
                    self.decode_run(setup, "decode_baseline", url, kv, 0, inl, outl)
                if i == pre_i:   # prefill on the largest batch that runs at full speed
                    for inl in plan.prefill_inputs:
                        self.prefill_run(setup, url, kv, inl)
            self.bar.update(1)

    def _lora(self, plan: StudyPlan) -> None:
        """LoRA decode windows at every (max_loras, max_num_seqs) and adapter count; the runs
        whose batch holds ``max_loras`` adapters are repeated with each queue length of fillers
        (an extra adapter, skipped by the scheduler, see :func:`_saturated`); LoRA prefill
        windows at the largest batch of each slot count."""
        inl, outl = plan.decode_lengths[0]
        for a_slots, seqs in plan.lora_configs:
            counts = sorted({_adapter_count(f, a_slots, seqs) for f in plan.lora_adapter_factors})
            fill = 1 if any(plan.queue_lengths) and counts[-1] == a_slots else 0
            setup = ServerSetup(a_slots, 8, seqs, tuple([8] * (max(counts) + fill + a_slots)),
                                fillers=fill, blockers=a_slots)
            self.say(f"LoRA decode max_loras {a_slots} max_num_seqs {seqs}")
            with self.start(setup) as servers:
                url = servers[0].url
                kv = self.record_server(servers[0], setup)
                for k in counts:
                    if k == a_slots and seqs < FULL_RUN_SEQS_PER_SLOT * a_slots:
                        continue   # see FULL_RUN_SEQS_PER_SLOT
                    for q in (plan.queue_lengths if k == a_slots else (0,)):
                        self.decode_run(setup, "lora_decode_overhead", url, kv, k, inl, outl,
                                        queue=q)
                if (a_slots, seqs) == plan.lora_configs[-1]:
                    self.decode_run(setup, "lora_decode_overhead", url, kv, counts[-1],
                                    *plan.decode_lengths[-1])
                if seqs == max(n for a, n in plan.lora_configs if a == a_slots):
                    self.prefill_run(setup, url, kv, plan.prefill_inputs[0], restrict=1,
                                     study="lora_prefill")
            self.bar.update(1)

    def _rank_servers(self, plan: StudyPlan) -> list[tuple[int, int, int]]:
        """(max_loras, max_lora_rank, max_num_seqs) of the rank study's servers: every slot
        count of the LoRA study (at its largest batch) at every rank of ``rank_runs`` but 8
        (the LoRA study's servers are rank 8)."""
        slots = sorted({a for a, _ in plan.lora_configs})
        return [(a, r, max(n for b, n in plan.lora_configs if b == a))
                for a in slots for r in plan.rank_runs if r != 8]

    def _rank(self, plan: StudyPlan) -> None:
        """Rank term c10: LoRA prefill windows (full 2048-token steps, one adapter) on servers
        with ``--max-lora-rank`` 16 and 32. In such a step the LoRA terms are about half of the
        step (tiles and per-slot tokens), so the rank multiplier moves it by percent, where a
        decode step moves by well under one percent; read against the rank-8 LoRA prefill
        windows of the same slot counts, ``twin calibrate`` fits c10 with the other terms."""
        for a_slots, r, seqs in self._rank_servers(plan):
            setup = ServerSetup(a_slots, r, seqs, (r,) * (1 + a_slots), blockers=a_slots)
            self.say(f"rank study max_loras {a_slots} max_lora_rank {r}")
            with self.start(setup) as servers:
                url = servers[0].url
                kv = self.record_server(servers[0], setup)
                self.prefill_run(setup, url, kv, plan.prefill_inputs[0], restrict=1,
                                 study="lora_prefill")
            self.bar.update(1)

    def _loading(self, plan: StudyPlan) -> None:
        for big in plan.load_ranks:
            small = [r for r in plan.load_ranks if r <= big]
            setup = ServerSetup(1, big, 16, tuple(r for r in small for _ in range(2)))
            self.say(f"adapter loading max_lora_rank {big}")
            with self.start(setup) as servers:
                url = servers[0].url
                for r in small:
                    x, y = [n for n, rr in zip(setup.adapter_names, setup.adapter_ranks)
                            if rr == r][:2]
                    same = asyncio.run(self._sequential(url, [x] * (plan.load_requests + 1)))[1:]
                    swap = asyncio.run(self._sequential(
                        url, [y if i % 2 == 0 else x for i in range(plan.load_requests)]))
                    base = float(np.mean(same))
                    for i, t in enumerate(swap):
                        self.tables.loads.append({
                            "model": self.model_name, "adapter_rank": r, "max_lora_rank": big,
                            "kind": "cpu_to_gpu", "phase": "measured", "load_index": i + 1,
                            "load_ms": t - base})
            self.bar.update(1)

    async def _sequential(self, url: str, models: Sequence[str]) -> list[float]:
        """Server-side TTFT (ms) of one-token requests sent one after another."""
        out = []
        prompts = prompt_ids([16] * len(models), self.a.seed + 17)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            before = await _get_scrape(s, url)
            for m, p in zip(models, prompts):
                await _complete(s, url, m, p, 1)
                after = await _get_scrape(s, url)
                dn = after.ttft_count - before.ttft_count
                if dn != 1:
                    raise ValueError(f"{url}: expected one new TTFT observation, got {dn:g}")
                out.append(1000.0 * (after.ttft_sum - before.ttft_sum))
                before = after
        return out

    def _kv(self, plan: StudyPlan) -> None:
        from .launch import launch_servers  # noqa: F401  (start() uses it)
        for a_slots, r in plan.kv_grid:
            if (a_slots, r) not in self.kv_seen:
                setup = ServerSetup(a_slots, r, 16, (r,))
                self.say(f"KV capacity max_loras {a_slots} rank {r}")
                try:
                    with self.start(setup) as servers:
                        self.record_server(servers[0], setup)
                except ValueError as e:
                    self.kv_seen[(a_slots, r)] = None
                    if not self.quiet:
                        print(f"  max_loras {a_slots} max_lora_rank {r}: server did not start "
                              f"({str(e)[:160]})", file=sys.stderr)
            self.bar.update(1)
        mml = self.max_model_len or self.a.max_model_len
        if mml is None:
            raise ValueError("--max-model-len: the server did not report max_model_len in "
                             "/v1/models; pass it")
        for (a_slots, r), kv in sorted(self.kv_seen.items()):
            if (a_slots, r) not in plan.kv_grid:
                continue
            ok = kv is not None and kv >= mml
            self.tables.memory.append({
                "model": self.model_name, "max_loras": a_slots, "max_lora_rank": r,
                "max_num_seqs": 2048, "max_num_batched_tokens": self.a.max_num_batched_tokens,
                "gpu_memory_utilization": 0.9, "status": "ok" if ok else "failed",
                "failure_reason": "" if ok else ("kv_cache_below_max_model_len"
                                                 if kv is not None else "server_start_failed"),
                "kv_cache_tokens": kv, "max_model_len": mml,
                "fits_one_max_len_request": bool(ok)})


# ------------------------------------------------------------------------------ output
SCHEDULER_COLUMNS = ("source,gpu_loras,cpu_loras,cpu_gpu_diff,rank,rate,output_throughput,"
                     "completed_requests,adapter_rates,max_lora_loading_time,avg_batch_size,"
                     "avg_waiting_queue,max_lora_loads_from_memory,max_lora_loads_from_disk,"
                     "max_lora_loads_from_memory_corrected,total_scheduling_time,mean_itl_ms,"
                     "processed_tokens,duration,mean_loras_by_batch,steps,"
                     "scheduling_time_per_step_ms")


def write_tables(t: ProfileTables, out: Path, model_name: str) -> list[Path]:
    """Write the calibration CSVs under ``out``; returns the files written."""
    cal = out / "calibration"
    cal.mkdir(parents=True, exist_ok=True)
    files = []
    for name, rows in (("step_latency_runs.csv", t.runs), ("step_latency_windows.csv", t.windows),
                       ("memory_capacity.csv", t.memory),
                       ("adapter_loading_samples.csv", t.loads)):
        p = cal / name
        pd.DataFrame(rows).to_csv(p, index=False)
        files.append(p)
    p = cal / "scheduler_overhead_runs.csv"
    p.write_text(SCHEDULER_COLUMNS + "\n")
    files.append(p)
    return files


OUT_FILES = ("calibration/step_latency_runs.csv", "calibration/step_latency_windows.csv",
             "calibration/memory_capacity.csv", "calibration/adapter_loading_samples.csv",
             "calibration/scheduler_overhead_runs.csv")


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    from twin.cli_support import float_above, positive_int, seed_type
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for calibration/*.csv (input of `twin calibrate --data DIR`)")
    p.add_argument("--model-name", default=None,
                   help="model name written in the CSVs (and passed to `twin calibrate "
                        "--model`); default: the twin profile's model, else --model")
    p.add_argument("--profile", default="llama-3.1-8b-instruct",
                   help="twin servers: the profile they serve")
    p.add_argument("--study", choices=sorted(STUDIES), default="quick",
                   help="quick: a few configurations (minutes against twin serve); full: the "
                        "GPU owner's study (see the module docstring of "
                        "twin/harness/profile_runs.py)")
    p.add_argument("--window-s", type=float_above(0.0, 60.0), default=1.0, metavar="S",
                   help="twin (GPU) seconds between /metrics scrapes, i.e. the length of a "
                        "step-latency window (wall seconds = S / --time-scale)")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                   help="token budget per step of every server (the profiled vLLM used 2048)")
    p.add_argument("--max-model-len", type=positive_int, default=None,
                   help="the model's context length, if the server does not report it")
    p.add_argument("--seed", type=seed_type, default=0, help="prompt and server seed")
    p.add_argument("--force", action="store_true", help="overwrite CSVs already in --out")


def run_profile_cli(a: argparse.Namespace) -> int:
    """``python -m twin.harness profile``: check options, run the studies, write the CSVs."""
    from twin.cli_support import CliError, check_output_dir

    if not a.launch:
        raise CliError("--launch: profiling restarts the server for every configuration; "
                       "pass --launch (with --server twin or vllm)")
    if a.server == "vllm" and a.time_scale != 1.0:
        raise CliError("--time-scale: real vLLM runs in wall time; use 1")
    if a.server == "vllm" and not a.model:
        raise CliError("--model: needed with --server vllm (HF id or local path)")
    out = check_output_dir(a.out, "--out", a.force, must_be_new_files=OUT_FILES)
    model_name = a.model_name
    if model_name is None:
        if a.server == "twin":
            from twin.profile import load_profile
            model_name = load_profile(a.profile).model
        else:
            model_name = Path(a.model).name.lower()
    a.model_name = model_name
    work = Path(a.work_dir) if a.work_dir else out / "work"
    prof = Profiler(a, model_name, work, a.quiet)
    t0 = time.perf_counter()
    prof.run_all(STUDIES[a.study])
    files = write_tables(prof.tables, out, model_name)
    print(f"profiled {model_name} ({a.study} study, {prof.n_started} server starts, "
          f"{time.perf_counter() - t0:.0f} s): {len(prof.tables.windows)} windows, "
          f"{len(prof.tables.runs)} runs ({prof.repeated_runs()} repeated), "
          f"{len(prof.tables.memory)} KV configurations, {len(prof.tables.loads)} adapter loads")
    for f in files:
        print(f"wrote {f}")
    print(f"next: python -m twin calibrate --data {out} --model {model_name} --out PROFILE.json")
    return 0
