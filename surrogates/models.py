"""Learned single-GPU models with the scikit-learn estimator contract.

* ``ThroughputRegressor`` — total throughput (tok/s). It learns ``log((thr + 1) / (load + 1))``
  (throughput relative to the offered load, so the unsaturated regime is ~0) with gradient
  boosted trees; memory errors (no KV-capacity entry) are exact: throughput 0.
* ``StarvationClassifier`` — ``starved`` (throughput < 0.9 x offered, or a memory error).
* ``ItlRegressor`` — mean inter-token latency (ms), learned as ``log(ITL)``; NaN on memory errors.

Inputs are GPU feature matrices (``surrogates.features.FEATURES``; a DataFrame with those or
``f_<name>`` columns works too). The models add nonlinear derived columns and the KV capacity of
(Amax, max rank) from the profile table (``kv_capacity`` parameter, a ``{"amax,rank": tokens}``
dict). ``predict`` raises ``ValueError`` for inputs outside the trained domain;
``predict_with_flags`` returns ``(prediction, extrapolated_mask)`` instead.

Fitted models are stored as JSON (parameters, domain, KV table) plus npz (tree arrays); see
``save`` / ``load``. No pickles.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .domain import Domain, validate
from .features import FEATURES, IDX, derived_columns
from .memory import KvTable
from .model_files import ModelFileError, field, file_context, open_npz, read_json
from .trees import Forest, from_hgb

FORMAT_VERSION = 1


def design_matrix(M: np.ndarray, kv: KvTable) -> tuple[np.ndarray, np.ndarray]:
    """(design matrix, KV tokens) for validated features ``M``."""
    D, _ = derived_columns(M)
    kvt = kv.tokens_array(M[:, IDX["amax"]], M[:, IDX["max_rank"]])
    load = M[:, IDX["load"]]
    rate = np.maximum(M[:, IDX["rate"]], 1e-12)
    mean_total = load / rate
    # concurrency the KV cache allows at the mean request size (a capacity proxy)
    kv_reqs = kvt / mean_total
    extra = np.column_stack([kvt / 1000.0, kv_reqs, np.log(np.maximum(kv_reqs, 1e-9)),
                             np.log(np.maximum(load, 1e-9)) - np.log(np.maximum(kv_reqs, 1e-9))])
    return np.ascontiguousarray(np.column_stack([M, D, extra])), kvt


def _kv_from_param(kv_capacity) -> KvTable:
    if kv_capacity is None:
        raise ValueError("kv_capacity: the profile's KV table is required "
                         "(e.g. KvTable.from_profile(load_profile(name)).to_json())")
    if isinstance(kv_capacity, KvTable):
        return kv_capacity
    return KvTable.from_json(dict(kv_capacity))


class _TreeModel(BaseEstimator):
    """Shared fitting / persistence of the boosted-tree models."""

    _kind = "base"

    def __init__(self, kv_capacity=None, max_iter: int = 500, learning_rate: float = 0.05,
                 max_leaf_nodes: int = 63, min_samples_leaf: int = 10,
                 l2_regularization: float = 0.0, random_state: int = 0):
        self.kv_capacity = kv_capacity
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.random_state = random_state

    def _hgb_kwargs(self) -> dict:
        return dict(max_iter=self.max_iter, learning_rate=self.learning_rate,
                    max_leaf_nodes=self.max_leaf_nodes, min_samples_leaf=self.min_samples_leaf,
                    l2_regularization=self.l2_regularization, random_state=self.random_state,
                    early_stopping=False)

    def _prepare_fit(self, X):
        M = validate(X)
        self.kv_ = _kv_from_param(self.kv_capacity)
        self.domain_ = Domain.fit(M)
        self.n_features_in_ = len(FEATURES)
        D, kvt = design_matrix(M, self.kv_)
        return M, D, kvt

    def _prepare_predict(self, X, check: bool):
        if not hasattr(self, "forest_"):
            raise ValueError(f"{type(self).__name__}: not fitted")
        M = validate(X)
        if check:
            self.domain_.check(M)
        D, kvt = design_matrix(M, self.kv_)
        return M, D, kvt

    # persistence
    def save(self, path_stem: str | Path) -> None:
        stem = Path(path_stem)
        params = {k: v for k, v in self.get_params().items() if k != "kv_capacity"}
        meta = {"format_version": FORMAT_VERSION, "kind": self._kind, "params": params,
                "kv_capacity": self.kv_.to_json(), "domain": self.domain_.to_json(),
                "features": list(FEATURES), "extra": self._extra_state()}
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        np.savez_compressed(stem.with_suffix(".npz"), **self.forest_.to_arrays(""))

    def _extra_state(self) -> dict:
        return {}

    def _load_extra(self, d: dict) -> None:
        pass

    @classmethod
    def load(cls, path_stem: str | Path):
        stem = Path(path_stem)
        jpath, npath = stem.with_suffix(".json"), stem.with_suffix(".npz")
        meta = read_json(jpath)
        if meta.get("kind") != cls._kind:
            raise ModelFileError(f"model file {jpath}: kind is {meta.get('kind')!r}, "
                                 f"expected {cls._kind!r}")
        if meta.get("features") != list(FEATURES):
            raise ModelFileError(f"model file {jpath}: feature list differs from this code's "
                                 "FEATURES (trained by another version; retrain)")
        with file_context(jpath):
            m = cls(kv_capacity=field(meta, "kv_capacity", jpath), **field(meta, "params", jpath))
            m.kv_ = KvTable.from_json(meta["kv_capacity"])
            m.domain_ = Domain.from_json(field(meta, "domain", jpath))
            m.n_features_in_ = len(FEATURES)
        with open_npz(npath) as z, file_context(npath):
            m.forest_ = Forest.from_arrays(z, "")
        with file_context(jpath):
            m._load_extra(meta.get("extra", {}))
        return m


class ThroughputRegressor(RegressorMixin, _TreeModel):
    """Total throughput (tok/s) of one GPU; see the module docstring."""

    _kind = "throughput"

    def fit(self, X, y):
        from sklearn.ensemble import HistGradientBoostingRegressor
        M, D, kvt = self._prepare_fit(X)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (len(M),) or not np.all(np.isfinite(y)) or np.any(y < 0):
            raise ValueError("y: throughput must be a finite non-negative vector, one per row")
        ok = kvt > 0
        if ok.sum() < 2:
            raise ValueError("X: fewer than 2 rows without a memory error")
        target = np.log((y[ok] + 1.0) / (M[ok, IDX["load"]] + 1.0))
        hgb = HistGradientBoostingRegressor(**self._hgb_kwargs()).fit(D[ok], target)
        self.forest_ = from_hgb(hgb)
        return self

    def _predict(self, M, D, kvt):
        out = (M[:, IDX["load"]] + 1.0) * np.exp(self.forest_.predict(D)) - 1.0
        out = np.maximum(out, 0.0)
        out[kvt <= 0] = 0.0
        return out

    def predict(self, X):
        return self._predict(*self._prepare_predict(X, True))

    def predict_with_flags(self, X):
        M, D, kvt = self._prepare_predict(X, False)
        return self._predict(M, D, kvt), self.domain_.flags(M)

    def predict_ratio(self, X):
        """Predicted throughput / offered load."""
        M = validate(X)
        return self.predict(M) / M[:, IDX["load"]]


class StarvationClassifier(ClassifierMixin, _TreeModel):
    """Starvation (throughput < 0.9 x offered, or memory error) of one GPU."""

    _kind = "starvation"

    def __init__(self, kv_capacity=None, max_iter: int = 400, learning_rate: float = 0.05,
                 max_leaf_nodes: int = 63, min_samples_leaf: int = 10,
                 l2_regularization: float = 0.0, random_state: int = 0,
                 threshold: float = 0.5):
        super().__init__(kv_capacity, max_iter, learning_rate, max_leaf_nodes, min_samples_leaf,
                         l2_regularization, random_state)
        self.threshold = threshold

    def fit(self, X, y):
        from sklearn.ensemble import HistGradientBoostingClassifier
        M, D, kvt = self._prepare_fit(X)
        y = np.asarray(y).astype(bool)
        if y.shape != (len(M),):
            raise ValueError("y: one starvation label per row is required")
        ok = kvt > 0
        if len(np.unique(y[ok])) < 2:
            raise ValueError("y: both starved and non-starved rows are needed")
        hgb = HistGradientBoostingClassifier(**self._hgb_kwargs()).fit(D[ok], y[ok])
        self.forest_ = from_hgb(hgb)
        self.classes_ = np.array([False, True])
        return self

    def _extra_state(self) -> dict:
        return {"classes": [False, True]}

    def _load_extra(self, d: dict) -> None:
        self.classes_ = np.array([False, True])

    def _proba(self, D, kvt):
        p = 1.0 / (1.0 + np.exp(-self.forest_.predict(D)))
        p[kvt <= 0] = 1.0
        return p

    def predict_proba(self, X):
        M, D, kvt = self._prepare_predict(X, True)
        p = self._proba(D, kvt)
        return np.column_stack([1 - p, p])

    def predict(self, X):
        return self.predict_proba(X)[:, 1] >= self.threshold

    def predict_with_flags(self, X):
        M, D, kvt = self._prepare_predict(X, False)
        return self._proba(D, kvt) >= self.threshold, self.domain_.flags(M)


class ItlRegressor(RegressorMixin, _TreeModel):
    """Mean inter-token latency (ms) of one GPU; NaN for memory errors."""

    _kind = "itl"

    def fit(self, X, y):
        from sklearn.ensemble import HistGradientBoostingRegressor
        M, D, kvt = self._prepare_fit(X)
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (len(M),):
            raise ValueError("y: one ITL value per row is required")
        ok = (kvt > 0) & np.isfinite(y) & (y > 0)
        if ok.sum() < 2:
            raise ValueError("y: fewer than 2 rows with a finite positive ITL")
        hgb = HistGradientBoostingRegressor(**self._hgb_kwargs()).fit(D[ok], np.log(y[ok]))
        self.forest_ = from_hgb(hgb)
        return self

    def _predict(self, D, kvt):
        out = np.exp(self.forest_.predict(D))
        out[kvt <= 0] = np.nan
        return out

    def predict(self, X):
        M, D, kvt = self._prepare_predict(X, True)
        return self._predict(D, kvt)

    def predict_with_flags(self, X):
        M, D, kvt = self._prepare_predict(X, False)
        return self._predict(D, kvt), self.domain_.flags(M)
