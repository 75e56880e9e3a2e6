"""Calibration stage 4 (``twin.slot_fit``): the slot-dependent LoRA terms refitted on saturated
max-search runs. Checked on runs whose "real" throughput comes from the twin itself with known
slot terms: the fit must move towards them and explain the runs better, changing nothing else."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from twin.calibrate import step_rows
from twin.profile import load_profile
from twin.slot_fit import SLOT_TERMS, WINDOW_WEIGHTS, fit_slot_terms, replay_design, saturated_runs

LLAMA = load_profile("llama-3.1-8b-instruct")


def _runs(profile) -> pd.DataFrame:
    rows = []
    for rank in (16, 32):
        for amax, n in ((8, 16), (8, 32), (16, 32), (16, 64), (32, 64), (32, 96), (64, 96),
                        (64, 128), (96, 128), (96, 192), (128, 192)):
            if profile.kv_tokens(amax, rank) is None:         # does not start
                continue
            k = n // 2
            rows.append({"status": "ok", "model": profile.model, "max_loras": amax,
                         "max_lora_rank": rank, "adapter_rank_counts": f"{rank}:{n}",
                         "rate_counts": f"0.8:{k} 1.6:{n - k}", "total_time_s": 240.0,
                         "pool_mean_input_len": 223.0, "pool_mean_output_len": 196.0,
                         "throughput_to_offered_ratio": 0.5})
    runs = pd.DataFrame(rows)
    runs["total_throughput_tps"] = [replay_design((profile, r))[2]
                                    for r in runs.to_dict("records")]
    return runs


def test_saturated_runs_keep_only_replayable_saturated_runs_of_the_model():
    base = {"status": "ok", "model": LLAMA.model, "max_loras": 8, "max_lora_rank": 16,
            "adapter_rank_counts": "16:4", "rate_counts": "1.6:4", "total_time_s": 60.0,
            "pool_mean_input_len": 223.0, "pool_mean_output_len": 196.0,
            "total_throughput_tps": 1.0, "throughput_to_offered_ratio": 0.5}
    df = pd.DataFrame([base, {**base, "throughput_to_offered_ratio": 0.99},
                       {**base, "model": "other"}, {**base, "status": "failed"},
                       {**base, "rate_counts": "1.6:5"}])
    assert len(saturated_runs(df, LLAMA.model)) == 1
    with pytest.raises(ValueError, match="lack columns"):
        saturated_runs(df.drop(columns=["rate_counts"]), LLAMA.model)


@pytest.fixture(scope="module")
def shared_windows():
    from experiments.common import shared_data_dir
    data = shared_data_dir()
    if not (data / "calibration").is_dir():
        pytest.skip(f"shared data not found at {data}")
    return step_rows(data, LLAMA.model)


def test_fit_moves_towards_known_slot_terms(shared_windows):
    true = np.array(LLAMA.step_coef, dtype=float)
    true[6] *= 1.6                         # more cost per token and slot
    true[8] *= 0.6                         # less per LoRA tile
    runs = _runs(replace(LLAMA, step_coef=tuple(true)))
    coef, rep = fit_slot_terms(LLAMA, shared_windows, runs, workers=2)
    start = np.array(LLAMA.step_coef, dtype=float)
    others = [i for i in range(len(start)) if i not in SLOT_TERMS]
    np.testing.assert_array_equal(coef[others], start[others])
    assert (coef >= 0).all() and rep["window_weight"] in WINDOW_WEIGHTS
    assert set(rep["held_out_mape_pct_by_window_weight"]) == {str(w) for w in WINDOW_WEIGHTS}
    assert rep["runs"] == len(runs) and rep["max_lora_ranks"] == [16, 32]
    assert rep["runs_step_mape_pct"]["after"] < 0.5 * rep["runs_step_mape_pct"]["before"]
    assert coef[6] > start[6] and coef[8] < start[8]
    with pytest.raises(ValueError, match="need >= 20 saturated"):
        fit_slot_terms(LLAMA, shared_windows, runs[runs.max_lora_rank == 16], workers=2)
