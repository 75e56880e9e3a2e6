"""Fit a :class:`GpuProfile` from the profiling CSVs in ``<data>/calibration/``.

Sources (one base model at a time; the scheduler-overhead runs are shared, see below):

* ``step_latency_windows.csv`` (+ ``step_latency_runs.csv`` for actual token lengths): ~2-s
  windows with a constant batch (``running_start == running_end``).
  - decode windows (decode_baseline, lora_decode_baseline, lora_decode_overhead): n requests,
    each decoding 1 token; prefill tokens = batched_tokens_mean - n when logged, else
    n * input_len / output_len (new requests replacing finished ones); ctx_tokens =
    n * (input_len + output_len / 2) (steady-state mean context of a decoding request);
    n_distinct = unique_adapters_mean; max_loras 300 rank 8 for the overhead study.
  - prefill windows: 2048 prefill tokens per step, n_seqs = 2048 / input_len + 1, ctx =
    input_len / 2 (the one partially prefilled request).
  - lora_find_max_batch windows: batched_tokens_mean split into prefill / decode in the
    ratio input_len : output_len.
* ``step_latency_runs.csv`` prefill_baseline rows without windows (Qwen): run averages
  (tokens per step = (input + output tokens) / n_steps).
* ``scheduler_overhead_runs.csv`` (shared by all models, base model not stated, fixed-length
  "mean" dummy requests: 250 input / 231 output tokens, rank 8, max_loras 8..448): mean step
  time = (duration - CPU->GPU loading time) / steps, only runs that are surely never idle
  (avg_batch_size >= 8); n_seqs = n_decode = avg_batch_size, prefill tokens per step =
  processed_tokens / 231 * 250 / steps, ctx = avg_batch_size * (250 + 231 / 2),
  n_distinct = mean_loras_by_batch, n_waiting = avg_waiting_queue when the batch is full
  (mean distinct adapters >= 0.9 max_loras; else 0: only then does the scheduler walk the whole
  waiting queue, which is what the kernel charges per step). Each of its two source
  files gets a free additive offset (nuisance; the base model/engine may differ). The
  ``fixed_aggregated_rate`` runs with gpu_loras <= 16 are excluded: they are ~10 ms slower
  than the ``fixed_per_adapter_rate`` runs at identical settings (unexplained).

Fit: stage 1 fits the scheduler part (c0, c2, c9) to the logged scheduler times
(``scheduler_time_mean_ms`` / ``scheduling_time_per_step_ms``); stage 2 fits c0..c8 to the step
wall times with c9 fixed from stage 1. Both are non-negative least squares on relative error.

Rank term (c10, ``rank_scale``): every profiling row above is rank 8, so stage 3 fits the
relative rank multiplier of the LoRA terms on the Llama max-search runs
(``<data>/validation_llama/maxsearch_llama.csv``, ``max_lora_rank`` 16 and 32; never the
validation runs, which the fidelity check replays) — see :func:`fit_rank_scale`. The
``llama2_perf_analysis_runs.csv`` runs are another model on the older V0 engine and do not
isolate it: the compute-overhead runs give each rank its own ``max_loras`` (e.g. 200 / 150 / 100
slots for ranks 8 / 16 / 32), their latency runs at one slot swap an adapter on every request,
and the few runs that vary rank at equal slots (motivation figure, 13 ok runs) differ in batch
size and have no step logs. The multiplier is
relative to a profile's own LoRA cost, so it is shared by every profile (the Qwen rows are
rank 8 only, like Llama's); without the max-search file c10 stays 0 and the report says so.
Slot terms (stage 4, :mod:`twin.slot_fit`): the LoRA windows all run at 300 slots, so the terms
that grow with slots, adapters and LoRA tiles (c5-c8) are pinned at one point; where the data
folder holds max-search runs of the model (``RANK_RUNS``), they are refitted on those runs
replayed in the twin (throughput of the saturated ones, mean ITL of those that kept up),
together with the LoRA windows (weights by cross-rank validation). Never on the validation
runs. A model without such runs (Qwen here) takes the shipped ``RANK_RUNS_MODEL`` profile's
stage-4 correction, scaled by the ratio of the two models' LoRA cost on their own windows
(``twin.slot_fit.transfer_slot_terms``; calibrate that profile first); the report says which.
Data from ``python -m twin.harness profile`` has LoRA prefill windows at ``max_lora_rank`` 8, 16
and 32 instead: when the windows hold more than one rank, stage 2 fits c10 with the other terms
(a bounded 1-D search over c10, NNLS at each value) and stage 3 is not used. Its windows also
carry ``waiting_mean`` (the waiting gauge averaged over the window), used for the scanned queue
in place of ``waiting_end``, and ``ctx_tokens_mean``, the steps' mean context known from the
run's design (whole lockstep periods: n x ((out - 1) in + (out - 1)(out - 2) / 2) / out where
the formula above gives n x (in + out / 2); saturated prompt-only steps: mostly the contexts of
the requests decoding their second token, which in / 2 leaves out), used in place of those
estimates. None of these occurs in the shared data, whose fit is unchanged.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from dataclasses import replace

import numpy as np
import pandas as pd

from .profile import GpuProfile
from .slot_fit import slot_terms_from_data
from .step_time import (FEATURE_NAMES, LINEAR_IDX, STEP_COEF_NAMES, StepTimeModel,
                        describe_step_model, design_matrix)

GPU_NAME = "H100-64GB"
SCHED_IN, SCHED_OUT = 250.0, 231.0   # fixed request of the dummy "mean" dataset
MIN_BUSY_BATCH = 8.0                  # scheduler runs: avg batch below this may include idle time
SEQ_KNEES = (32.0, 64.0, 96.0, 128.0, 192.0, 256.0)
SCHED_OFFSETS = False                # free per-file offsets for the shared scheduler runs
# The scheduler walks the whole waiting queue only while the batch holds max_loras adapters
# (then it skips other adapters' requests); a run whose mean distinct adapters per batch is at
# least this fraction of max_loras counts as "full", and its waiting queue as scanned.
FULL_BATCH_FRAC = 0.9
# Coefficients fitted in stage 2 (c9 comes from stage 1, c10 from stage 3: rank 8 data only).
STEP_FIT_TERMS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 11)
# Stage 3 (rank term): end-to-end runs with several server max ranks, relative to the data folder,
# and the profile whose step coefficients they are read against.
RANK_RUNS = Path("validation_llama") / "maxsearch_llama.csv"
RANK_RUNS_MODEL = "llama-3.1-8b-instruct"
RANK_RUN_COLUMNS = ("status", "model", "max_loras", "served_adapters", "max_lora_rank",
                    "pool_mean_input_len", "pool_mean_output_len", "mean_running",
                    "mean_waiting", "mean_itl_ms")
SCHED_SOURCE_WEIGHT = 0.5             # relative weight of a shared scheduler-run row vs a window
RANK_SCALE_MAX = 1.0                  # search bound of c10 when windows at several ranks fit it


# ---------------------------------------------------------------------------- data assembly
def _cal(data_dir: Path) -> Path:
    """The folder with the profiling CSVs: ``data_dir/calibration`` or ``data_dir`` itself."""
    d = Path(data_dir)
    for c in (d / "calibration", d):
        if (c / "step_latency_runs.csv").is_file():
            return c
    raise FileNotFoundError(f"--data {d}: no step_latency_runs.csv in it or in its calibration/ "
                            "folder")


def lora_tiles(K, D, P):
    """Expected LoRA kernel tiles of a step (see twin.step_time): D decode tokens spread evenly
    over K adapters (ceil(D / K / 16) tiles each) plus P prefill tokens in 16-token tiles."""
    K = np.asarray(K, dtype=float)
    D = np.asarray(D, dtype=float)
    P = np.asarray(P, dtype=float)
    per = np.ceil(np.where(K > 0, D / np.maximum(K, 1e-9), 0.0) / 16.0)
    return K * per + np.ceil(P / 16.0)


def _row(src, S, P, D, C, K, A, R, W, y, ysched, weight=1.0) -> dict:
    return dict(source=src, n_seqs=S, n_prefill_tokens=P, n_decode_tokens=D, ctx_tokens=C,
                n_distinct=K, max_loras=A, max_rank=R, n_waiting=W,
                n_tiles=float(lora_tiles(K, D, P)), y=y, ysched=ysched, weight=weight)


def step_rows(data_dir: Path, model: str) -> pd.DataFrame:
    """Fitting rows (features of FEATURE_NAMES + y, ysched, source, weight) for one model."""
    cal = _cal(data_dir)
    runs = pd.read_csv(cal / "step_latency_runs.csv")
    runs = runs[(runs.model == model) & (runs.status == "ok")]
    if runs.empty:
        raise ValueError(f"no ok step_latency_runs rows for model {model!r}")
    win = pd.read_csv(cal / "step_latency_windows.csv")
    win = win[win.model == model]
    lens = {r.run_name: (r.total_input_tokens / r.completed, r.total_output_tokens / r.completed)
            for r in runs.itertuples() if r.completed and r.completed > 0}
    rows = []
    for x in win.itertuples():
        if x.run_name not in lens or x.running_start != x.running_end:
            continue
        inl, outl = lens[x.run_name]
        A = 0.0 if pd.isna(x.max_loras) else float(x.max_loras)
        R = 0.0 if pd.isna(x.max_lora_rank) else float(x.max_lora_rank)
        K = 0.0 if pd.isna(x.unique_adapters_mean) else float(x.unique_adapters_mean)
        # twin.harness windows also log the waiting gauge averaged over the window
        wq = getattr(x, "waiting_mean", np.nan)
        wq = float(x.waiting_end) if pd.isna(wq) else float(wq)
        W = wq if A > 0 and K >= FULL_BATCH_FRAC * A else 0.0
        # twin.harness windows state their steps' exact mean context (ctx_tokens_mean)
        C = getattr(x, "ctx_tokens_mean", np.nan)
        if x.study in ("prefill_baseline", "lora_prefill"):   # lora_prefill: twin.harness
            rows.append(_row(x.study, 2048.0 / inl + 1.0, 2048.0, 0.0,
                             inl / 2.0 if pd.isna(C) else float(C),
                             K, A, R, W, x.step_interval_mean_ms, x.scheduler_time_mean_ms))
            continue
        n = float(x.running_start)
        if n < 1:
            continue
        if x.study == "lora_find_max_batch":
            if pd.isna(x.batched_tokens_mean):
                continue
            T = float(x.batched_tokens_mean)
            P = T * inl / (inl + outl)
            D = T - P
        else:
            D = n
            P = (max(float(x.batched_tokens_mean) - n, 0.0)
                 if not pd.isna(x.batched_tokens_mean) else n * inl / outl)
        C = n * (inl + outl / 2.0) if pd.isna(C) else float(C)
        rows.append(_row(x.study, n, P, D, C, K, A, R, W,
                         x.step_interval_mean_ms, x.scheduler_time_mean_ms))
    # prefill runs that have no windows (run averages)
    have_win = set(win.run_name[win.study == "prefill_baseline"])
    for r in runs[(runs.study == "prefill_baseline") & ~runs.run_name.isin(have_win)].itertuples():
        if pd.isna(r.n_steps) or pd.isna(r.step_interval_mean_ms) or r.n_steps <= 0:
            continue
        inl = r.total_input_tokens / r.completed
        tok = (r.total_input_tokens + r.total_output_tokens) / r.n_steps
        rows.append(_row("prefill_baseline_run", r.completed / r.n_steps, tok, 0.0, inl / 2.0,
                         0.0, 0.0, 0.0, 0.0, r.step_interval_mean_ms, r.scheduler_time_mean_ms,
                         weight=3.0))
    return pd.DataFrame(rows)


def scheduler_rows(data_dir: Path) -> pd.DataFrame:
    """Rows from the shared ``scheduler_overhead_runs.csv`` (see module docstring)."""
    s = pd.read_csv(_cal(data_dir) / "scheduler_overhead_runs.csv")
    s = s[s.avg_batch_size >= MIN_BUSY_BATCH]
    s = s[~((s.source == "fixed_aggregated_rate") & (s.gpu_loras <= 16))]
    steps = s.steps.astype(float)
    out = pd.DataFrame(dict(
        source="sched_" + s.source,
        n_seqs=s.avg_batch_size, n_prefill_tokens=s.processed_tokens / SCHED_OUT * SCHED_IN / steps,
        n_decode_tokens=s.processed_tokens / steps,
        ctx_tokens=s.avg_batch_size * (SCHED_IN + SCHED_OUT / 2.0),
        n_distinct=s.mean_loras_by_batch, max_loras=s.gpu_loras.astype(float),
        max_rank=s["rank"].astype(float),
        n_tiles=lora_tiles(s.mean_loras_by_batch, s.processed_tokens / steps,
                           s.processed_tokens / SCHED_OUT * SCHED_IN / steps),
        n_waiting=s.avg_waiting_queue * (s.mean_loras_by_batch >= FULL_BATCH_FRAC * s.gpu_loras),
        y=(s.duration - s.max_lora_loading_time) / steps * 1000.0,
        ysched=s.scheduling_time_per_step_ms, weight=SCHED_SOURCE_WEIGHT))
    return out.reset_index(drop=True)


# ---------------------------------------------------------------------------- metrics
def fit_metrics(y, p) -> dict:
    """n, R^2, MAPE %, SMAPE % (no factor 2, as in DESIGN.md), bias % of predictions p."""
    y = np.asarray(y, float)
    p = np.asarray(p, float)
    n = len(y)
    if n == 0:
        return {"n": 0}
    ss_res = float(np.sum((y - p) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "n": n,
        "r2": (1.0 - ss_res / ss_tot) if ss_tot > 0 else float("nan"),
        "mape_pct": float(100 * np.mean(np.abs(p - y) / np.abs(y))),
        "smape_pct": float(100 * np.mean(np.abs(p - y) / (np.abs(y) + np.abs(p)))),
        "bias_pct": float(100 * np.mean((p - y) / y)),
    }


# ---------------------------------------------------------------------------- tables
def kv_table(data_dir: Path, model: str) -> tuple[dict[tuple[int, int], int], int, tuple[int, ...]]:
    """(kv_capacity of starting configs, max_model_len, ranks probed) from memory_capacity.csv."""
    m = pd.read_csv(_cal(data_dir) / "memory_capacity.csv")
    m = m[m.model == model]
    if m.empty:
        raise ValueError(f"no memory_capacity rows for model {model!r}")
    mml = int(m.max_model_len.max())
    ok = m[(m.status == "ok") & m.kv_cache_tokens.notna() & (m.kv_cache_tokens >= m.max_model_len)]
    kv = {(int(r.max_loras), int(r.max_lora_rank)): int(r.kv_cache_tokens) for r in ok.itertuples()}
    return kv, mml, tuple(sorted(int(r) for r in m.max_lora_rank.unique()))


def load_table(data_dir: Path, model: str) -> dict[tuple[int, int], float]:
    """Mean measured CPU->GPU load time (ms) per (adapter_rank, max_lora_rank).

    Mean of the single loads measured during the benchmark (adapter_loading_samples.csv,
    kind cpu_to_gpu, phase measured); falls back to the summary's mean_activation_ms_paper.
    """
    cal = _cal(data_dir)
    out: dict[tuple[int, int], float] = {}
    p = cal / "adapter_loading_samples.csv"
    if p.exists():
        s = pd.read_csv(p)
        s = s[(s.model == model) & (s.kind == "cpu_to_gpu") & (s.phase == "measured")]
        for (a, r), g in s.groupby(["adapter_rank", "max_lora_rank"]):
            out[(int(a), int(r))] = float(g.load_ms.mean())
    if not out:
        s = pd.read_csv(cal / "adapter_loading_summary.csv")
        for r in s[s.model == model].itertuples():
            out[(int(r.adapter_rank), int(r.max_lora_rank))] = float(r.mean_activation_ms_paper)
    if not out:
        raise ValueError(f"no adapter loading data for model {model!r}")
    return out


def backbone_kv(data_dir: Path, model: str) -> int:
    """KV tokens with LoRA disabled: smallest logged value over the no-LoRA baseline runs
    (the runs with the largest max_num_seqs leave the least memory, closest to 2048)."""
    r = pd.read_csv(_cal(data_dir) / "step_latency_runs.csv")
    r = r[(r.model == model) & r.study.isin(["decode_baseline", "lora_decode_baseline",
                                             "prefill_baseline"]) & r.kv_cache_tokens.notna()]
    if r.empty:
        raise ValueError(f"no baseline kv_cache_tokens for model {model!r}")
    top = r[r.max_num_seqs == r.max_num_seqs.max()]
    return int(top.kv_cache_tokens.min())


# ---------------------------------------------------------------------------- fit
def fit_step_coef(rows: pd.DataFrame, sched_offsets: bool = SCHED_OFFSETS,
                  fit_rank: bool = False) -> tuple[np.ndarray, dict]:
    """Two-stage fit (see module docstring). Returns (coef of length 11, report dict).

    ``sched_offsets``: give each scheduler-run source file a free additive offset.
    ``fit_rank``: the rows hold LoRA windows at several ``max_lora_rank`` (twin.harness
    profile); then c10 is fitted in stage 2 too (bounded 1-D search, NNLS for the rest at each
    value) instead of staying 0 for stage 3.
    """
    X = rows[list(FEATURE_NAMES)]
    w = rows.weight.to_numpy(float)
    ok_s = rows.ysched.notna() & (rows.ysched > 0)
    # a stock vLLM logs no scheduler time (twin.harness profile): then c9 is fitted in stage 2
    stage2_terms = STEP_FIT_TERMS if ok_s.any() else STEP_FIT_TERMS + (9,)
    st1 = (StepTimeModel(fit_terms=(0, 2, 9)).fit(X[ok_s], rows.ysched[ok_s],
                                                 sample_weight=w[ok_s]) if ok_s.any() else None)
    sched_coef = st1.coef_ if st1 is not None else np.zeros(len(STEP_COEF_NAMES))
    srcs = sorted(s for s in rows.source.unique() if s.startswith("sched_")) if sched_offsets else []
    nuis = np.column_stack([(rows.source == s).to_numpy(float) for s in srcs]) if srcs else None
    def fit_at(knee: float, rank_scale: float) -> tuple[float, StepTimeModel]:
        m = StepTimeModel(rank_scale=rank_scale, seq_knee=knee, fit_terms=stage2_terms,
                          fixed_coef=sched_coef)
        m.fit(X, rows.y, sample_weight=w, nuisance=nuis)
        p = m.predict(X) + (nuis @ m.nuisance_coef_ if srcs else 0.0)
        return float(np.sum((w * (p - rows.y) / rows.y) ** 2)), m

    best = None
    for knee in SEQ_KNEES:   # c12 by grid search, the rest by NNLS
        if fit_rank:
            from scipy.optimize import minimize_scalar
            r = minimize_scalar(lambda c: fit_at(knee, c)[0], bounds=(0.0, RANK_SCALE_MAX),
                                method="bounded", options={"xatol": 1e-7})
            loss, m = fit_at(knee, float(r.x))
        else:
            loss, m = fit_at(knee, 0.0)
        if best is None or loss < best[0]:
            best = (loss, m)
    st2 = best[1]
    coef = st2.coef_.copy()
    pred = st2.predict(X)
    if srcs:
        pred_n = pred + nuis @ st2.nuisance_coef_
    else:
        pred_n = pred
    rep: dict = {"step_time": {}, "scheduler_time": {}, "nuisance_offsets_ms": {}}
    for s, g in rows.groupby("source"):
        idx = g.index.to_numpy()
        rep["step_time"][s] = fit_metrics(g.y, pred_n[idx])
        if s.startswith("sched_"):
            rep["step_time"][s + " (no offset)"] = fit_metrics(g.y, pred[idx])
        gs = g[g.ysched.notna() & (g.ysched > 0)]
        if len(gs):
            rep["scheduler_time"][s] = fit_metrics(gs.ysched, st1.predict(gs[list(FEATURE_NAMES)]))
    win = ~rows.source.str.startswith("sched_")
    rep["step_time"]["ALL model-specific"] = fit_metrics(rows.y[win], pred[win.to_numpy()])
    for s, v in zip(srcs, (st2.nuisance_coef_ if srcs else [])):
        rep["nuisance_offsets_ms"][s] = float(v)
    rep["scheduler_coef"] = {STEP_COEF_NAMES[i]: float(sched_coef[i]) for i in (0, 2, 9)}
    rep["seq_knee"] = float(coef[12])
    return coef, rep


# ---------------------------------------------------------------- simulation-consistent refit
REFINE_ITERATIONS = 3
SCHED_RUN_S = 600.0


def _simulate_sched_run(args: tuple) -> tuple | None:
    """Replay one shared scheduler-overhead run in the twin (fixed 250/231-token requests,
    rank 8, Poisson per adapter); returns (mean design row, twin mean ITL) or None."""
    from . import kernel as K
    from .lengths import FixedLengths
    from .metrics import compute_metrics
    from .server import ServerConfig, run_kernel
    from .workload import adapters_from_cycles, generate_requests

    profile, amax, n, rate, seed = args
    adapters = adapters_from_cycles(int(n), [8], [float(rate)])
    lengths = FixedLengths(int(SCHED_IN), int(SCHED_OUT))
    reqs = generate_requests(adapters, SCHED_RUN_S, lengths, seed=seed)
    run = run_kernel(profile, adapters, reqs, ServerConfig(max_loras=int(amax), max_lora_rank=8),
                     SCHED_RUN_S)
    if run is None or run.stats[K.ST_STEPS] == 0:
        return None
    m = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                        run.finish_t, run.stats, run.itl_hist, SCHED_RUN_S, 1.0, run.kv_blocks,
                        profile.block_size)
    return run.mean_design_row(), m.mean_itl_ms


def refine_with_simulated_runs(profile: GpuProfile, win_rows: pd.DataFrame, data_dir: Path,
                               iterations: int = REFINE_ITERATIONS, workers: int | None = None,
                               ) -> tuple[np.ndarray, dict]:
    """Refit the step-time coefficients so that the *twin's own* per-step features of the shared
    scheduler-overhead runs (not run-average approximations) explain their measured mean step
    times, alongside the profiling windows. The step time is linear in the design row, so a
    run's mean step time is the coefficients times its mean design row; the twin's design rows
    depend on the coefficients, hence a fixed-point iteration (simulate, refit, repeat)."""
    import os
    from .fleet import worker_pool
    from dataclasses import replace

    from scipy.optimize import lsq_linear

    s = pd.read_csv(_cal(data_dir) / "scheduler_overhead_runs.csv")
    s = s[s.avg_batch_size >= MIN_BUSY_BATCH]
    s = s[~((s.source == "fixed_aggregated_rate") & (s.gpu_loras <= 16))].reset_index(drop=True)
    y_s = ((s.duration - s.max_lora_loading_time) / s.steps * 1000.0).to_numpy()
    coef = np.array(profile.step_coef, dtype=float)
    Fw = design_matrix(win_rows[list(FEATURE_NAMES)].to_numpy(float), coef[10], coef[12])
    yw = win_rows.y.to_numpy(float)
    ww = win_rows.weight.to_numpy(float) / yw
    fit_idx = [j for j, t in enumerate(LINEAR_IDX) if t in STEP_FIT_TERMS]
    fixed_idx = [j for j, t in enumerate(LINEAR_IDX) if t not in STEP_FIT_TERMS]
    history = []
    workers = workers or os.cpu_count() or 1
    for it in range(iterations):
        prof = replace(profile, step_coef=tuple(float(c) for c in coef))
        jobs = [(prof, a, n, r, 1000 + i) for i, (a, n, r) in
                enumerate(zip(s.gpu_loras, s.cpu_loras, s.adapter_rates))]
        with worker_pool(workers) as pool:
            sims = list(pool.map(_simulate_sched_run, jobs, chunksize=8))
        keep = np.array([x is not None for x in sims])
        Fs = np.vstack([x[0] for x in sims if x is not None])
        twin_itl = np.array([x[1] for x in sims if x is not None])
        ys = y_s[keep]
        ws = np.full(len(ys), SCHED_SOURCE_WEIGHT) / ys
        F = np.vstack([Fw, Fs])
        y = np.r_[yw, ys]
        w = np.r_[ww, ws]
        lin = np.array([coef[t] for t in LINEAR_IDX])
        target = y - F[:, fixed_idx] @ lin[fixed_idx]
        res = lsq_linear(F[:, fit_idx] * w[:, None], target * w, bounds=(0, np.inf),
                         method="bvls")
        for j, v in zip(fit_idx, res.x):
            coef[LINEAR_IDX[j]] = max(float(v), 0.0)
        lin = np.array([coef[t] for t in LINEAR_IDX])
        real_itl = s.mean_itl_ms.to_numpy()[keep]
        history.append({
            "iteration": it + 1, "sched_runs": int(keep.sum()),
            "sched_step_time": fit_metrics(ys, Fs @ lin),
            "windows_step_time": fit_metrics(yw, Fw @ lin),
            "sched_twin_itl_before_refit": fit_metrics(real_itl, twin_itl),
        })
    return coef, {"iterations": history}


def run_step_features(runs: pd.DataFrame) -> np.ndarray:
    """Step-time feature rows (columns ``FEATURE_NAMES``) of end-to-end runs from their gauges:
    n_seqs = mean_running, n_distinct = min(max_loras, served, running), prefill tokens per step
    = n_seqs * mean_in / mean_out (each step replaces the 1/mean_out of the batch that
    finishes), ctx = n_seqs * (mean_in + mean_out / 2), waiting scanned = mean_waiting when the
    batch is full of adapters (as in :func:`step_rows`), max_rank = the server's max_lora_rank."""
    S = runs.mean_running.to_numpy(float)
    A = runs.max_loras.to_numpy(float)
    K = np.minimum(np.minimum(A, runs.served_adapters.to_numpy(float)), S)
    mi = runs.pool_mean_input_len.to_numpy(float)
    mo = runs.pool_mean_output_len.to_numpy(float)
    P = S * mi / mo
    W = runs.mean_waiting.to_numpy(float) * (K >= FULL_BATCH_FRAC * A)
    return np.column_stack([S, P, S, S * (mi + mo / 2.0), K, A,
                            runs.max_lora_rank.to_numpy(float), W, lora_tiles(K, S, P)])


def fit_rank_scale(coef, runs: pd.DataFrame) -> tuple[float, dict]:
    """Stage 3: the rank multiplier c10 of the LoRA terms from end-to-end runs.

    Each run's mean ITL (a decode step, as seen by a running request) is read against the step
    model at the run's mean batch (:func:`run_step_features`) with c10 = 0: T0 and its LoRA part
    L. The fit is ``mean_itl = alpha * (T0 + c10 * (max_rank - 8) / 8 * L)`` by least squares on
    relative error: ``alpha`` absorbs what the gauge approximation and the profiling fit miss
    alike for every rank, so c10 is set by how much more the rank-32 servers take than the
    rank-16 ones, relative to their LoRA cost. Returns (c10 clipped at 0, report)."""
    missing = [c for c in RANK_RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise ValueError(f"rank runs lack columns {missing}")
    ok = runs[(runs.status == "ok") & (runs.mean_running >= 1) & runs.mean_itl_ms.notna()
              & (runs.max_loras > 0)]
    ranks = sorted(int(r) for r in ok.max_lora_rank.unique())
    if len(ok) < 10 or len(ranks) < 2:
        raise ValueError(f"rank runs: need >= 10 ok runs over >= 2 max_lora_rank values, got "
                         f"{len(ok)} runs with ranks {ranks}")
    coef = np.asarray(coef, dtype=float)
    F = design_matrix(run_step_features(ok), 0.0, coef[12])
    lin = coef[list(LINEAR_IDX)]
    t0 = F @ lin
    lora = F[:, 4:9] @ lin[4:9]
    r = ok.max_lora_rank.to_numpy(float)
    y = ok.mean_itl_ms.to_numpy(float)
    x = np.maximum(r - 8.0, 0.0) / 8.0 * lora
    sol, *_ = np.linalg.lstsq(np.column_stack([t0, x]) / y[:, None], np.ones(len(y)), rcond=None)
    alpha, beta = float(sol[0]), float(sol[1])
    c10 = max(beta / alpha, 0.0) if alpha > 0 else 0.0
    pred = alpha * (t0 + c10 * x)
    rep = {"runs": int(len(ok)), "alpha": alpha, "rank_scale": c10,
           "per_max_lora_rank": {}}
    for rk in ranks:
        g = r == rk
        rep["per_max_lora_rank"][str(rk)] = {
            "n": int(g.sum()),
            "mean_itl_over_model_c10_0": float(np.mean(y[g] / (alpha * t0[g]))),
            "itl_fit": fit_metrics(y[g], pred[g])}
    return c10, rep


def rank_scale_from_data(data_dir: Path) -> tuple[float, dict]:
    """c10 for any profile calibrated from ``data_dir``: :func:`fit_rank_scale` on
    ``<data_dir>/RANK_RUNS`` read against the Llama profiling fit (stages 1-2); (0, note) when
    the file is absent."""
    path = Path(data_dir) / RANK_RUNS
    if not path.is_file():
        return 0.0, {"note": f"rank term not fitted: {path} not found (rank_scale = 0)"}
    rows = pd.concat([step_rows(data_dir, RANK_RUNS_MODEL), scheduler_rows(data_dir)],
                     ignore_index=True)
    llama_coef, _ = fit_step_coef(rows)
    runs = pd.read_csv(path)
    c10, rep = fit_rank_scale(llama_coef, runs[runs.model == RANK_RUNS_MODEL])
    rep["source"] = str(RANK_RUNS)
    return c10, rep


def sanity_points(coef) -> list[dict]:
    """Model predictions at the brief's sanity targets (decode, ctx from output length 100)."""
    from .step_time import step_time_ms_py as f
    def args(S, K, A, R):
        return (S, 0, S, S * 55, K, A, R, 0, float(lora_tiles(K, S, 0)))
    pts = [
        ("no LoRA decode 50 seqs, out 100", 13.4, args(50, 0, 0, 0)),
        ("no LoRA decode 760 seqs, out 100", 40.0, args(760, 0, 0, 0)),
        ("Amax 300 r8 decode 200 seqs, 1 adapter", 36.0, args(200, 1, 300, 8)),
        ("Amax 300 r8 decode 200 seqs, 128 adapters", 70.0, args(200, 105, 300, 8)),
    ]
    return [{"case": c, "target_ms": t, "pred_ms": round(f(coef, *a), 2)} for c, t, a in pts]


def validation_check(coef, validation_csv: Path, mean_in: float = 223.0,
                     mean_out: float = 196.0) -> pd.DataFrame:
    """Look-only comparison with end-to-end runs (never used for fitting).

    n_seqs = mean_running, n_distinct = min(max_loras, served, running), n_waiting =
    mean_waiting, decode tokens = n_seqs, prefill tokens per step = n_seqs * mean_in / mean_out
    (each step replaces the finishing 1/mean_out of the batch), ctx = n_seqs * (mean_in +
    mean_out / 2). Compared with mean_itl_ms.
    """
    from .step_time import step_time_ms_py as f
    v = pd.read_csv(validation_csv)
    v = v[v.status == "ok"].copy()
    preds = []
    for r in v.itertuples():
        S = float(r.mean_running)
        K = min(float(r.max_loras), float(r.served_adapters), S)
        P = S * mean_in / mean_out
        preds.append(f(coef, S, P, S, S * (mean_in + mean_out / 2), K,
                       float(r.max_loras), float(r.max_lora_rank), float(r.mean_waiting),
                       float(lora_tiles(K, S, P))))
    v["pred_step_ms"] = preds
    return v[["max_loras", "served_adapters", "max_lora_rank", "rate_set", "mean_running",
              "mean_waiting", "preemptions_total", "mean_itl_ms", "pred_step_ms"]]


def _slot_reference(model: str):
    """The shipped profile whose stage-4 fit a model without max-search runs takes over
    (``twin.slot_fit.transfer_slot_terms``): the ``RANK_RUNS_MODEL`` profile, fitted first;
    None for that model itself or when it is not shipped."""
    if model == RANK_RUNS_MODEL:
        return None
    from .profile import load_profile
    try:
        ref = load_profile(RANK_RUNS_MODEL)
    except (FileNotFoundError, KeyError, ValueError):
        return None
    return ref if "before" in (ref.fit_report or {}).get("slot_terms", {}) else None


def calibrate(data_dir: Path, model: str, name: str | None = None, refine: bool = False,
              slots: bool = True, workers: int | None = None) -> tuple[GpuProfile, dict]:
    """Fit a profile for ``model`` from ``<data_dir>/calibration``; returns (profile, report).

    ``slots`` (default on) adds stage 4 where ``<data_dir>/RANK_RUNS`` holds max-search runs of
    ``model``: the slot-dependent LoRA terms refitted on those runs replayed in the twin
    (:mod:`twin.slot_fit`; about 1.5 minutes on two cores, ``workers`` processes).

    ``refine`` adds the simulation-consistent refit (:func:`refine_with_simulated_runs`, about a
    minute on two cores). It is off by default: on the shared Llama validation runs it made the
    twin worse (throughput SMAPE 3.9 % -> 5.2 %, ITL 5.4 % -> 12.9 %), because the shared
    scheduler runs (unknown base model, fixed-length requests) pull the LoRA terms away from
    what the model-specific profiling windows say."""
    data_dir = Path(data_dir)
    win_rows = step_rows(data_dir, model)
    rows = pd.concat([win_rows, scheduler_rows(data_dir)], ignore_index=True)
    win_ranks = sorted({int(r) for r in win_rows.max_rank[win_rows.max_loras > 0]})
    if len(win_ranks) >= 2:   # LoRA windows at several max ranks (twin.harness profile)
        coef, rep = fit_step_coef(rows, fit_rank=True)
        rep["rank_term"] = {
            "rank_scale": float(coef[10]), "window_ranks": win_ranks,
            "source_text": f"c10 fitted with the other step terms on the LoRA windows at "
                           f"max_lora_rank {'/'.join(map(str, win_ranks))}"}
    else:
        coef, rep = fit_step_coef(rows)
        coef[10], rep["rank_term"] = rank_scale_from_data(data_dir)
    kv, mml, ranks = kv_table(data_dir, model)
    loads = load_table(data_dir, model)
    ranks = tuple(sorted(set(ranks) | {r for k in loads for r in k} | {r for _, r in kv}))
    cal = _cal(data_dir)
    rep["sanity"] = sanity_points(coef)
    rep["step_model"] = describe_step_model(coef)
    prof = GpuProfile(
        name=name or model, gpu=GPU_NAME, model=model, block_size=16,
        max_num_batched_tokens=2048, max_num_seqs=2048, max_model_len=mml,
        kv_capacity=kv, supported_ranks=ranks, step_coef=tuple(float(c) for c in coef),
        load_ms=loads, backbone_kv_tokens=backbone_kv(data_dir, model),
        fit_report={},
        source={
            "data_dir": str(data_dir.resolve()),
            "files": sorted(p.name for p in cal.glob("*.csv")),
            "n_rows_by_source": {k: int(v) for k, v in rows.source.value_counts().items()},
            "shared_sources": ["scheduler_overhead_runs.csv (base model not stated; shared by "
                               "all profiles, nuisance offset per source file)"],
            "load_ms_statistic": "mean of measured cpu_to_gpu loads",
            "backbone_kv_tokens": "min kv_cache_tokens of the no-LoRA runs at the largest "
                                  "max_num_seqs",
            "rank_scale": rep["rank_term"].get("source_text") or (
                (f"c10 fitted on {RANK_RUNS} (max_lora_rank 16/32 runs, read against "
                 f"the {RANK_RUNS_MODEL} profiling fit; a relative LoRA-cost "
                 "multiplier shared by every profile)")
                if "rank_scale" in rep["rank_term"] else rep["rank_term"]["note"]),
            "calibrated_on": _dt.date.today().isoformat(),
            "code": "twin.calibrate",
        },
    )
    if refine:
        coef, rep["refinement"] = refine_with_simulated_runs(prof, win_rows, data_dir)
    if slots:
        prof = replace(prof, step_coef=tuple(float(c) for c in coef))
        coef, rep["slot_terms"] = slot_terms_from_data(prof, win_rows, data_dir, RANK_RUNS,
                                                       workers, _slot_reference(model))
        prof = replace(prof, source={**prof.source, "slot_terms": rep["slot_terms"].get(
            "note") or (f"c5-c8 refitted on the {model} runs of {RANK_RUNS} (throughput of the "
                        "saturated ones, mean ITL of those that kept up) with the LoRA windows "
                        f"(twin.slot_fit; window / ITL weights {rep['slot_terms']['window_weight']}"
                        f" / {rep['slot_terms']['itl_weight']} by cross-rank validation, "
                        f"{len(rep['slot_terms']['passes'])} passes)")})
    if refine or slots:
        rep["step_time"] = _window_fit(win_rows, coef, rep["step_time"])
        rep["sanity"] = sanity_points(coef)
        rep["step_model"] = describe_step_model(coef)
    keys = ("step_time", "scheduler_time", "nuisance_offsets_ms", "scheduler_coef", "sanity",
            "rank_term", "refinement", "slot_terms")
    prof = replace(prof, step_coef=tuple(float(c) for c in coef),
                   fit_report={k: rep[k] for k in keys if k in rep})
    return prof, rep


def _window_fit(win_rows: pd.DataFrame, coef, before: dict) -> dict:
    """Per-source fit of the profiling windows with the final coefficients (``before``: the
    stage-2 report, whose scheduler-run sources are kept as they were)."""
    F = design_matrix(win_rows[list(FEATURE_NAMES)].to_numpy(float), coef[10], coef[12])
    pred = F @ np.asarray(coef)[list(LINEAR_IDX)]
    y = win_rows.y.to_numpy(float)
    out = dict(before)
    for src in win_rows.source.unique():
        g = (win_rows.source == src).to_numpy()
        out[src] = fit_metrics(y[g], pred[g])
    out["ALL model-specific"] = fit_metrics(y, pred)
    return out


def format_report(rep: dict) -> str:
    """Fit-quality table as text."""
    lines = [rep.get("step_model", ""), "", "step time (ms) per source:",
             f"  {'source':40s} {'n':>6s} {'R2':>7s} {'MAPE%':>7s} {'SMAPE%':>7s} {'bias%':>7s}"]
    for part in ("step_time", "scheduler_time"):
        if part == "scheduler_time":
            lines.append("scheduler time (ms) per source:")
        for s, m in rep[part].items():
            lines.append(f"  {s:40s} {m['n']:6d} {m['r2']:7.3f} {m['mape_pct']:7.2f} "
                         f"{m['smape_pct']:7.2f} {m['bias_pct']:7.2f}")
    lines.append("nuisance offsets (ms): " + json.dumps(
        {k: round(v, 2) for k, v in rep["nuisance_offsets_ms"].items()}))
    lines.append("sanity: ")
    for p in rep["sanity"]:
        lines.append(f"  {p['case']:45s} target {p['target_ms']:6.1f}  pred {p['pred_ms']:6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``--data DIR --model M --out FILE [--name N] [--validation CSV]``."""
    ap = argparse.ArgumentParser(prog="twin calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--name", default=None)
    ap.add_argument("--refine", action="store_true",
                    help="add the simulation-consistent refit (see calibrate())")
    ap.add_argument("--no-slot-fit", action="store_true",
                    help="skip stage 4 (slot-dependent LoRA terms from max-search runs)")
    ap.add_argument("--workers", type=int, default=None,
                    help="processes for the stage-4 replays (default: all cores)")
    ap.add_argument("--validation", type=Path, default=None,
                    help="optional validation CSV to print a look-only ITL comparison")
    a = ap.parse_args(argv)
    if a.workers is not None and a.workers < 1:
        ap.error(f"--workers must be >= 1, got {a.workers}")
    prof, rep = calibrate(a.data, a.model, a.name, refine=a.refine, slots=not a.no_slot_fit,
                          workers=a.workers)
    print(format_report(rep))
    if a.validation is not None:
        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(validation_check(prof.step_coef_array(), a.validation).round(2).to_string())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    prof.to_json(a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
