"""Error summaries of experiments.twin_fidelity (synthetic tables; the replay itself needs the
shared runs and is exercised by the experiment)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.twin_fidelity import (COMPARED, error_summary, format_summary, worst_runs,
                                       _plot_latency)


def _table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = 12
    d = pd.DataFrame({"max_loras": 8, "served_adapters": 64,
                      "max_lora_rank": [16] * 6 + [32] * 6, "rate_counts": "0.4:64"})
    for key, _, _, _ in COMPARED:
        real = rng.uniform(10, 1000, n)
        d[f"real_{key}"] = real
        d[f"twin_{key}"] = real
    d.loc[0, "twin_tps"] = 3 * d.loc[0, "real_tps"]      # one bad rank-16 run
    d.loc[7, "twin_ttft_ms"] = np.nan                    # a run without a completed request
    return d


def test_error_summary_overall_and_per_rank():
    d = _table()
    s = error_summary(d)
    assert set(s) == {"all", "max_lora_rank=16", "max_lora_rank=32"}
    # one run off by 3x: |y - 3y| / (y + 3y) = 0.5 -> SMAPE 50 % / runs; MAPE 200 % / runs
    assert s["all"]["tps"]["smape"] == pytest.approx(50 / 12)
    assert s["all"]["tps"]["mape"] == pytest.approx(200 / 12)
    assert s["max_lora_rank=16"]["tps"]["smape"] == pytest.approx(50 / 6)
    assert s["max_lora_rank=32"]["tps"]["smape"] == 0.0
    # the missing value is left out and counted
    assert s["all"]["ttft_ms"]["n"] == 11 and s["all"]["ttft_ms"]["smape"] == 0.0
    assert "max_lora_rank=16" in format_summary(s)


def test_worst_runs_sorted_by_relative_error():
    d = _table()
    d.loc[3, "twin_tps"] = 0.5 * d.loc[3, "real_tps"]
    w = worst_runs(d, "tps", n=3)
    assert list(w.index[:2]) == [0, 3]
    assert w["err_pct"].iloc[0] == pytest.approx(200.0)
    assert w["err_pct"].iloc[1] == pytest.approx(-50.0)


def test_latency_plot_written(tmp_path):
    out = tmp_path / "fid.png"
    _plot_latency(_table(), str(out))
    assert out.stat().st_size > 10_000


def test_runs_whose_counts_disagree_are_skipped_with_a_note(capsys):
    from pathlib import Path
    from experiments.twin_fidelity import _consistent_counts
    runs = pd.DataFrame({"run_id": ["good", "bad", "junk"],
                         "adapter_rank_counts": ["8:2 16:2", "8:192", "x"],
                         "rate_counts": ["0.1:4", "0.4:256", "0.1:1"]})
    assert _consistent_counts(runs, Path("runs.csv")).tolist() == [True, False, False]
    err = capsys.readouterr().err
    assert "skipped bad" in err and "skipped junk" in err and "runs.csv" in err


def test_bias_by_slots_is_signed_and_grouped():
    from experiments.twin_fidelity import bias_by_slots
    d = pd.DataFrame({"max_lora_rank": [16, 16, 16, 32], "max_loras": [8, 8, 128, 8],
                      "real_tps": [100.0, 100.0, 100.0, 50.0], "twin_tps": [90.0, 94.0, 110.0, 50.0],
                      "real_itl_ms": [10.0] * 4, "twin_itl_ms": [10.0, 10.0, 12.0, 9.0]})
    b = bias_by_slots(d).set_index(["max_lora_rank", "max_loras"])
    assert b.loc[(16, 8), "tps_bias_pct"] == pytest.approx(-8.0)
    assert b.loc[(16, 128), "tps_bias_pct"] == pytest.approx(10.0)
    assert b.loc[(32, 8), "itl_ms_bias_pct"] == pytest.approx(-10.0)
    assert b.loc[(16, 8), "runs"] == 2
