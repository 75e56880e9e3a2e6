"""Calibration stage 4: the LoRA step-time terms that grow with slots, adapters and LoRA tiles,
refitted on simulated max-search runs.

Every profiling window with LoRA runs at one slot count (300) and rank 8, so stage 2 pins the
terms that depend on the server's slots and the batch's adapters — c5 (per slot), c6 (tokens x
slots), c7 (per adapter in the batch) and c8 (per LoRA tile) — at that one point only. Replayed
end to end, the twin was then a few percent slow on servers with few slots and a few percent fast
on servers with many. This stage refits those four terms on the model's max-search runs
(``validation_llama/maxsearch_llama.csv``; never the validation runs, which
``experiments.twin_fidelity`` replays) together with the LoRA profiling windows:

1. every saturated run (real throughput < ``SATURATED_RATIO`` x offered) is replayed in the twin
   with the coefficients of stages 1-3, as the fidelity check replays a run (ShareGPT lengths of
   the run's prompt pool, the benchmark client's waiting limit, seed 0). A saturated server's
   throughput is inversely proportional to its step time, so the mean step time the run needed
   is ``twin step x twin throughput / real throughput``; a run's mean step time is linear in its
   mean design row (``step_time.accumulate_design``);
2. non-negative least squares on relative error over those runs (total weight 1) and the LoRA
   windows (total weight ``w``), every other coefficient fixed — c4 (LoRA cost per step,
   whatever the slots) keeps its profiling value;
3. ``w`` is chosen from ``WINDOW_WEIGHTS`` by cross-rank validation: fit on the
   ``max_lora_rank`` 16 runs and predict the rank-32 runs, and the reverse; the weight of least
   held-out error is used for the final fit on every run.

One pass (the design rows are those of the stage 1-3 twin); the report lists the held-out error
per weight, the windows' fit and the runs' fit before and after.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from .profile import GpuProfile
from .step_time import FEATURE_NAMES, LINEAR_IDX, design_matrix

SLOT_TERMS = (5, 6, 7, 8)                 # per slot, tokens x slots, per adapter, per LoRA tile
WINDOW_WEIGHTS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)
SATURATED_RATIO = 0.95                    # real throughput / offered below this: saturated
RUN_COLUMNS = ("status", "model", "max_loras", "max_lora_rank", "adapter_rank_counts",
               "rate_counts", "total_time_s", "pool_mean_input_len", "pool_mean_output_len",
               "total_throughput_tps", "throughput_to_offered_ratio")


def saturated_runs(runs: pd.DataFrame, model: str) -> pd.DataFrame:
    """The ok, saturated runs of ``model`` whose rank and rate counts describe the same adapters
    (the others cannot be replayed)."""
    missing = [c for c in RUN_COLUMNS if c not in runs.columns]
    if missing:
        raise ValueError(f"max-search runs lack columns {missing}")
    r = runs[(runs.status == "ok") & (runs.model == model) & (runs.max_loras > 0)
             & (runs.throughput_to_offered_ratio < SATURATED_RATIO)]
    same = [counts_agree(a, b) for a, b in zip(r.adapter_rank_counts, r.rate_counts)]
    return r[np.array(same, dtype=bool)].reset_index(drop=True)


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
    from .lengths import sharegpt_lengths
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


def replay_design(args: tuple) -> tuple[np.ndarray, float, float]:
    """(mean design row, mean step time in ms without adapter loads, throughput tok/s) of one
    run replayed in the twin with ``profile``."""
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
    return run.mean_design_row(), float(step_ms), float(m.throughput_tps)


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
    return float(100.0 * np.mean(np.abs(p / y - 1.0)))


def fit_slot_terms(profile: GpuProfile, win_rows: pd.DataFrame, runs: pd.DataFrame,
                   workers: int | None = None) -> tuple[np.ndarray, dict]:
    """Stage 4 (module docstring): ``profile``'s step coefficients with ``SLOT_TERMS`` refitted
    on the saturated ``runs`` of its model and the LoRA rows of ``win_rows``; returns
    (coefficients, report)."""
    from tqdm import tqdm

    sat = saturated_runs(runs, profile.model)
    ranks = sorted(int(r) for r in sat.max_lora_rank.unique())
    if len(sat) < 20 or len(ranks) < 2:
        raise ValueError(f"slot terms: need >= 20 saturated max-search runs of {profile.model} "
                         f"over >= 2 max_lora_rank values, got {len(sat)} with ranks {ranks}")
    coef = np.array(profile.step_coef, dtype=float)
    cfgs = sat.to_dict("records")
    from .fleet import worker_pool
    with worker_pool(workers or os.cpu_count() or 1) as pool:
        sims = list(tqdm(pool.map(replay_design, [(profile, c) for c in cfgs], chunksize=4),
                         total=len(cfgs), desc="stage 4: replaying max-search runs",
                         leave=False))
    F = np.vstack([s[0] for s in sims])
    step = np.array([s[1] for s in sims])
    twin_tps = np.array([s[2] for s in sims])
    need = step * twin_tps / sat.total_throughput_tps.to_numpy(float)
    lw = win_rows[win_rows.max_loras > 0]
    Fw = design_matrix(lw[list(FEATURE_NAMES)].to_numpy(float), coef[10], coef[12])
    yw = lw.y.to_numpy(float)
    R = sat.max_lora_rank.to_numpy(int)

    def lin(c: np.ndarray) -> np.ndarray:
        return c[list(LINEAR_IDX)]

    held_out = {}
    for w in WINDOW_WEIGHTS:
        errs = []
        for r in ranks:
            fit_on = R != r
            c = _nnls(coef, [(F[fit_on], need[fit_on], 1.0), (Fw, yw, w)])
            errs.append(np.abs(need[~fit_on] / (F[~fit_on] @ lin(c)) - 1.0))
        held_out[w] = float(100.0 * np.mean(np.concatenate(errs)))
    best_w = min(WINDOW_WEIGHTS, key=lambda w: (held_out[w], w))
    new = _nnls(coef, [(F, need, 1.0), (Fw, yw, best_w)])
    rep = {
        "runs": int(len(sat)), "max_lora_ranks": ranks, "terms": list(SLOT_TERMS),
        "held_out_mape_pct_by_window_weight": {str(w): round(v, 3) for w, v in held_out.items()},
        "window_weight": best_w,
        "runs_step_mape_pct": {"before": _mape(need, F @ lin(coef)),
                               "after": _mape(need, F @ lin(new))},
        "runs_throughput_mape_pct_before": _mape(sat.total_throughput_tps.to_numpy(float),
                                                 twin_tps),
        "lora_windows_step_mape_pct": {"before": _mape(yw, Fw @ lin(coef)),
                                       "after": _mape(yw, Fw @ lin(new))},
        "before": {str(t): float(coef[t]) for t in SLOT_TERMS},
        "after": {str(t): float(new[t]) for t in SLOT_TERMS},
    }
    return new, rep


def slot_terms_from_data(profile: GpuProfile, win_rows: pd.DataFrame, data_dir: Path,
                         runs_file: Path, workers: int | None = None) -> tuple[np.ndarray, dict]:
    """Stage 4 where ``data_dir / runs_file`` holds max-search runs of ``profile.model``;
    otherwise the coefficients unchanged and a note saying why."""
    coef = np.array(profile.step_coef, dtype=float)
    path = Path(data_dir) / runs_file
    if not path.is_file():
        return coef, {"note": f"slot terms not refitted: {runs_file} not found in the data"}
    runs = pd.read_csv(path)
    if "model" not in runs.columns or not (runs.model == profile.model).any():
        return coef, {"note": f"slot terms not refitted: {runs_file} has no runs of "
                              f"{profile.model}"}
    new, rep = fit_slot_terms(replace(profile, step_coef=tuple(coef)), win_rows, runs, workers)
    return new, rep


__all__ = ["SLOT_TERMS", "WINDOW_WEIGHTS", "SATURATED_RATIO", "saturated_runs", "counts_agree",
           "shared_run_setup", "replay_design",
           "fit_slot_terms", "slot_terms_from_data"]
