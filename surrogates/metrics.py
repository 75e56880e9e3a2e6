"""Error metrics used in the reports (DESIGN.md section 6)."""

from __future__ import annotations

import numpy as np


def smape(y, yhat) -> float:
    """100 * mean(|y - yhat| / (|y| + |yhat|)) — no factor 2; pairs with both 0 count as 0."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    if y.size == 0:
        return float("nan")
    den = np.abs(y) + np.abs(yhat)
    return float(100.0 * np.mean(np.where(den > 0, np.abs(y - yhat) / np.where(den > 0, den, 1), 0)))


def mape(y, yhat) -> float:
    """100 * mean(|y - yhat| / |y|) over rows with y != 0."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    nz = y != 0
    if not nz.any():
        return float("nan")
    return float(100.0 * np.mean(np.abs(y[nz] - yhat[nz]) / np.abs(y[nz])))


def f1(y, yhat) -> float:
    """F1 of the positive class (True)."""
    y, yhat = np.asarray(y, bool), np.asarray(yhat, bool)
    tp = float(np.sum(y & yhat))
    fp = float(np.sum(~y & yhat))
    fn = float(np.sum(y & ~yhat))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn > 0 else 1.0


def accuracy(y, yhat) -> float:
    if np.asarray(y).size == 0:
        return float("nan")
    return float(np.mean(np.asarray(y, bool) == np.asarray(yhat, bool)))
