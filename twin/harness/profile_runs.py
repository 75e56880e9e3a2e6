"""Profiling studies for ``python -m twin calibrate``, using only what a stock vLLM exposes.

Every study restarts the server with the configuration it needs (``--launch``) and measures
from the outside: saturated synthetic runs (all prompts sent at once as token-id lists, exact
output lengths with ``ignore_eos``, non-streamed) with ``/metrics`` scraped while they run.
Step times come from the server's own ``vllm:time_per_output_token_seconds`` histogram (Δsum /
Δcount between two scrapes: every inter-token gap of a running request is one engine step), so
they are GPU (twin) time whatever the client's or a stand-in's speed. Written in the
calibration CSV schema (``<out>/calibration/*.csv``, columns as in the shared data README):

* ``step_latency_windows.csv`` — decode studies as the original profiling ran them: 1-token
  prompts and equal outputs, so ``max_num_seqs`` requests run in lockstep cohorts, every step
  schedules one token per running request (``batched_tokens_mean`` = the running gauge) and a
  window spans one whole cohort period (counted in server-recorded gaps), so its mean context
  is the cohort mean. ``decode_baseline`` (LoRA off; several ``--max-num-seqs`` and output
  lengths) and ``lora_decode_overhead`` (LoRA on; several ``--max-loras`` / batch sizes and
  numbers of distinct adapters, pre-loaded; with as many adapters as slots the batch is full
  and the waiting queue is scanned). ``prefill_baseline``: prompt-only runs (two output tokens:
  each request's one gap is the next step, as full of prompt tokens as the others; long
  prompts, so that a few hundred requests, all sent at once, fill hundreds of steps). Only
  windows with requests waiting at both ends (a saturated server) are kept.
* ``step_latency_runs.csv`` — one row per run (totals, mean ITL/TTFT, KV capacity). vLLM does
  not expose the scheduler's own time: those columns stay empty and ``twin calibrate`` then
  fits the waiting-queue term with the step time.
* ``memory_capacity.csv`` — KV tokens = ``num_gpu_blocks x block_size`` of
  ``vllm:cache_config_info`` at start-up, for every (max_loras, max_lora_rank) of the KV grid; a
  server that does not start is a ``failed`` row.
* ``adapter_loading_samples.csv`` — CPU->GPU load time per (adapter rank, max_lora_rank): with
  one slot (``--max-loras 1``), sequential one-token requests alternating two adapters (each
  swaps) minus the same requests to one resident adapter (server-side TTFT histogram).
* ``scheduler_overhead_runs.csv`` — the shared runs of the original study (patched vLLM); a
  stock server cannot produce them, so the file has the header only.
* ``../validation_llama/maxsearch_llama.csv`` (only for ``llama-3.1-8b-instruct``, the model
  stage 3 of calibrate reads; other models get ``rank_runs.csv``) — saturated LoRA runs at
  ``max_lora_rank`` 8/16/32 for the rank term.

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
PERIOD_TOLERANCE = 0.08     # a window may differ from a whole period by this share of its gaps
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
RUN_TIMEOUT_S = 3600.0      # wall bound of one run


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
                       kv_grid=((8, 8), (64, 8), (32, 16), (64, 32), (384, 8), (384, 32)),
                       load_ranks=(8, 16, 32), steady_steps=500, load_requests=4),
    "full": StudyPlan(no_lora_seqs=(8, 16, 32, 64, 128, 192, 256, 320, 384, 512),
                      decode_lengths=((1, 100), (1, 200), (1, 400)),
                      prefill_inputs=(700, 1000, 1500, 3000, 6000),
                      lora_configs=tuple((a, n) for a in (8, 32, 64, 128, 256) for n in (64, 192)),
                      lora_adapter_factors=(0.0625, 0.25, 0.5, 1.0),
                      rank_runs=(8, 16, 32),
                      kv_grid=tuple((a, r) for r in (8, 16, 32) for a in
                                    (8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352,
                                     384)),
                      load_ranks=(8, 16, 32), steady_steps=2000, load_requests=50),
}


@dataclass(frozen=True)
class ServerSetup:
    """One server configuration (``max_loras`` 0 = LoRA off) and its adapters' ranks."""

    max_loras: int
    max_lora_rank: int
    max_num_seqs: int
    adapter_ranks: tuple[int, ...] = ()

    @property
    def adapter_names(self) -> list[str]:
        return [f"r{r}-{i}" for i, r in enumerate(self.adapter_ranks)]


@dataclass
class ProfileTables:
    """Rows of every CSV, filled study by study."""

    runs: list[dict] = field(default_factory=list)
    windows: list[dict] = field(default_factory=list)
    memory: list[dict] = field(default_factory=list)
    loads: list[dict] = field(default_factory=list)
    rank_runs: list[dict] = field(default_factory=list)


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


def _scrape_of(text: str, wall: float) -> Scrape:
    s = parse_prometheus(text)
    lora = metric_labels(s, "vllm:lora_requests_info") or {}
    running_ad = [x for x in lora.get("running_lora_adapters", "").split(",") if x]
    return Scrape(wall, metric_value(s, "vllm:num_requests_running", 0.0),
                  metric_value(s, "vllm:num_requests_waiting", 0.0),
                  metric_value(s, f"{TPOT}_sum", 0.0), metric_value(s, f"{TPOT}_count", 0.0),
                  metric_value(s, f"{TTFT}_sum", 0.0), metric_value(s, f"{TTFT}_count", 0.0),
                  metric_value(s, "vllm:gpu_cache_usage_perc", 0.0), len(running_ad))


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
    scrapes: tuple[Scrape, ...]
    finish_wall: tuple[float, ...]
    input_tokens: int
    output_tokens: int
    wall_s: float


async def _saturated(url: str, models: Sequence[str], n_prompts: int, input_len: int,
                     output_len: int, window_s: float, time_scale: float, seed: int,
                     period_steps: int | None = None) -> RunResult:
    """Send ``n_prompts`` at once and scrape ``/metrics`` every window (twin seconds).

    ``period_steps``: equal requests sent together run in lockstep cohorts of that many steps,
    over which the context length sweeps; then ``/metrics`` is scraped ``SCRAPES_PER_PERIOD``
    times per cohort period (estimated from the last interval's mean step) so that
    :func:`_windows` can cut windows of whole periods."""
    prompts = prompt_ids([input_len] * n_prompts, seed)
    conn = aiohttp.TCPConnector(limit=CONNECTIONS)
    timeout = aiohttp.ClientTimeout(total=RUN_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        scrapes = [await _get_scrape(s, url)]
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(_complete(s, url, models[i % len(models)], prompts[i],
                                                 output_len)) for i in range(n_prompts)]
        pending = set(tasks)
        interval = window_s / time_scale
        while pending:
            done, pending = await asyncio.wait(pending, timeout=interval)
            for t in done:
                if t.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise t.exception()
            scrapes.append(await _get_scrape(s, url))
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
                     sum(r[1] for r in res), time.perf_counter() - t0)


def _intervals(sc: Sequence[Scrape], period_gaps: float | None) -> list[tuple[Scrape, Scrape]]:
    """Scrape pairs that bound the windows: consecutive scrapes, or (``period_gaps``) spans of
    one lockstep cohort period, i.e. the pair whose gap count differs by the period's gaps
    (n requests x (output - 1)) within ``PERIOD_TOLERANCE``. Counted in server-recorded gaps,
    the cut does not depend on how fast the client or server ran."""
    if not period_gaps:
        return list(zip(sc[:-1], sc[1:]))
    busy = [x for x in sc if x.waiting > 0 and x.running > 0]   # saturated scrapes
    out, i = [], 0
    while i < len(busy) - 1:
        counts = np.array([x.tpot_count - busy[i].tpot_count for x in busy[i + 1:]])
        j = int(np.argmin(np.abs(counts - period_gaps)))
        if abs(counts[j] - period_gaps) <= PERIOD_TOLERANCE * period_gaps:
            out.append((busy[i], busy[i + 1 + j]))
            i = i + 1 + j
        else:
            i += 1
    return out


def _windows(run: RunResult, base: dict, restrict: int, lockstep: bool = False,
             period_gaps: float | None = None) -> list[dict]:
    """One row per window in which the server was saturated (requests waiting at both ends,
    so every step ran a full batch) and recorded inter-token gaps; windows are scrape intervals
    or, with ``period_gaps``, whole lockstep periods (see :func:`_intervals`).

    ``lockstep`` (decode runs of 1-token prompts): every step schedules exactly one token per
    running request (a decode token, or the one prompt token of a newly admitted request), so
    ``batched_tokens_mean`` is the running count (vLLM exposes no per-step token count)."""
    rows = []
    sc = run.scrapes
    full = max(x.running for x in sc)
    for a, b in _intervals(sc, period_gaps):
        dn = b.tpot_count - a.tpot_count
        if dn <= 0 or a.waiting <= 0 or b.waiting <= 0:
            continue
        # a scrape taken after some requests of a cohort finished and before their successors
        # were admitted shows fewer running; one a period later shows the same dip (same
        # phase) and would pass calibrate's equality test with the wrong batch size
        if period_gaps and (a.running < full or b.running < full):
            continue
        rows.append({**base, "window_start_s": a.wall - sc[0].wall, "window_len_s": b.wall - a.wall,
                     "n_steps": np.nan,
                     "step_interval_mean_ms": 1000.0 * (b.tpot_sum - a.tpot_sum) / dn,
                     "scheduler_time_mean_ms": np.nan,
                     "unique_adapters_mean": (0.5 * (a.running_adapters + b.running_adapters)
                                              if restrict else 0.0),
                     "batched_tokens_mean": (a.running if lockstep and a.running == b.running
                                             else np.nan), "running_start": a.running,
                     "running_end": b.running, "waiting_end": b.waiting,
                     "kv_usage_end_frac": b.kv_usage})
    return rows


# ------------------------------------------------------------------------------ servers
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

    def start(self, setup: ServerSetup):
        """Context manager: one launched server of ``setup`` (records its KV capacity)."""
        from .launch import launch_servers
        self.n_started += 1
        return launch_servers([self._spec(setup)], self.work / "logs" / f"s{self.n_started}",
                              self.a.server, profile=self.a.profile,
                              time_scale=self.a.time_scale, seed=self.a.seed,
                              model=self.a.model, gpu_ids=self._gpu_ids(),
                              served_model_name=self.model_name)

    def _gpu_ids(self) -> list[str] | None:
        return self.a.gpu_ids.split(",")[:1] if self.a.gpu_ids else None

    def record_server(self, url: str, setup: ServerSetup) -> int | None:
        from .client import get_json, scrape_metrics
        s = scrape_metrics(url)
        cc = metric_labels(s, "vllm:cache_config_info") or {}
        kv = (int(float(cc["num_gpu_blocks"])) * int(float(cc["block_size"]))
              if "num_gpu_blocks" in cc and "block_size" in cc else None)
        for m in get_json(f"{url}/v1/models").get("data", []):
            if m.get("max_model_len") and not m.get("parent"):
                self.max_model_len = int(m["max_model_len"])
        if setup.max_loras > 0:
            self.kv_seen[(setup.max_loras, setup.max_lora_rank)] = kv
        return kv

    def run_base(self, setup: ServerSetup, study: str, url: str, kv: int | None,
                 restrict: int, inl: int, outl: int, n_prompts: int,
                 period_steps: int | None = None) -> tuple[dict, RunResult]:
        models = setup.adapter_names[:restrict] if restrict else [self.model_name]
        if restrict:   # pre-load the adapters (one request each), as the original study did,
            asyncio.run(self._sequential(url, models))   # so no window holds a first load
        run = asyncio.run(_saturated(url, models, n_prompts, inl, outl, self.a.window_s,
                                     self.a.time_scale, self.a.seed + len(self.tables.runs),
                                     period_steps))
        name = f"{study}_A{setup.max_loras}_R{setup.max_lora_rank}_S{setup.max_num_seqs}" \
               f"_K{restrict}_in{inl}_out{outl}"
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
               "step_interval_mean_ms": np.nan, "mean_batched_tokens": np.nan}
        return {"base": base, "row": row}, run

    def n_prompts(self, setup: ServerSetup, outl: int) -> int:
        """Prompts that keep ``max_num_seqs`` requests running for about ``steady_steps``."""
        return setup.max_num_seqs * (int(np.ceil(self.plan.steady_steps / outl)) + 1)

    def decode_run(self, setup: ServerSetup, study: str, url: str, kv: int | None, restrict: int,
                   inl: int, outl: int) -> list[dict]:
        n_prompts = self.n_prompts(setup, outl)
        info, run = self.run_base(setup, study, url, kv, restrict, inl, outl, n_prompts,
                                  period_steps=outl + 1)
        wins = _windows(run, info["base"], restrict, lockstep=inl == 1,
                        period_gaps=setup.max_num_seqs * (outl - 1) if inl == 1 else None)
        scale = self.a.time_scale
        row = info["row"]
        row["duration_s"] = run.wall_s * scale
        row["total_throughput_tps"] = (run.input_tokens + run.output_tokens) / row["duration_s"]
        self.tables.runs.append(row)
        self.tables.windows.extend(wins)
        return wins

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
        info, run = self.run_base(setup, study, url, kv, restrict, inl, 2, n_prompts)
        row = info["row"]
        row["duration_s"] = run.wall_s * self.a.time_scale
        row["total_throughput_tps"] = (run.input_tokens + run.output_tokens) / row["duration_s"]
        self.tables.runs.append(row)
        self.tables.windows.extend(_windows(run, info["base"], restrict))

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
        n_lora_servers = len(plan.lora_configs) + len(plan.rank_runs)
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
        for i, n in enumerate(plan.no_lora_seqs):
            setup = ServerSetup(0, 8, n)
            self.say(f"decode baseline max_num_seqs {n}")
            with self.start(setup) as servers:
                url = servers[0].url
                kv = self.record_server(url, setup)
                self.backbone_kv = kv
                for inl, outl in plan.decode_lengths:
                    self.decode_run(setup, "decode_baseline", url, kv, 0, inl, outl)
                if i == len(plan.no_lora_seqs) // 2:
                    for inl in plan.prefill_inputs:
                        self.prefill_run(setup, url, kv, inl)
            self.bar.update(1)

    def _lora(self, plan: StudyPlan) -> None:
        inl, outl = plan.decode_lengths[0]
        for a_slots, seqs in plan.lora_configs:
            counts = sorted({max(1, int(round(f * a_slots))) for f in plan.lora_adapter_factors})
            setup = ServerSetup(a_slots, 8, seqs, tuple([8] * max(counts)))
            self.say(f"LoRA decode max_loras {a_slots} max_num_seqs {seqs}")
            with self.start(setup) as servers:
                url = servers[0].url
                kv = self.record_server(url, setup)
                for k in counts:
                    self.decode_run(setup, "lora_decode_overhead", url, kv, k, inl, outl)
                if (a_slots, seqs) == plan.lora_configs[-1]:
                    self.decode_run(setup, "lora_decode_overhead", url, kv, counts[-1],
                                    *plan.decode_lengths[-1])
                if seqs == max(n for a, n in plan.lora_configs if a == a_slots):
                    self.prefill_run(setup, url, kv, plan.prefill_inputs[0], restrict=1,
                                     study="lora_prefill")
            self.bar.update(1)

    def _rank(self, plan: StudyPlan) -> None:
        a_slots, seqs = plan.lora_configs[0]
        for r in plan.rank_runs:
            setup = ServerSetup(a_slots, r, seqs, tuple([r] * a_slots))
            self.say(f"rank study max_lora_rank {r}")
            with self.start(setup) as servers:
                url = servers[0].url
                kv = self.record_server(url, setup)
                for k in (1, a_slots // 2, a_slots):
                    for inl, outl in plan.decode_lengths:
                        n_prompts = self.n_prompts(setup, outl)
                        info, run = self.run_base(setup, "rank", url, kv, k, inl, outl, n_prompts,
                                                  period_steps=outl + 1)
                        wins = [w for w in _windows(run, info["base"], k, lockstep=inl == 1,
                                                    period_gaps=seqs * (outl - 1))
                                if w["running_start"] == w["running_end"]]
                        if not wins:
                            continue
                        w = pd.DataFrame(wins)
                        # server mean ITL over the steady windows, weighted by their gaps
                        self.tables.rank_runs.append({
                            "status": "ok", "model": self.model_name, "max_loras": a_slots,
                            "served_adapters": k, "max_lora_rank": r,
                            "pool_mean_input_len": inl, "pool_mean_output_len": outl,
                            "mean_running": float(w.running_end.mean()),
                            "mean_waiting": float(w.waiting_end.mean()),
                            "mean_itl_ms": float(w.step_interval_mean_ms.mean()),
                            "kv_cache_tokens": kv})
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
                        self.record_server(servers[0].url, setup)
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
RANK_MODEL = "llama-3.1-8b-instruct"   # twin.calibrate stage 3 reads this model's rank runs


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
    if t.rank_runs:
        sub = out / "validation_llama" if model_name == RANK_MODEL else out
        name = "maxsearch_llama.csv" if model_name == RANK_MODEL else "rank_runs.csv"
        sub.mkdir(parents=True, exist_ok=True)
        p = sub / name
        pd.DataFrame(t.rank_runs).to_csv(p, index=False)
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
          f"{len(prof.tables.runs)} runs, {len(prof.tables.memory)} KV configurations, "
          f"{len(prof.tables.loads)} adapter loads, {len(prof.tables.rank_runs)} rank runs")
    for f in files:
        print(f"wrote {f}")
    print(f"next: python -m twin calibrate --data {out} --model {model_name} --out PROFILE.json")
    return 0
