"""Boosted oblivious (symmetric) trees: branch-free prediction in a few ns per tree.

Every level of an oblivious tree of depth ``d`` uses the same split ``x[f_l] > t_l``, so a
row's leaf index is ``sum_l (x[f_l] > t_l) << (d - 1 - l)`` — no pointer chasing, no
mispredicted branches. ``fit_oblivious`` boosts them with squared loss on quantile-binned
features (numpy only); ``ObliviousForest.predict`` is numba. Arrays: ``feat`` (T, d) int32,
``thr`` (T, d) float64, ``leaf`` (T, 2**d) float64, ``base``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np


@dataclass(frozen=True)
class ObliviousForest:
    feat: np.ndarray
    thr: np.ndarray
    leaf: np.ndarray
    base: float

    @property
    def n_trees(self) -> int:
        return self.feat.shape[0]

    @property
    def depth(self) -> int:
        return self.feat.shape[1]

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.empty(X.shape[0])
        _predict(X, self.feat, self.thr, self.leaf, self.base, out)
        return out

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}feat": self.feat, f"{prefix}thr": self.thr,
                f"{prefix}leaf": self.leaf, f"{prefix}base": np.array([self.base])}

    @classmethod
    def from_arrays(cls, d, prefix: str) -> "ObliviousForest":
        try:
            return cls(np.ascontiguousarray(d[f"{prefix}feat"], dtype=np.int32),
                       np.ascontiguousarray(d[f"{prefix}thr"], dtype=np.float64),
                       np.ascontiguousarray(d[f"{prefix}leaf"], dtype=np.float64),
                       float(np.asarray(d[f"{prefix}base"])[0]))
        except KeyError as e:
            raise ValueError(f"model file: missing array {e.args[0]!r}") from None


@nb.njit(cache=True, inline="always")
def oblivious_sum(x, feat, thr, leaf):
    s = 0.0
    T, d = feat.shape
    for t in range(T):
        idx = 0
        for l in range(d):
            idx = 2 * idx + (1 if x[feat[t, l]] > thr[t, l] else 0)
        s += leaf[t, idx]
    return s


@nb.njit(cache=True)
def _predict(X, feat, thr, leaf, base, out):
    for i in range(X.shape[0]):
        out[i] = base + oblivious_sum(X[i], feat, thr, leaf)


def fit_oblivious(X: np.ndarray, y: np.ndarray, n_trees: int = 150, depth: int = 6,
                  learning_rate: float = 0.2, n_bins: int = 64, l2: float = 1.0
                  ) -> ObliviousForest:
    """Gradient boosting (squared loss) of oblivious trees; deterministic."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n, p = X.shape
    if n < 2 or y.shape != (n,):
        raise ValueError("X, y: need >= 2 rows and one target per row")
    edges = []
    B = np.empty((n, p), dtype=np.int64)
    for j in range(p):
        e = np.unique(np.quantile(X[:, j], np.linspace(0, 1, n_bins + 1)[1:-1]))
        edges.append(e)
        B[:, j] = np.searchsorted(e, X[:, j], side="left")   # x > e[k]  <=>  B > k
    nbins = np.array([len(e) + 1 for e in edges])
    base = float(y.mean())
    pred = np.full(n, base)
    feats = np.zeros((n_trees, depth), np.int32)
    thrs = np.zeros((n_trees, depth))
    leaves = np.zeros((n_trees, 2 ** depth))
    for t in range(n_trees):
        r = y - pred
        L = np.zeros(n, dtype=np.int64)
        for lvl in range(depth):
            nl = 2 ** lvl
            best = (-np.inf, 0, 0)
            for j in range(p):
                nb_ = int(nbins[j])
                if nb_ < 2:
                    continue
                key = L * nb_ + B[:, j]
                G = np.bincount(key, weights=r, minlength=nl * nb_).reshape(nl, nb_)
                C = np.bincount(key, minlength=nl * nb_).reshape(nl, nb_).astype(np.float64)
                GL, CL = np.cumsum(G, axis=1)[:, :-1], np.cumsum(C, axis=1)[:, :-1]
                GT, CT = G.sum(axis=1, keepdims=True), C.sum(axis=1, keepdims=True)
                GR, CR = GT - GL, CT - CL
                gain = (GL ** 2 / (CL + l2) + GR ** 2 / (CR + l2)).sum(axis=0)
                k = int(np.argmax(gain))
                if gain[k] > best[0]:
                    best = (float(gain[k]), j, k)
            _, j, k = best
            feats[t, lvl] = j
            thrs[t, lvl] = edges[j][k] if len(edges[j]) else np.inf
            L = 2 * L + (B[:, j] > k)
        G = np.bincount(L, weights=r, minlength=2 ** depth)
        C = np.bincount(L, minlength=2 ** depth)
        leaves[t] = learning_rate * G / (C + l2)
        pred += leaves[t][L]
    return ObliviousForest(feats, thrs, leaves, base)
