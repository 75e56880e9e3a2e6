
import numpy as np
import pytest

from experiments.common import shared_data_dir

from twin.calibrate import fit_metrics, kv_table, main, step_rows
from twin.profile import GpuProfile, load_profile

DATA = shared_data_dir()


@pytest.fixture(scope="module")
def data():
    if not (DATA / "calibration").is_dir():
        pytest.skip(f"shared data not found at {DATA}")
    return DATA


def test_fit_metrics():
    m = fit_metrics([1.0, 2.0, 4.0], [1.0, 2.0, 4.0])
    assert m["n"] == 3 and m["r2"] == 1.0 and m["mape_pct"] == 0.0


@pytest.mark.parametrize("model", ["llama-3.1-8b-instruct", "qwen-2.5-7b-instruct"])
def test_calibrate_matches_shipped(data, model, tmp_path, shared_calibration):
    prof, rep = shared_calibration(model)
    assert isinstance(prof, GpuProfile)
    for src in ("decode_baseline", "lora_decode_overhead"):
        assert rep["step_time"][src]["mape_pct"] < 10
    shipped = load_profile(model)
    assert np.allclose(prof.step_coef_array(), shipped.step_coef_array(), rtol=1e-6, atol=1e-9)
    assert prof.kv_capacity == shipped.kv_capacity
    out = tmp_path / "p.json"
    assert main(["--data", str(data), "--model", model, "--out", str(out), "--no-slot-fit",
                 "--workers", "2"]) == 0
    assert GpuProfile.from_json(out).model == model


def test_qwen_rows_are_qwen_only(data):
    rows = step_rows(data, "qwen-2.5-7b-instruct")
    assert len(rows) > 0
    # windows of the other model would bring prefill windows (Qwen has only run-level prefill)
    assert "prefill_baseline" not in set(rows.source)


def test_kv_table_only_starting(data):
    kv, mml, ranks = kv_table(data, "qwen-2.5-7b-instruct")
    assert all(v >= mml for v in kv.values())
    assert (256, 32) not in kv and (224, 32) in kv
