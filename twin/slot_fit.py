"""Calibration stage 4: the LoRA step-time terms that grow with slots, rank, adapters and LoRA
tiles, refitted on simulated max-search runs.

Every profiling window with LoRA runs at one slot count (300) and rank 8, so stage 2 pins the
terms that depend on the server's slots and the batch's adapters — c5 (per slot, growing with
the padded rank above 8), c6 (tokens x slots), c7 (per adapter in the batch) and c8 (per LoRA
tile) — at that one point only. Replayed end to end, the twin was then a few percent slow on
saturated servers with few slots and fast on those with many, and 10-22 % fast (mean ITL) on
every moderately loaded server, more so with more slots and at rank 32. This stage refits those
four terms on the model's max-search runs (``validation_llama/maxsearch_llama.csv``; never the
validation runs, which ``experiments.twin_fidelity`` replays) together with the LoRA profiling
windows:

1. every run is replayed in the twin as the fidelity check replays a run (ShareGPT lengths of
   the run's prompt pool, the benchmark client's waiting limit, seed 0). A *saturated* run
   (real throughput < ``SATURATED_RATIO`` x offered) has a throughput inversely proportional
   to its step time, so the mean step time it needed is ``twin step x twin throughput / real
   throughput``; a run that *keeps up* carries no step time in its throughput, but its mean
   inter-token latency is its decode steps' mean length, so it needed ``twin step x real mean
   ITL / twin mean ITL``. A run's mean step time is linear in its mean design row
   (``step_time.accumulate_design``);
2. non-negative least squares on relative error over the saturated runs (total weight 1), the
   runs that keep up (total weight ``u``) and the LoRA windows (total weight ``w``), every
   other coefficient fixed — c4 (LoRA cost per step, whatever the slots) keeps its profiling
   value;
3. ``(w, u)`` is chosen from ``WINDOW_WEIGHTS`` x ``ITL_WEIGHTS``: the pair of least mean of
   two errors, the runs' held-out error under cross-rank validation (fit on the
   ``max_lora_rank`` 16 runs and predict the rank-32 runs, and the reverse) and the windows'
   error of the fit on every run. Both are real measurements of the server, and the runs alone
   would trade the windows away (a fit on the runs' error alone takes the smallest window
   weight and misses the 105-adapter decode windows by 11 %); the chosen pair's fit on every
   run is kept;
4. a slower twin holds more requests per step, so the runs are replayed again with the new
   terms and steps 1-3 repeated (``PASSES`` passes in all).

The report lists the held-out error per weight pair, the windows' fit and the runs' fit before
and after each pass.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from .profile import GpuProfile
from .step_time import FEATURE_NAMES, LINEAR_IDX, design_matrix

SLOT_TERMS = (5, 6, 7, 8)      # per slot and rank, tokens x slots, per adapter, per LoRA tile
WINDOW_WEIGHTS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)
ITL_WEIGHTS = (0.0, 0.25, 0.5, 1.0)       # total weight of the runs that keep up (their ITL)
PASSES = 2
SATURATED_RATIO = 0.95                    # real throughput / offered below this: saturated
RUN_COLUMNS = ("status", "model", "max_loras", "max_lora_rank", "adapter_rank_counts",
               "rate_counts", "total_time_s", "pool_mean_input_len", "pool_mean_output_len",
               "total_throughput_tps", "throughput_to_offered_ratio")


def _replayable_runs(runs: pd.DataFrame, model: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """The ok runs of ``model`` (with LoRA) whose rank and rate counts describe the same
    adapters; ``columns`` must all be present."""
    missing = [c for c in columns if c not in runs.columns]
    if missing:
        raise ValueError(f"max-search runs lack columns {missing}")
    r = runs[(runs.status == "ok") & (runs.model == model) & (runs.max_loras > 0)]
    same = [counts_agree(a, b) for a, b in zip(r.adapter_rank_counts, r.rate_counts)]
    return r[np.array(same, dtype=bool)].reset_index(drop=True)


def saturated_runs(runs: pd.DataFrame, model: str) -> pd.DataFrame:
    """The ok, saturated runs of ``model`` whose rank and rate counts describe the same adapters
    (the others cannot be replayed)."""
    r = _replayable_runs(runs, model, RUN_COLUMNS)
    return r[r.throughput_to_offered_ratio < SATURATED_RATIO].reset_index(drop=True)


def unsaturated_runs(runs: pd.DataFrame, model: str) -> pd.DataFrame:
    """The ok, replayable runs of ``model`` that kept up with their load (real throughput >=
    ``SATURATED_RATIO`` x offered) and report a mean ITL."""
    r = _replayable_runs(runs, model, RUN_COLUMNS + ("mean_itl_ms",))
    return r[(r.throughput_to_offered_ratio >= SATURATED_RATIO) & r.mean_itl_ms.notna()
             & (r.mean_itl_ms > 0)].reset_index(drop=True)


def counts_agree(rank_counts, rate_counts) -> bool:
    """A shared run's ``adapter_rank_counts`` and ``rate_counts`` describe the same (non-zero)
    number of adapters, so the run can be replayed."""
    from .workload import parse_counts

    def n(text, kind) -> int:
        try:
            return sum(parse_counts(str(text), kind).values())
        except ValueError:
            return -1
    return n(rank_counts, int) == n(rate_counts, float) > 0


def shared_run_setup(cfg: dict, seed: int = 0, io_correlation: float | None = None):
    """(adapters, length model, server config) of one shared end-to-end run from its
    configuration columns: ShareGPT lengths of its prompt pool, the benchmark client's waiting
    limit. ``io_correlation`` overrides the prompt/answer length correlation."""
    from .sharegpt import sharegpt_lengths
    from .server import SHARED_BENCHMARK_CLIENT_MAX_WAITING, ServerConfig
    from .workload import adapters_from_counts, parse_counts

    adapters = adapters_from_counts(parse_counts(cfg["adapter_rank_counts"], int),
                                    parse_counts(cfg["rate_counts"], float), seed=seed)
    lengths = sharegpt_lengths(mean_input=float(cfg["pool_mean_input_len"]),
                               mean_output=float(cfg["pool_mean_output_len"]),
                               correlation=io_correlation)
    sc = ServerConfig(max_loras=int(cfg["max_loras"]),
                      max_lora_rank=_opt_int(cfg["max_lora_rank"]),
                      max_num_seqs=_opt_int(cfg.get("max_num_seqs")),
                      max_num_batched_tokens=_opt_int(cfg.get("max_num_batched_tokens")),
                      client_max_waiting=SHARED_BENCHMARK_CLIENT_MAX_WAITING)
    return adapters, lengths, sc


def _opt_int(v) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def replay_design(args: tuple) -> tuple[np.ndarray, float, float, float]:
    """(mean design row, mean step time in ms without adapter loads, throughput tok/s, mean
    ITL ms) of one run replayed in the twin with ``profile``."""
    from . import kernel as K
    from .metrics import compute_metrics
    from .server import run_kernel
    from .workload import generate_requests

    profile, cfg = args
    adapters, lengths, sc = shared_run_setup(cfg)
    dur = float(cfg["total_time_s"])
    reqs = generate_requests(adapters, dur, lengths, seed=0)
    run = run_kernel(profile, adapters, reqs, sc, dur)
    if run is None:
        raise ValueError(f"max-search run {cfg.get('run_id', '')}: the configuration does not "
                         "start in the profile")
    m = compute_metrics(reqs.arrival_s, reqs.input_len, reqs.output_len, run.first_t,
                        run.finish_t, run.stats, run.itl_hist, dur, 1.0, run.kv_blocks,
                        profile.block_size)
    steps = max(float(run.stats[K.ST_STEPS]), 1.0)
    step_ms = (run.stats[K.ST_BUSY_S] - run.stats[K.ST_LOAD_S]) / steps * 1000.0
    return run.mean_design_row(), float(step_ms), float(m.throughput_tps), float(m.mean_itl_ms)


def _nnls(coef: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray, float]]) -> np.ndarray:
    """Coefficients with ``SLOT_TERMS`` refitted: NNLS on relative error over ``parts`` =
    (design rows, target step times, total weight); the other terms stay."""
    from scipy.optimize import lsq_linear

    lin = coef[list(LINEAR_IDX)]
    fit_j = [LINEAR_IDX.index(t) for t in SLOT_TERMS]
    fix_j = [j for j in range(len(LINEAR_IDX)) if j not in fit_j]
    F = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    w = np.concatenate([np.full(len(p[1]), p[2] / max(len(p[1]), 1)) / p[1] for p in parts])
    res = lsq_linear(F[:, fit_j] * w[:, None], (y - F[:, fix_j] @ lin[fix_j]) * w,
                     bounds=(0.0, np.inf), method="bvls")
    out = coef.copy()
    for t, v in zip(SLOT_TERMS, res.x):
        out[t] = max(float(v), 0.0)
    return out


def _mape(y: np.ndarray, p: np.ndarray) -> float:
    if len(y) == 0:
        return float("nan")
    return float(100.0 * np.mean(np.abs(p / y - 1.0)))


def _replay_all(profile: GpuProfile, cfgs: list[dict], workers: int | None,
                desc: str) -> list[tuple]:
    from tqdm import tqdm

    from .fleet import worker_pool
    with worker_pool(workers or os.cpu_count() or 1) as pool:
        return list(tqdm(pool.map(replay_design, [(profile, c) for c in cfgs], chunksize=4),
                         total=len(cfgs), desc=desc, leave=False))


def _needed_steps(sims: list[tuple], real_tps: np.ndarray, real_itl: np.ndarray,
                  saturated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(design rows, needed mean step times) of replayed runs (module docstring, step 1)."""
    F = np.vstack([s[0] for s in sims])
    step = np.array([s[1] for s in sims])
    tps = np.array([s[2] for s in sims])
    itl = np.array([s[3] for s in sims])
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.where(saturated, step * tps / real_tps, step * real_itl / itl)
    return F, need


def fit_slot_terms(profile: GpuProfile, win_rows: pd.DataFrame, runs: pd.DataFrame,
                   workers: int | None = None, passes: int = PASSES) -> tuple[np.ndarray, dict]:
    """Stage 4 (module docstring): ``profile``'s step coefficients with ``SLOT_TERMS`` refitted
    on the saturated runs of its model, those that kept up (where ``runs`` has ``mean_itl_ms``)
    and the LoRA rows of ``win_rows``; returns (coefficients, report)."""
    sat = saturated_runs(runs, profile.model)
    ranks = sorted(int(r) for r in sat.max_lora_rank.unique())
    if len(sat) < 20 or len(ranks) < 2:
        raise ValueError(f"slot terms: need >= 20 saturated max-search runs of {profile.model} "
                         f"over >= 2 max_lora_rank values, got {len(sat)} with ranks {ranks}")
    uns = unsaturated_runs(runs, profile.model) if "mean_itl_ms" in runs.columns \
        else sat.iloc[:0]
    both = pd.concat([sat, uns], ignore_index=True)
    saturated = np.arange(len(both)) < len(sat)
    real_tps = both.total_throughput_tps.to_numpy(float)
    real_itl = (both.mean_itl_ms.to_numpy(float) if "mean_itl_ms" in both.columns
                else np.full(len(both), np.nan))
    R = both.max_lora_rank.to_numpy(int)
    cfgs = both.to_dict("records")
    start = np.array(profile.step_coef, dtype=float)
    lw = win_rows[win_rows.max_loras > 0]
    Fw = design_matrix(lw[list(FEATURE_NAMES)].to_numpy(float), start[10], start[12])
    yw = lw.y.to_numpy(float)
    u_grid = ITL_WEIGHTS if len(uns) else (0.0,)

    def lin(c: np.ndarray) -> np.ndarray:
        return c[list(LINEAR_IDX)]

    def parts(F, need, keep, w, u):
        out = [(F[keep & saturated], need[keep & saturated], 1.0), (Fw, yw, w)]
        if u > 0:
            out.append((F[keep & ~saturated], need[keep & ~saturated], u))
        return out

    coef = start.copy()
    rep: dict = {"runs": int(len(sat)), "runs_keeping_up": int(len(uns)),
                 "max_lora_ranks": ranks, "terms": list(SLOT_TERMS), "passes": []}
    every = np.ones(len(both), bool)
    for k in range(max(1, int(passes))):
        sims = _replay_all(replace(profile, step_coef=tuple(coef)), cfgs, workers,
                           f"stage 4 pass {k + 1}: replaying max-search runs")
        F, need = _needed_steps(sims, real_tps, real_itl, saturated)
        held_out, windows, full = {}, {}, {}
        for w in WINDOW_WEIGHTS:
            for u in u_grid:
                errs = []
                for r in ranks:
                    c = _nnls(coef, parts(F, need, R != r, w, u))
                    out = R == r
                    errs.append(np.abs(need[out] / (F[out] @ lin(c)) - 1.0))
                held_out[(w, u)] = float(100.0 * np.mean(np.concatenate(errs)))
                full[(w, u)] = _nnls(coef, parts(F, need, every, w, u))
                windows[(w, u)] = _mape(yw, Fw @ lin(full[(w, u)]))
        score = {p: 0.5 * (held_out[p] + windows[p]) for p in held_out}
        best = min(score, key=lambda p: (score[p], p))
        new = full[best]
        rep["passes"].append({
            "held_out_mape_pct_by_weights": {f"{w}/{u}": round(v, 3)
                                             for (w, u), v in held_out.items()},
            "windows_mape_pct_by_weights": {f"{w}/{u}": round(v, 3)
                                            for (w, u), v in windows.items()},
            "window_weight": best[0], "itl_weight": best[1],
            "saturated_step_mape_pct": {"before": _mape(need[saturated], F[saturated] @ lin(coef)),
                                        "after": _mape(need[saturated], F[saturated] @ lin(new))},
            "keeping_up_step_mape_pct": {
                "before": _mape(need[~saturated], F[~saturated] @ lin(coef)),
                "after": _mape(need[~saturated], F[~saturated] @ lin(new))},
            "runs_throughput_mape_pct_before": _mape(real_tps[saturated],
                                                     np.array([s[2] for s in sims])[saturated]),
            "runs_itl_mape_pct_before": _mape(real_itl[~saturated],
                                              np.array([s[3] for s in sims])[~saturated]),
            "lora_windows_step_mape_pct": {"before": _mape(yw, Fw @ lin(coef)),
                                           "after": _mape(yw, Fw @ lin(new))},
            "after": {str(t): float(new[t]) for t in SLOT_TERMS}})
        coef = new
    last = rep["passes"][-1]
    rep.update({"window_weight": last["window_weight"], "itl_weight": last["itl_weight"],
                "before": {str(t): float(start[t]) for t in SLOT_TERMS},
                "after": {str(t): float(coef[t]) for t in SLOT_TERMS}})
    return coef, rep


# the windows' reference LoRA decode step at which two models' LoRA costs are compared (rank 8,
# the 300 slots of every profiling window): requests, tokens, slots, distinct adapters, tiles
REFERENCE_WINDOW_STEP = {"n_seqs": 128, "tok": 128, "max_loras": 300, "n_distinct": 32,
                         "n_tiles": 32}


def window_lora_cost_ms(coef) -> float:
    """The LoRA part of the step time (ms) at ``REFERENCE_WINDOW_STEP`` (rank 8: m = 1 and
    the rank-growing slot term vanishes)."""
    from .step_time import step_time_ms_py
    c, f = np.asarray(coef, dtype=float), REFERENCE_WINDOW_STEP
    with_lora = step_time_ms_py(c, f["n_seqs"], 0, f["tok"], 0, f["n_distinct"], f["max_loras"],
                                8, 0, f["n_tiles"])
    return float(with_lora - step_time_ms_py(c, f["n_seqs"], 0, f["tok"], 0, 0, 0, 8, 0, 0))


def transfer_slot_terms(coef, reference: GpuProfile) -> tuple[np.ndarray, dict]:
    """Stage 4 for a model without max-search runs: ``reference``'s stage-4 correction (its
    ``SLOT_TERMS`` after minus before, from its fit report) added to ``coef``, scaled by the
    ratio of the two models' stage-2 LoRA cost at the windows' reference step (the same
    Triton kernels over a model of other dimensions: the windows measure how much more or less
    LoRA work each step of this model does). Terms are kept >= 0."""
    st = (reference.fit_report or {}).get("slot_terms") or {}
    if "before" not in st or "after" not in st:
        raise ValueError(f"slot terms: profile {reference.name} has no stage-4 fit to transfer")
    ref_before = np.array(reference.step_coef, dtype=float)
    for t in SLOT_TERMS:
        ref_before[t] = float(st["before"][str(t)])
    scale = window_lora_cost_ms(coef) / window_lora_cost_ms(ref_before)
    out = np.array(coef, dtype=float)
    for t in SLOT_TERMS:
        delta = float(st["after"][str(t)]) - float(st["before"][str(t)])
        out[t] = max(out[t] + scale * delta, 0.0)
    return out, {"transferred_from": reference.name, "scale": scale,
                 "before": {str(t): float(coef[t]) for t in SLOT_TERMS},
                 "after": {str(t): float(out[t]) for t in SLOT_TERMS}}


def slot_terms_from_data(profile: GpuProfile, win_rows: pd.DataFrame, data_dir: Path,
                         runs_file: Path, workers: int | None = None,
                         reference: GpuProfile | None = None) -> tuple[np.ndarray, dict]:
    """Stage 4 where ``data_dir / runs_file`` holds max-search runs of ``profile.model``;
    otherwise ``reference``'s fitted correction transferred (:func:`transfer_slot_terms`) when
    it is given, or the coefficients unchanged; the report says which."""
    coef = np.array(profile.step_coef, dtype=float)
    path = Path(data_dir) / runs_file
    if not path.is_file():
        return coef, {"note": f"slot terms not refitted: {runs_file} not found in the data"}
    runs = pd.read_csv(path)
    if "model" not in runs.columns or not (runs.model == profile.model).any():
        if reference is not None and reference.model != profile.model:
            new, rep = transfer_slot_terms(coef, reference)
            rep["note"] = (f"slot terms transferred: {runs_file} has no runs of "
                           f"{profile.model}; {reference.name}'s stage-4 correction scaled by "
                           f"{rep['scale']:.3f} (stage-2 LoRA cost ratio at the reference "
                           "window step)")
            return new, rep
        return coef, {"note": f"slot terms not refitted: {runs_file} has no runs of "
                              f"{profile.model}"}
    new, rep = fit_slot_terms(replace(profile, step_coef=tuple(coef)), win_rows, runs, workers)
    return new, rep


__all__ = ["SLOT_TERMS", "WINDOW_WEIGHTS", "ITL_WEIGHTS", "PASSES", "SATURATED_RATIO",
           "saturated_runs", "unsaturated_runs", "counts_agree",
           "shared_run_setup", "replay_design",
           "fit_slot_terms", "slot_terms_from_data", "transfer_slot_terms",
           "window_lora_cost_ms", "REFERENCE_WINDOW_STEP"]
