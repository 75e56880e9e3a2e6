"""The rank term of the step model: its fit (stage 3 of twin.calibrate) and its effect on runs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from experiments.common import shared_data_dir
from twin.calibrate import RANK_RUNS, calibrate, fit_rank_scale, run_step_features
from twin.sharegpt import sharegpt_lengths
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.step_time import step_time_ms_py
from twin.workload import adapters_from_cycles

DATA = shared_data_dir()


def _synthetic_runs(coef, c10: float, alpha: float, n: int = 60, seed: int = 0) -> pd.DataFrame:
    """End-to-end run rows whose mean ITL is exactly alpha * step model (rank term c10)."""
    rng = np.random.default_rng(seed)
    runs = pd.DataFrame({
        "status": "ok", "model": "m",
        "max_loras": rng.choice([8, 16, 32, 64, 128], n),
        "served_adapters": rng.choice([64, 128, 256, 384], n),
        "max_lora_rank": rng.choice([16, 32], n),
        "pool_mean_input_len": 223.0, "pool_mean_output_len": 196.0,
        "mean_running": rng.uniform(5, 600, n), "mean_waiting": rng.uniform(0, 2000, n),
    })
    c = np.array(coef, dtype=float)
    c[10] = c10
    runs["mean_itl_ms"] = [alpha * step_time_ms_py(c, *row)
                           for row in run_step_features(runs)]
    return runs


def test_fit_rank_scale_recovers_synthetic_term():
    coef = load_profile("llama-3.1-8b-instruct").step_coef_array()
    for true in (0.0, 0.05, 0.2):
        c10, rep = fit_rank_scale(coef, _synthetic_runs(coef, true, alpha=1.07))
        assert c10 == pytest.approx(true, abs=1e-9)
        assert rep["alpha"] == pytest.approx(1.07, rel=1e-9)


def test_fit_rank_scale_needs_two_ranks():
    coef = load_profile("llama-3.1-8b-instruct").step_coef_array()
    runs = _synthetic_runs(coef, 0.1, 1.0)
    runs["max_lora_rank"] = 16
    with pytest.raises(ValueError, match="max_lora_rank"):
        fit_rank_scale(coef, runs)
    with pytest.raises(ValueError, match="mean_itl_ms"):
        fit_rank_scale(coef, runs.drop(columns=["mean_itl_ms"]))


def test_rank8_workload_unchanged_by_rank_term():
    """A rank-8-only workload runs exactly as with the twin before the rank term (c10 = 0)."""
    prof = load_profile("llama-3.1-8b-instruct")
    assert prof.step_coef[10] > 0
    before = replace(prof, step_coef=prof.step_coef[:10] + (0.0,) + prof.step_coef[11:])
    adapters = adapters_from_cycles(64, [8], [0.4, 0.05])
    cfg = ServerConfig(max_loras=16)
    kw = dict(duration_s=600.0, lengths=sharegpt_lengths(223.0, 196.0), seed=3)
    a = simulate_server(prof, adapters, cfg, **kw).to_dict()
    b = simulate_server(before, adapters, cfg, **kw).to_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_rank32_server_slower_than_rank16():
    """Same adapters and load; only --max-lora-rank differs: the rank-32 server steps slower."""
    prof = load_profile("llama-3.1-8b-instruct")
    adapters = adapters_from_cycles(32, [8, 16], [1.6])
    kw = dict(duration_s=300.0, lengths=sharegpt_lengths(223.0, 196.0), seed=1)
    m16 = simulate_server(prof, adapters, ServerConfig(max_loras=16, max_lora_rank=16), **kw)
    m32 = simulate_server(prof, adapters, ServerConfig(max_loras=16, max_lora_rank=32), **kw)
    assert m32.mean_itl_ms > m16.mean_itl_ms


@pytest.mark.parametrize("model", ["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"])
def test_rank_term_reproducible_from_calibrate(model, shared_calibration):
    if not (DATA / RANK_RUNS).is_file():
        pytest.skip(f"shared max-search runs not found at {DATA / RANK_RUNS}")
    prof, rep = shared_calibration(model)
    assert rep["rank_term"]["rank_scale"] > 0
    assert prof.step_coef[10] == rep["rank_term"]["rank_scale"]
    assert prof.step_coef[10] == pytest.approx(load_profile(model).step_coef[10], rel=1e-12)
    assert rep["rank_term"]["source"] == str(RANK_RUNS)
    # fitted on max-search runs only: never on the validation runs the fidelity check replays
    assert "maxsearch" in str(RANK_RUNS) and "validation_llama.csv" not in str(RANK_RUNS)


def test_without_rank_runs_the_term_stays_zero_and_says_why(tmp_path):
    if not (DATA / "calibration").is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    (tmp_path / "calibration").symlink_to(DATA / "calibration")
    prof, rep = calibrate(tmp_path, "llama-3.1-8b-instruct")
    assert prof.step_coef[10] == 0.0
    assert "not found" in rep["rank_term"]["note"]
    assert "not fitted" in prof.source["rank_scale"]
