"""The Ray backend runs the same task function as the local pool (skipped without Ray)."""

from __future__ import annotations

import pandas as pd
import pytest

from surrogates.dataset import build_dataset, load_dataset

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install ray)")

PROFILE = "llama-3.1-8b-instruct"


def test_ray_backend_matches_local(tmp_path):
    kw = dict(workers=2, seed=9, duration_s=60.0, progress=False, log=lambda s: None)
    build_dataset(PROFILE, 4, tmp_path / "local.parquet", backend="local", **kw)
    s = build_dataset(PROFILE, 4, tmp_path / "ray.parquet", backend="ray", **kw)
    assert s["scenarios_run"] == 4
    a = load_dataset(tmp_path / "local.parquet").drop(columns=["wall_s"])
    b = load_dataset(tmp_path / "ray.parquet").drop(columns=["wall_s"])
    pd.testing.assert_frame_equal(a, b)
    assert not ray.is_initialized()          # the local instance it started was shut down
