"""Helpers shared by the experiments: error metrics, the shared-data location, output files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SHARED_ENV = "LORA_SHARED_DATA"


def shared_data_dir() -> Path:
    """The real-measurement folder: ``$LORA_SHARED_DATA`` or ``<repo>/../shared/data/vllm_h100``."""
    return Path(os.environ.get(SHARED_ENV, REPO.parent / "shared" / "data" / "vllm_h100"))


def smape(y, yhat) -> float:
    """SMAPE as in DESIGN.md section 6: 100 * mean(|y - yhat| / (|y| + |yhat|)), no factor 2."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    den = np.abs(y) + np.abs(yhat)
    return float(100.0 * np.mean(np.where(den > 0, np.abs(y - yhat) / np.where(den > 0, den, 1), 0)))


def mape(y, yhat) -> float:
    """100 * mean(|y - yhat| / |y|)."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    return float(100.0 * np.mean(np.abs(y - yhat) / np.abs(y)))


def require_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: {what}: file not found: {p}")
    return p
