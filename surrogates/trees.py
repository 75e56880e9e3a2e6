"""Tree ensembles as plain arrays (npz-storable, no pickles) with a numba predictor.

``Forest`` holds every node of every tree in flat arrays: ``feature`` (-1 for a leaf),
``threshold`` (go left when ``x[feature] <= threshold``), ``left``/``right`` (absolute node
indices), ``value`` (leaf output), and ``roots`` (first node of each tree). The prediction is
``base + scale * sum_t leaf_t(x)``. ``from_hgb`` converts a fitted scikit-learn
``HistGradientBoosting{Regressor,Classifier}`` (binary) and ``from_tree`` a fitted
``DecisionTreeRegressor``; tests check both against scikit-learn's own predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba as nb
import numpy as np


@dataclass(frozen=True)
class Forest:
    feature: np.ndarray      # int32
    threshold: np.ndarray    # float64
    left: np.ndarray         # int32
    right: np.ndarray        # int32
    value: np.ndarray        # float64
    roots: np.ndarray        # int32
    base: float = 0.0
    scale: float = 1.0

    @property
    def n_trees(self) -> int:
        return len(self.roots)

    @property
    def n_nodes(self) -> int:
        return len(self.feature)

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.empty(X.shape[0])
        _predict(X, self.feature, self.threshold, self.left, self.right, self.value, self.roots,
                 float(self.base), float(self.scale), out)
        return out

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}feature": self.feature, f"{prefix}threshold": self.threshold,
                f"{prefix}left": self.left, f"{prefix}right": self.right,
                f"{prefix}value": self.value, f"{prefix}roots": self.roots,
                f"{prefix}base_scale": np.array([self.base, self.scale])}

    def check(self, where: str = "model file") -> "Forest":
        """Refuse arrays the compiled predictor cannot walk safely (a damaged file): unequal
        lengths, child or root indices out of range, or a child not after its parent (which
        could loop forever). Returns ``self``."""
        n = len(self.feature)
        for name in ("threshold", "left", "right", "value"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{where}: array {name!r} has shape {getattr(self, name).shape}, "
                                 f"'feature' has {n} nodes")
        if self.roots.ndim != 1 or len(self.roots) == 0 or n == 0:
            raise ValueError(f"{where}: no trees (empty 'roots' or 'feature')")
        if self.roots.min() < 0 or self.roots.max() >= n:
            raise ValueError(f"{where}: a root index is outside 0..{n - 1}")
        inner = self.feature >= 0
        k = np.arange(n)
        for name in ("left", "right"):
            c = getattr(self, name)[inner]
            if c.size and (np.any(c <= k[inner]) or c.max() >= n):
                raise ValueError(f"{where}: array {name!r} holds a child index out of range")
        if not (np.all(np.isfinite(self.value)) and math.isfinite(self.base)
                and math.isfinite(self.scale)):
            raise ValueError(f"{where}: non-finite leaf values")
        return self

    @classmethod
    def from_arrays(cls, d, prefix: str) -> "Forest":
        try:
            bs = np.asarray(d[f"{prefix}base_scale"], dtype=np.float64)
            return cls(np.ascontiguousarray(d[f"{prefix}feature"], dtype=np.int32),
                       np.ascontiguousarray(d[f"{prefix}threshold"], dtype=np.float64),
                       np.ascontiguousarray(d[f"{prefix}left"], dtype=np.int32),
                       np.ascontiguousarray(d[f"{prefix}right"], dtype=np.int32),
                       np.ascontiguousarray(d[f"{prefix}value"], dtype=np.float64),
                       np.ascontiguousarray(d[f"{prefix}roots"], dtype=np.int32),
                       float(bs[0]), float(bs[1])).check()
        except KeyError as e:
            raise ValueError(f"model file: missing array {e.args[0]!r}") from None


@nb.njit(cache=True)
def _predict(X, feature, threshold, left, right, value, roots, base, scale, out):
    n = X.shape[0]
    for i in range(n):
        s = 0.0
        for t in range(roots.shape[0]):
            k = roots[t]
            while feature[k] >= 0:
                if X[i, feature[k]] <= threshold[k]:
                    k = left[k]
                else:
                    k = right[k]
            s += value[k]
        out[i] = base + scale * s


def from_hgb(model) -> Forest:
    """Convert a fitted HistGradientBoostingRegressor / binary Classifier (raw score)."""
    preds = getattr(model, "_predictors", None)
    if preds is None:
        raise ValueError("model: not a fitted HistGradientBoosting estimator")
    if len(preds[0]) != 1:
        raise ValueError("model: only regressors and binary classifiers are supported")
    feats, thr, lft, rgt, val, roots = [], [], [], [], [], []
    off = 0
    for it in preds:
        nodes = it[0].nodes
        if np.any(nodes["is_categorical"][~nodes["is_leaf"].astype(bool)]):
            raise ValueError("model: categorical splits are not supported")
        leaf = nodes["is_leaf"].astype(bool)
        feats.append(np.where(leaf, -1, nodes["feature_idx"]).astype(np.int32))
        thr.append(nodes["num_threshold"].astype(np.float64))
        lft.append(np.where(leaf, -1, nodes["left"].astype(np.int64) + off).astype(np.int32))
        rgt.append(np.where(leaf, -1, nodes["right"].astype(np.int64) + off).astype(np.int32))
        val.append(nodes["value"].astype(np.float64))
        roots.append(off)
        off += len(nodes)
    base = float(np.asarray(model._baseline_prediction).ravel()[0])
    return Forest(np.concatenate(feats), np.concatenate(thr), np.concatenate(lft),
                  np.concatenate(rgt), np.concatenate(val), np.asarray(roots, np.int32), base, 1.0)


def from_tree(tree, base: float = 0.0) -> Forest:
    """Convert a fitted scikit-learn DecisionTreeRegressor (single output)."""
    t = tree.tree_
    leaf = t.children_left < 0
    return Forest(np.where(leaf, -1, t.feature).astype(np.int32),
                  t.threshold.astype(np.float64),
                  t.children_left.astype(np.int32), t.children_right.astype(np.int32),
                  t.value[:, 0, 0].astype(np.float64), np.array([0], np.int32), base, 1.0)
