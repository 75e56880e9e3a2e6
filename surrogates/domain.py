"""The trained domain of a surrogate and input checks.

Bad input (wrong shape, non-finite value, inconsistent additive features, unknown rank class)
raises ``ValueError`` naming the field. Inputs outside the box spanned by the training data
(each feature, plus the mean lengths and mean rate per adapter) are *extrapolation*: ``check``
raises a ``ValueError`` naming the first offending field, ``flags`` returns a boolean mask.
Nothing is extrapolated silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .features import FEATURES, IDX, RANK_CLASSES, as_feature_matrix

# quantities checked against the training box, besides the raw features
EXTRA = ("mean_in", "mean_out", "mean_rate")


def _extra(M: np.ndarray) -> np.ndarray:
    rate = np.maximum(M[:, IDX["rate"]], 1e-300)
    return np.column_stack([M[:, IDX["load_in"]] / rate,
                            (M[:, IDX["load"]] - M[:, IDX["load_in"]]) / rate,
                            M[:, IDX["rate"]] / np.maximum(M[:, IDX["n"]], 1.0)])


def validate(X) -> np.ndarray:
    """Feature matrix after consistency checks (not domain checks)."""
    M = as_feature_matrix(X)
    n = M[:, IDX["n"]]
    if np.any(n < 1) or np.any(np.abs(n - np.round(n)) > 1e-6):
        raise ValueError("features: column 'n' must be an integer >= 1")
    counts = M[:, [IDX[f"n_rank{r}"] for r in RANK_CLASSES]]
    if np.any(np.abs(counts.sum(axis=1) - n) > 1e-6 * np.maximum(n, 1)):
        raise ValueError("features: columns 'n_rank*' must sum to 'n'")
    mr = M[:, IDX["max_rank"]]
    if not np.all(np.isin(mr, RANK_CLASSES)):
        raise ValueError(f"features: column 'max_rank' must be one of {RANK_CLASSES}")
    for j, r in enumerate(RANK_CLASSES):
        if np.any((counts[:, j] > 0) & (mr < r)):
            raise ValueError(f"features: column 'max_rank' is below rank {r} of an adapter")
    amax = M[:, IDX["amax"]]
    if np.any(amax < 1) or np.any(amax != np.round(amax)):
        raise ValueError("features: column 'amax' must be an integer >= 1")
    for c in ("rate", "load", "load_in", "busy5", "busy30"):
        if np.any(M[:, IDX[c]] <= 0):
            raise ValueError(f"features: column {c!r} must be > 0")
    if np.any(M[:, IDX["load_in"]] >= M[:, IDX["load"]]):
        raise ValueError("features: column 'load_in' must be below 'load'")
    for c in ("busy5", "busy30"):
        if np.any(M[:, IDX[c]] > n * (1 + 1e-9)):
            raise ValueError(f"features: column {c!r} cannot exceed 'n'")
    return M


@dataclass(frozen=True)
class Domain:
    """Per-quantity [lo, hi] of the training data (features then ``EXTRA``)."""

    names: tuple[str, ...]
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def fit(cls, M: np.ndarray) -> "Domain":
        Z = np.column_stack([M, _extra(M)])
        return cls(FEATURES + EXTRA, Z.min(axis=0), Z.max(axis=0))

    def to_json(self) -> dict:
        return {n: [float(a), float(b)] for n, a, b in zip(self.names, self.lo, self.hi)}

    @classmethod
    def from_json(cls, d: dict) -> "Domain":
        names = FEATURES + EXTRA
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"model file: domain misses {missing[0]!r}")
        return cls(names, np.array([d[n][0] for n in names], float),
                   np.array([d[n][1] for n in names], float))

    def _z(self, M: np.ndarray) -> np.ndarray:
        return np.column_stack([M, _extra(M)])

    def flags(self, M: np.ndarray, rtol: float = 1e-6) -> np.ndarray:
        """True where a row lies outside the trained box (extrapolation)."""
        Z = self._z(M)
        tol = rtol * np.maximum(np.abs(self.lo), np.abs(self.hi))
        return np.any((Z < self.lo - tol) | (Z > self.hi + tol), axis=1)

    def check(self, M: np.ndarray, rtol: float = 1e-6) -> None:
        """Raise ValueError naming the first field outside the trained box."""
        Z = self._z(M)
        tol = rtol * np.maximum(np.abs(self.lo), np.abs(self.hi))
        bad = (Z < self.lo - tol) | (Z > self.hi + tol)
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"features: {self.names[j]}={Z[i, j]:.6g} (row {i}) is outside the "
                             f"trained domain [{self.lo[j]:.6g}, {self.hi[j]:.6g}]; use "
                             "predict_with_flags() to get flagged extrapolated predictions")
