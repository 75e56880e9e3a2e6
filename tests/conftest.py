"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shared_calibration():
    """``calibrate(shared data, model, workers=2)`` once per model for the whole session: a
    Llama calibration replays the max-search runs twice (about 3 minutes), and both the
    shipped-profile test and the rank-term test check what it gives. Skips when the shared
    data are absent."""
    from experiments.common import shared_data_dir
    from twin.calibrate import calibrate

    data = shared_data_dir()
    done: dict[str, tuple] = {}

    def get(model: str) -> tuple:
        if not (data / "calibration").is_dir():
            pytest.skip(f"shared data not found at {data}")
        if model not in done:
            done[model] = calibrate(data, model, workers=2)
        return done[model]

    return get


@pytest.fixture(autouse=True)
def _no_search_store(tmp_path, monkeypatch):
    """No test writes the repository's search store: ``$LORA_PLACEMENT_STORE`` starts unset
    (restored after the test, even when a study's ``main`` set it) and the studies'
    ``--search-store`` default points into the test's own folder."""
    import experiments.common as common
    from optim.capacity import STORE_ENV
    monkeypatch.setenv(STORE_ENV, "")
    monkeypatch.setattr(common, "SEARCH_STORE", tmp_path / "bound_searches.json")
