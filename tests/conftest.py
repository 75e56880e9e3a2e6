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
