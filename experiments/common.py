"""Helpers shared by the experiments: error metrics, the shared-data location, output files."""

from __future__ import annotations

import os
from pathlib import Path

from surrogates.metrics import mape, smape  # noqa: F401  (DESIGN.md section 6 definitions)

REPO = Path(__file__).resolve().parent.parent
SHARED_ENV = "LORA_SHARED_DATA"


def shared_data_dir() -> Path:
    """The real-measurement folder: ``$LORA_SHARED_DATA`` or ``<repo>/../shared/data/vllm_h100``."""
    return Path(os.environ.get(SHARED_ENV, REPO.parent / "shared" / "data" / "vllm_h100"))


def require_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: {what}: file not found: {p}")
    return p
