"""Fast single-GPU model for greedy placement: small distilled tree ensembles in one numba loop.

``FastModel`` predicts throughput and starvation of many GPUs at once from raw feature rows
(``surrogates.features.FEATURES``). One compiled loop computes each row's design columns (the
same as ``models.design_matrix``; a test checks it), looks up the KV capacity in a dense table
(memory errors exact), and evaluates two boosted *oblivious* tree ensembles
(``surrogates.oblivious``: branch-free, a few ns per tree) distilled from the full models
(``ThroughputRegressor``'s log throughput/load and ``StarvationClassifier``'s logit): the
student regresses the teacher's raw outputs on the training rows (and on synthetic GPUs made by
merging two training scenarios, which are valid GPU feature vectors because the features are
additive; kept only inside the trained domain).

``predict(X)`` checks the input and the trained domain (ValueError naming the field);
``predict_unchecked(M)`` skips the checks for a caller that already validated its rows (the
greedy placer's inner loop); ``predict_with_flags`` returns the extrapolation mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import numba as nb
import numpy as np

from .domain import Domain, validate
from .features import FEATURES, IDX, RANK_CLASSES
from .memory import KvTable
from .model_files import ModelFileError, field, file_context, open_npz, read_json, require
from .oblivious import ObliviousForest, fit_oblivious, oblivious_sum

FORMAT_VERSION = 1
DENSE_MAX_AMAX = 1024
N_DESIGN = len(FEATURES) + 9 + 4

_I_N, _I_RATE, _I_LOAD, _I_LOADIN = IDX["n"], IDX["rate"], IDX["load"], IDX["load_in"]
_I_B5, _I_B30, _I_MR, _I_A = IDX["busy5"], IDX["busy30"], IDX["max_rank"], IDX["amax"]
_NF = len(FEATURES)
_RANKS = np.asarray(RANK_CLASSES, np.float64)


@nb.njit(cache=True)
def _fast_kernel(M, kvdense, ranks, tfeat, tthr, tleaf, tbase, cfeat, cthr, cleaf, cbase,
                 thr_out, logit_out):
    n = M.shape[0]
    nf = M.shape[1]
    x = np.empty(nf + 13)
    for i in range(n):
        for j in range(nf):
            x[j] = M[i, j]
        nn = M[i, _I_N]
        rate = max(M[i, _I_RATE], 1e-12)
        load = M[i, _I_LOAD]
        load_in = M[i, _I_LOADIN]
        b5 = M[i, _I_B5]
        b30 = M[i, _I_B30]
        amax = M[i, _I_A]
        nn1 = max(nn, 1.0)
        lload = np.log(max(load, 1e-9))
        x[nf + 0] = lload
        x[nf + 1] = load_in / rate
        x[nf + 2] = (load - load_in) / rate
        x[nf + 3] = min(nn, amax) / nn1
        x[nf + 4] = b5 / amax
        x[nf + 5] = b30 / amax
        x[nf + 6] = np.log(nn1)
        x[nf + 7] = load / nn1
        x[nf + 8] = b5 / nn1
        ai = int(amax)
        ri = -1
        for q in range(ranks.shape[0]):
            if ranks[q] == M[i, _I_MR]:
                ri = q
        kv = 0.0
        if ai < kvdense.shape[0] and ri >= 0:
            kv = kvdense[ai, ri]
        if kv <= 0.0:
            thr_out[i] = 0.0
            logit_out[i] = np.inf
            continue
        kv_reqs = kv / (load / rate)
        lkv = np.log(max(kv_reqs, 1e-9))
        x[nf + 9] = kv / 1000.0
        x[nf + 10] = kv_reqs
        x[nf + 11] = lkv
        x[nf + 12] = lload - lkv
        s = tbase + oblivious_sum(x, tfeat, tthr, tleaf)
        thr_out[i] = max((load + 1.0) * np.exp(s) - 1.0, 0.0)
        logit_out[i] = cbase + oblivious_sum(x, cfeat, cthr, cleaf)


class FastModel:
    """Distilled throughput + starvation forests in one numba loop (see module docstring)."""

    def __init__(self, thr_forest: ObliviousForest, starve_forest: ObliviousForest, kv: KvTable, domain: Domain,
                 info: dict | None = None):
        self.thr_forest = thr_forest
        self.starve_forest = starve_forest
        self.kv = kv
        self.domain = domain
        self.info = dict(info or {})
        self._kvdense = np.ascontiguousarray(kv.dense(DENSE_MAX_AMAX, RANK_CLASSES))

    def predict_unchecked(self, M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(throughput tok/s, starved) for a float64 C-contiguous (n, len(FEATURES)) matrix."""
        n = M.shape[0]
        thr = np.empty(n)
        logit = np.empty(n)
        a, b = self.thr_forest, self.starve_forest
        _fast_kernel(M, self._kvdense, _RANKS, a.feat, a.thr, a.leaf, a.base,
                     b.feat, b.thr, b.leaf, b.base, thr, logit)
        return thr, logit >= 0.0

    def predict(self, X) -> tuple[np.ndarray, np.ndarray]:
        M = validate(X)
        self.domain.check(M)
        return self.predict_unchecked(M)

    def predict_with_flags(self, X):
        M = validate(X)
        thr, st = self.predict_unchecked(M)
        return thr, st, self.domain.flags(M)

    # ------------------------------------------------------------------ training
    @classmethod
    def distill(cls, teacher_thr, teacher_starve, M: np.ndarray, n_synthetic: int = 0,
                n_trees: int = 120, depth: int = 6, learning_rate: float = 0.2,
                seed: int = 0) -> "FastModel":
        """Fit the student forests on the teachers' raw outputs at rows ``M`` (+ synthetic)."""
        from .models import design_matrix
        M = validate(M)
        if n_synthetic > 0:
            M = np.vstack([M, synthetic_merges(M, n_synthetic, teacher_thr.domain_, seed)])
        D, kvt = design_matrix(M, teacher_thr.kv_)
        ok = kvt > 0
        t_thr = teacher_thr.forest_.predict(D[ok])
        t_log = np.clip(teacher_starve.forest_.predict(D[ok]), -12.0, 12.0)
        f1 = fit_oblivious(D[ok], t_thr, n_trees, depth, learning_rate)
        f2 = fit_oblivious(D[ok], t_log, n_trees, depth, learning_rate)
        info = {"n_trees": n_trees, "depth": depth, "learning_rate": learning_rate,
                "n_rows": int(ok.sum()), "n_synthetic": int(n_synthetic), "seed": seed}
        return cls(f1, f2, teacher_thr.kv_, teacher_thr.domain_, info)

    # ------------------------------------------------------------------ persistence
    def save(self, stem: str | Path) -> None:
        stem = Path(stem)
        meta = {"format_version": FORMAT_VERSION, "kind": "fast", "features": list(FEATURES),
                "kv_capacity": self.kv.to_json(), "domain": self.domain.to_json(),
                "info": self.info}
        stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        np.savez_compressed(stem.with_suffix(".npz"), **self.thr_forest.to_arrays("thr_"),
                            **self.starve_forest.to_arrays("starve_"))

    @classmethod
    def load(cls, stem: str | Path) -> "FastModel":
        stem = Path(stem)
        jpath, npath = stem.with_suffix(".json"), stem.with_suffix(".npz")
        meta = read_json(jpath)
        if meta.get("kind") != "fast" or meta.get("features") != list(FEATURES):
            raise ModelFileError(f"model file {jpath}: not a fast model for this code's FEATURES")
        with open_npz(npath) as z, file_context(npath):
            a = ObliviousForest.from_arrays(z, "thr_")
            b = ObliviousForest.from_arrays(z, "starve_")
            for f in (a, b):
                require(f.feat.ndim == 2 and f.thr.shape == f.feat.shape
                        and f.leaf.shape == (f.feat.shape[0], 2 ** f.feat.shape[1])
                        and f.feat.size > 0 and f.feat.min() >= 0
                        and f.feat.max() < N_DESIGN, npath,
                        "tree arrays of inconsistent shapes or feature indices")
        with file_context(jpath):
            return cls(a, b, KvTable.from_json(field(meta, "kv_capacity", jpath)),
                       Domain.from_json(field(meta, "domain", jpath)), meta.get("info"))


def synthetic_merges(M: np.ndarray, n: int, domain: Domain, seed: int = 0) -> np.ndarray:
    """GPUs made by merging two rows' adapter sets (additive features add, max rank is the max,
    Amax taken from either row); rows outside ``domain`` are dropped."""
    rng = np.random.default_rng(seed)
    i = rng.integers(len(M), size=n)
    j = rng.integers(len(M), size=n)
    from .features import N_ADDITIVE
    S = M[i].copy()
    S[:, :N_ADDITIVE] += M[j, :N_ADDITIVE]
    S[:, _I_MR] = np.maximum(M[i, _I_MR], M[j, _I_MR])
    pick = rng.random(n) < 0.5
    S[:, _I_A] = np.where(pick, M[i, _I_A], M[j, _I_A])
    return S[~domain.flags(S)]
