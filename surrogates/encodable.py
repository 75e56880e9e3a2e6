"""Capacity model that MILP / CP-SAT models can encode exactly (DESIGN.md section 5).

For every (max-rank class ``r``, Amax ``A`` from ``AMAX_GRID``) and every interval
``[x_lo, x_hi)`` of one additive feature ``x`` (default ``n``, the adapter count), a **piece**
states

* ``cap_load`` — the GPU is feasible (no starvation, no memory error) iff its offered load
  ``sum_i load_i`` is ``<= cap_load`` (``cap_load = 0`` for a memory error or a piece without
  training data: never feasible);
* ``ratio`` — predicted throughput = ``ratio * load`` when feasible (linear);
* ``sat_tps`` — predicted throughput when infeasible (the piece's saturated throughput), capped
  at the load: ``min(load, sat_tps)``.

In a MILP, with one binary ``z[g,r,A,k]`` per GPU selecting its piece (``sum z = 1``;
``max_rank_g`` via the rank binaries, ``x_g`` in ``[x_lo, x_hi)`` via big-M), feasibility is the
linear constraint ``sum_i load_i x_ig <= sum_{r,A,k} cap_load[r,A,k] * z[g,r,A,k]``.
``pieces()`` lists them all; ``predict_feasible`` and ``predict`` evaluate exactly those pieces
(the tests check this), and ``lookup`` returns the piece of each row.

Thresholds are fitted per piece by maximising accuracy on the training rows (ties go to the
smaller, conservative cap). A piece without a starving row above its cap is *censored*: its cap
is only the largest load the data happened to try (the scenario generator rarely offers one or two adapters
a heavy load), a lower bound of the true cap. With ``monotone=True`` (more adapters at the same
load never makes a GPU easier to serve in the twin data) the caps are then made non-increasing
in ``x`` within each (r, A): a running minimum over the uncensored pieces (removes noise), and a
censored piece is raised to the cap of the piece after it, which the monotonicity guarantees
(fewer adapters at the same load are never harder) — without this, one under-covered piece at
``n = 1`` capped every larger count at its own small value. A query whose Amax is not on the grid, whose x lies outside the
breakpoints, or whose piece has no training data is out of domain: ``predict_feasible`` raises
ValueError, ``predict_with_flags`` flags it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .dataset import AMAX_GRID
from .domain import validate
from .features import ADDITIVE, FEATURES, IDX, RANK_CLASSES
from .memory import KvTable
from .model_files import ModelFileError, file_context, read_json

DEFAULT_BREAKS = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 513)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Piece:
    """One cell of the capacity model (see the module docstring)."""

    max_rank: int
    amax: int
    x_feature: str
    x_lo: float
    x_hi: float
    cap_load: float
    ratio: float
    sat_tps: float
    memory_error: bool
    n_rows: int

    def contains(self, max_rank: int, amax: int, x: float) -> bool:
        return self.max_rank == max_rank and self.amax == amax and self.x_lo <= x < self.x_hi


def _best_threshold(load: np.ndarray, feasible: np.ndarray) -> float:
    """Cap maximising accuracy of ``load <= cap``; ties -> the smallest such cap."""
    order = np.argsort(load, kind="stable")
    ls, fs = load[order], feasible[order].astype(np.int64)
    # candidate caps: 0 (nothing feasible) or each load value (rows up to it feasible)
    n_inf_total = int((1 - fs).sum())
    # accuracy with cap = ls[j]: feasible among first j+1 + infeasible among rest
    feas_cum = np.cumsum(fs)
    inf_cum = np.cumsum(1 - fs)
    acc = feas_cum + (n_inf_total - inf_cum)
    best_j = int(np.argmax(acc))
    if acc[best_j] <= n_inf_total:        # cap 0 is at least as good
        return 0.0
    # place the cap midway to the next load (reduces bias), never past the next infeasible row
    j = best_j
    # extend over equal accuracy? keep smallest (conservative); midpoint to next row
    if j + 1 < len(ls):
        return float(0.5 * (ls[j] + ls[j + 1]))
    return float(ls[j])


def _monotone_caps(caps: list[tuple], min_rows: int) -> list[tuple]:
    """Caps (cap, ratio, sat, n_rows, censored) per x-piece made non-increasing in x (module
    docstring): a running minimum over uncensored pieces with data, then, from the largest x
    down, a censored piece raised to the next piece's cap (never above the running minimum)."""
    out = list(caps)
    run = np.inf
    bound = []
    for k, (cap, ratio, sat, nr, cens) in enumerate(out):
        has = nr >= min_rows
        if has:
            out[k] = (min(cap, run), ratio, sat, nr, cens)
            if not cens:
                run = min(run, cap)
        bound.append(run)
    nxt = None
    for k in range(len(out) - 1, -1, -1):
        cap, ratio, sat, nr, cens = out[k]
        if nr < min_rows:
            continue
        if cens and nxt is not None and nxt > cap:
            cap = min(nxt, bound[k])
            out[k] = (cap, ratio, sat, nr, cens)
        nxt = cap
    return out


class CapacityModel:
    """Piecewise-constant load cap per (max rank, Amax, x-interval); see module docstring."""

    def __init__(self, kv_capacity=None, x_feature: str = "n", breaks=DEFAULT_BREAKS,
                 amax_grid=AMAX_GRID, min_rows: int = 3, monotone: bool = True):
        self.kv_capacity = kv_capacity
        self.x_feature = x_feature
        self.breaks = tuple(breaks)
        self.amax_grid = tuple(amax_grid)
        self.min_rows = min_rows
        self.monotone = monotone

    def get_params(self, deep: bool = True) -> dict:
        return {"kv_capacity": self.kv_capacity, "x_feature": self.x_feature,
                "breaks": self.breaks, "amax_grid": self.amax_grid, "min_rows": self.min_rows,
                "monotone": self.monotone}

    def _check_params(self) -> None:
        if self.x_feature not in ADDITIVE:
            raise ValueError(f"x_feature: must be an additive feature {ADDITIVE}, got "
                             f"{self.x_feature!r}")
        b = np.asarray(self.breaks, float)
        if len(b) < 2 or np.any(np.diff(b) <= 0):
            raise ValueError("breaks: must be strictly increasing with >= 2 values")

    # ------------------------------------------------------------------ fit
    def fit(self, X, starved, throughput):
        self._check_params()
        M = validate(X)
        starved = np.asarray(starved).astype(bool)
        thr = np.asarray(throughput, float)
        if starved.shape != (len(M),) or thr.shape != (len(M),):
            raise ValueError("starved / throughput: one value per row is required")
        self.kv_ = KvTable.from_json(dict(self.kv_capacity)) if not isinstance(
            self.kv_capacity, KvTable) else self.kv_capacity
        kvt = self.kv_.tokens_array(M[:, IDX["amax"]], M[:, IDX["max_rank"]])
        feasible = (~starved) & (kvt > 0)
        x = M[:, IDX[self.x_feature]]
        load = M[:, IDX["load"]]
        ratio_all = thr / load
        b = np.asarray(self.breaks, float)
        kidx = np.searchsorted(b, x, side="right") - 1
        pieces: list[Piece] = []
        for r in RANK_CLASSES:
            for A in self.amax_grid:
                mem_err = self.kv_.tokens(A, r) <= 0
                caps = []
                for k in range(len(b) - 1):
                    sel = ((M[:, IDX["max_rank"]] == r) & (M[:, IDX["amax"]] == A) & (kidx == k))
                    nr = int(sel.sum())
                    if mem_err or nr < self.min_rows:
                        caps.append((0.0, 1.0, 0.0, nr, False))
                        continue
                    cap = _best_threshold(load[sel], feasible[sel])
                    f = sel & feasible
                    ratio = float(np.median(ratio_all[f])) if f.any() else 1.0
                    inf = sel & ~feasible
                    sat = float(np.median(thr[inf])) if inf.any() else float(load[sel].max())
                    censored = not (inf & (load > cap)).any()
                    caps.append((cap, ratio, sat, nr, censored))
                if self.monotone and not mem_err:
                    caps = _monotone_caps(caps, self.min_rows)
                for k, (cap, ratio, sat, nr, _) in enumerate(caps):
                    pieces.append(Piece(int(r), int(A), self.x_feature, float(b[k]),
                                        float(b[k + 1]), float(cap), float(ratio), float(sat),
                                        bool(mem_err), nr))
        self.pieces_ = pieces
        self._index()
        return self

    def _index(self) -> None:
        b = np.asarray(self.breaks, float)
        nk = len(b) - 1
        self._cap = np.zeros((len(RANK_CLASSES), len(self.amax_grid), nk))
        self._ratio = np.ones_like(self._cap)
        self._sat = np.zeros_like(self._cap)
        self._rows = np.zeros_like(self._cap, dtype=np.int64)
        self._mem = np.zeros_like(self._cap, dtype=bool)
        for p in self.pieces_:
            i = RANK_CLASSES.index(p.max_rank)
            j = self.amax_grid.index(p.amax)
            k = int(np.searchsorted(b, p.x_lo))
            self._cap[i, j, k] = p.cap_load
            self._ratio[i, j, k] = p.ratio
            self._sat[i, j, k] = p.sat_tps
            self._rows[i, j, k] = p.n_rows
            self._mem[i, j, k] = p.memory_error

    # ------------------------------------------------------------------ interface
    def pieces(self) -> list[Piece]:
        """Every piece (max_rank x amax x x-interval), in a fixed order."""
        if not hasattr(self, "pieces_"):
            raise ValueError("CapacityModel: not fitted")
        return list(self.pieces_)

    def as_arrays(self) -> dict:
        """The pieces as dense arrays for solver code: ``cap[r, a, k]`` (load cap of rank class
        ``ranks[r]``, Amax ``amax_grid[a]``, x in ``[breaks[k], breaks[k+1])``), ``ratio``,
        ``sat_tps``, ``usable`` (has training data and no memory error; unusable pieces must not
        be chosen), ``memory_error``."""
        if not hasattr(self, "pieces_"):
            raise ValueError("CapacityModel: not fitted")
        return {"x_feature": self.x_feature, "breaks": np.asarray(self.breaks, float),
                "ranks": np.asarray(RANK_CLASSES), "amax_grid": np.asarray(self.amax_grid),
                "cap": self._cap.copy(), "ratio": self._ratio.copy(), "sat_tps": self._sat.copy(),
                "usable": (self._rows >= self.min_rows) & ~self._mem,
                "memory_error": self._mem.copy()}

    def lookup(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(piece index into ``pieces()`` or -1, out-of-domain mask) of each row."""
        if not hasattr(self, "pieces_"):
            raise ValueError("CapacityModel: not fitted")
        M = validate(X)
        b = np.asarray(self.breaks, float)
        nk = len(b) - 1
        x = M[:, IDX[self.x_feature]]
        k = np.searchsorted(b, x, side="right") - 1
        i = np.searchsorted(RANK_CLASSES, M[:, IDX["max_rank"]])
        grid = np.asarray(self.amax_grid)
        j = np.searchsorted(grid, M[:, IDX["amax"]])
        jj = np.minimum(j, len(grid) - 1)
        on_grid = (j < len(grid)) & (grid[jj] == M[:, IDX["amax"]])
        in_x = (k >= 0) & (k < nk)
        ok = on_grid & in_x
        idx = np.where(ok, (i * len(grid) + jj) * nk + np.clip(k, 0, nk - 1), -1)
        rows = np.where(ok, self._rows.ravel()[np.maximum(idx, 0)], 0)
        mem = np.where(ok, self._mem.ravel()[np.maximum(idx, 0)], False)
        ood = ~ok | ((rows < self.min_rows) & ~mem)
        return idx, ood

    def _explain_ood(self, M: np.ndarray, idx: np.ndarray, ood: np.ndarray) -> str:
        r = int(np.argmax(ood))
        row = M[r]
        if row[IDX["amax"]] not in self.amax_grid:
            return f"amax={row[IDX['amax']]:g} (row {r}) is not on the grid {self.amax_grid}"
        x = row[IDX[self.x_feature]]
        if not self.breaks[0] <= x < self.breaks[-1]:
            return (f"{self.x_feature}={x:g} (row {r}) is outside [{self.breaks[0]}, "
                    f"{self.breaks[-1]})")
        return (f"{self.x_feature}={x:g} with max_rank={row[IDX['max_rank']]:g}, "
                f"amax={row[IDX['amax']]:g} (row {r}) falls in a piece without training data")

    def _eval(self, X):
        M = validate(X)
        idx, ood = self.lookup(M)
        flat_cap = self._cap.ravel()
        safe = np.maximum(idx, 0)
        load = M[:, IDX["load"]]
        cap = np.where(idx >= 0, flat_cap[safe], 0.0)
        feas = (load <= cap) & (idx >= 0)
        thr = np.where(feas, self._ratio.ravel()[safe] * load,
                       np.minimum(load, self._sat.ravel()[safe]))
        mem = np.where(idx >= 0, self._mem.ravel()[safe], False)
        thr = np.where(mem, 0.0, thr)
        return M, feas, thr, idx, ood

    def predict_feasible(self, X) -> np.ndarray:
        """True where the GPU is predicted feasible; ValueError when out of domain."""
        M, feas, _, idx, ood = self._eval(X)
        if ood.any():
            raise ValueError("features: " + self._explain_ood(M, idx, ood))
        return feas

    def predict(self, X) -> np.ndarray:
        """Predicted throughput (tok/s); ValueError when out of domain."""
        M, _, thr, idx, ood = self._eval(X)
        if ood.any():
            raise ValueError("features: " + self._explain_ood(M, idx, ood))
        return thr

    def predict_with_flags(self, X):
        """(throughput, feasible, out_of_domain) without raising for out-of-domain rows."""
        _, feas, thr, _, ood = self._eval(X)
        return thr, feas, ood

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        d = {"format_version": FORMAT_VERSION, "kind": "capacity",
             "x_feature": self.x_feature, "breaks": list(self.breaks),
             "amax_grid": list(self.amax_grid), "min_rows": self.min_rows,
             "monotone": self.monotone, "kv_capacity": self.kv_.to_json(),
             "features": list(FEATURES),
             "pieces": [asdict(p) for p in self.pieces_]}
        Path(path).write_text(json.dumps(d, indent=0) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CapacityModel":
        d = read_json(path)
        if d.get("kind") != "capacity":
            raise ModelFileError(f"model file {path}: kind is {d.get('kind')!r}, expected "
                                 "'capacity'")
        with file_context(path):
            m = cls(kv_capacity=d["kv_capacity"], x_feature=d["x_feature"], breaks=d["breaks"],
                    amax_grid=d["amax_grid"], min_rows=d["min_rows"], monotone=d["monotone"])
            m.kv_ = KvTable.from_json(d["kv_capacity"])
            m.pieces_ = [Piece(**p) for p in d["pieces"]]
            m._index()
        return m
