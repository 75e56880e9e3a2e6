"""Step-time model: wall time of one vLLM V1 engine iteration (forward + scheduler + bookkeeping).

The simulation kernel calls :func:`step_time_ms` once per engine step. The formula is a small
fixed linear combination of products of the step's features with non-negative coefficients, so
it is monotone non-decreasing in every argument and costs a few flops::

    tok  = n_prefill_tokens + n_decode_tokens            (tokens in the forward pass)
    lora = 1 if max_loras > 0 else 0
    rr   = max(0, max_rank - 8) / 8                       (server rank above the windows' 8)
    m    = 1 + c[10] * rr                                 (rank multiplier of the LoRA terms)
    T_ms = c[0] + c[1]*tok + c[2]*n_seqs + c[11]*max(0, n_seqs - c[12]) + c[3]*ctx_tokens/1000
         + lora * ( m * ( c[4] + c[5]*max_loras*rr + c[6]*tok*max_loras/1000
                          + c[7]*n_distinct + c[8]*n_tiles )
                    + c[9]*n_waiting/1000 )

Physics: c1 = per-token MLP/projection cost, c2 = per-request cost (sampling, output
processing, scheduler loop over running requests), c11 = extra per-request cost above a knee of
c12 requests (decode steps are memory-bound up to ~100 requests, then grow faster), c3 = attention over cached context;
the LoRA terms model vLLM 0.8.5's Triton punica kernels, whose grid has one block row per
*slot* (max_loras) and per token tile even for idle slots (c6), plus per active adapter
work (c7) and per *LoRA tile* (c8): the shrink/expand kernels give each adapter's tokens in the
batch their own BLOCK_M = 16-token tiles, so n_tiles = sum over the batch's adapters of
ceil(tokens_k / 16) — one tile per adapter for decode-only steps, many for a long prefill
chunk; c9 = scheduler scan of the waiting queue when the batch already holds
max_loras adapters (the V1 scheduler skips requests of other adapters and keeps scanning).
Adapter CPU->GPU load time is not included (the kernel adds it).

Rank: ``max_rank`` is the *server's* ``--max-lora-rank``, not the batch's or each adapter's
rank. vLLM 0.8.5 allocates every slot's A/B buffers at max_lora_rank (smaller adapters are
zero-padded) and its shrink/expand kernels take that padded size as their rank dimension, so an
adapter's own rank adds no work once it is loaded (it still sets its load time, in the profile's
load table). The data agree: every run with mixed ranks also serves adapters of the server's
max rank, so nothing in them could tell the three apart. The multiplier m scales all LoRA
terms linearly in (max_rank - 8); c10 is fitted by ``twin.calibrate`` (stage 3) on end-to-end
runs at max_lora_rank 16 and 32, because every profiling window is rank 8. With max_rank 8, m is
exactly 1 whatever c10 is.

c5 is a per-slot cost that grows with the padded rank and is zero at rank 8: every slot's
rank-padded buffers are visited whether or not the slot serves a request of the step, and
the rank-16/32 servers of the max-search runs need it at every batch size. The moderately
loaded runs show it most (``twin.slot_fit``: their mean ITL was 10-22 % above the twin's,
growing with slots and rank, before c5 was fitted there); the profiling windows, all at rank
8, cannot see it, which is why it is written to vanish there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

N_STEP_COEF = 13
STEP_COEF_NAMES: tuple[str, ...] = (
    "base_ms",               # c0 fixed cost per step
    "per_token_ms",          # c1 x (prefill + decode tokens)
    "per_seq_ms",            # c2 x scheduled requests
    "per_kctx_ms",           # c3 x ctx_tokens / 1000
    "lora_base_ms",          # c4 LoRA enabled
    "per_slot_rank_ms",      # c5 x max_loras x max(0, max_rank - 8) / 8
    "per_token_kslot_ms",    # c6 x tok * max_loras / 1000
    "per_adapter_ms",        # c7 x n_distinct
    "per_lora_tile_ms",      # c8 x n_tiles (LoRA kernel tiles: sum_k ceil(tokens_k / 16))
    "per_kwaiting_ms",       # c9 x n_waiting / 1000: waiting requests scanned (LoRA only)
    "rank_scale",            # c10 relative LoRA-cost increase per 8 server max ranks above 8
    "per_seq_over_knee_ms",  # c11 x max(0, n_seqs - c12)
    "seq_knee",              # c12 knee of the per-request cost (requests; chosen by grid search)
)
FEATURE_NAMES: tuple[str, ...] = (
    "n_seqs", "n_prefill_tokens", "n_decode_tokens", "ctx_tokens", "n_distinct",
    "max_loras", "max_rank", "n_waiting", "n_tiles",
)
# the 8 columns of the X matrix of StepTimeModel, in the argument order of step_time_ms
X_COLUMNS: tuple[str, ...] = FEATURE_NAMES
N_LINEAR = 11  # c0..c9 and c11 enter linearly; c10 (rank_scale) and c12 (knee) are fixed in a fit
LINEAR_IDX = tuple(range(10)) + (11,)


LORA_TILE = 16           # tokens per LoRA kernel tile (Triton BLOCK_M) for the tile count


@njit(cache=True)
def step_time_ms(coef, n_seqs, n_prefill_tokens, n_decode_tokens, ctx_tokens, n_distinct,
                 max_loras, max_rank, n_waiting, n_tiles):
    """Wall time (ms) of one engine step; see the module docstring for the formula."""
    tok = float(n_prefill_tokens + n_decode_tokens)
    t = (coef[0] + coef[1] * tok + coef[2] * float(n_seqs)
         + coef[3] * float(ctx_tokens) * 1e-3)
    over = float(n_seqs) - coef[12]
    if over > 0.0:
        t += coef[11] * over
    if max_loras > 0:
        a = float(max_loras)
        k = float(n_distinct)
        dr = float(max_rank) - 8.0
        if dr < 0.0:
            dr = 0.0
        m = 1.0 + coef[10] * dr * 0.125
        lo = (coef[4] + coef[5] * a * dr * 0.125 + coef[6] * tok * a * 1e-3
              + coef[7] * k + coef[8] * float(n_tiles))
        t += m * lo + coef[9] * float(n_waiting) * 1e-3
    return t


def min_ms_per_token(step_coef, max_loras: int, max_rank: int, max_batched_tokens: int) -> float:
    """A lower bound on the step time per scheduled token (ms), or 0 when none holds.

    Every step of ``tok >= 1`` tokens (``tok <= max_batched_tokens`` = B, at least one sequence,
    and with LoRA at least one distinct adapter and ``tiles >= tok / LORA_TILE``) lasts, by the
    step-time formula with every coefficient >= 0 and the adapter loads >= 0, at least
    alpha + beta * tok >= tok * (beta + alpha / B), with alpha = c0 + c2 + m (c4 + c5 A + c7)
    and beta = c1 + m (c6 A / 1000 + c8 / LORA_TILE). A negative coefficient voids the bound."""
    c = np.asarray(step_coef, np.float64)
    if (c < 0).any() or max_batched_tokens < 1:
        return 0.0
    alpha, beta = c[0] + c[2], c[1]
    if max_loras > 0:
        rr = max(float(max_rank) - 8.0, 0.0) * 0.125
        m = 1.0 + c[10] * rr
        alpha += m * (c[4] + c[5] * max_loras * rr + c[7])
        beta += m * (c[6] * max_loras * 1e-3 + c[8] / LORA_TILE)
    return float(beta + alpha / max_batched_tokens)


def step_time_ms_py(coef, n_seqs, n_prefill_tokens, n_decode_tokens, ctx_tokens, n_distinct,
                    max_loras, max_rank, n_waiting, n_tiles) -> float:
    """Plain-Python twin of :func:`step_time_ms` (same formula, same result)."""
    tok = float(n_prefill_tokens + n_decode_tokens)
    t = (coef[0] + coef[1] * tok + coef[2] * float(n_seqs)
         + coef[3] * float(ctx_tokens) * 1e-3)
    t += coef[11] * max(float(n_seqs) - coef[12], 0.0)
    if max_loras > 0:
        a = float(max_loras)
        k = float(n_distinct)
        dr = max(float(max_rank) - 8.0, 0.0)
        m = 1.0 + coef[10] * dr * 0.125
        lo = (coef[4] + coef[5] * a * dr * 0.125 + coef[6] * tok * a * 1e-3
              + coef[7] * k + coef[8] * float(n_tiles))
        t += m * lo + coef[9] * float(n_waiting) * 1e-3
    return float(t)


def describe_step_model(coef=None) -> str:
    """Human-readable formula (with values when ``coef`` is given)."""
    txt = (
        "T_ms = c0 + c1*tok + c2*n_seqs + c11*max(0, n_seqs - c12) + c3*ctx/1000\n"
        "     + [max_loras>0] * ( m*(c4 + c5*A*rr + c6*tok*A/1000 + c7*K + c8*tiles)"
        " + c9*W/1000 )\n"
        "  tok = n_prefill_tokens + n_decode_tokens, A = max_loras, K = n_distinct,\n"
        "  W = n_waiting, tiles = sum_k ceil(tokens_k/16) over the batch's adapters,\n"
        "  rr = max(0, max_rank-8)/8, m = 1 + c10*rr; all c >= 0 (monotone)."
    )
    if coef is not None:
        txt += "\n" + "\n".join(f"  c{i:<2d} {n:24s} = {float(v):.6g}"
                                for i, (n, v) in enumerate(zip(STEP_COEF_NAMES, coef)))
    return txt


def design_matrix(X, rank_scale: float = 0.0, seq_knee: float = 128.0) -> np.ndarray:
    """Linear design matrix (n, 11) of coefficients c0..c9, c11 for feature rows X (n, 8).

    X columns are ``FEATURE_NAMES`` (the arguments of step_time_ms after ``coef``).
    ``rank_scale`` (c10) and ``seq_knee`` (c12) are fixed: c10 multiplies the LoRA columns
    c4..c8, c12 is the knee of the c11 column.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
        raise ValueError(f"X must have shape (n, {len(FEATURE_NAMES)}) with columns {FEATURE_NAMES}")
    s, p, d, c, k, a, r, w, tl = (X[:, i] for i in range(9))
    tok = p + d
    lora = (a > 0).astype(np.float64)
    rr = np.maximum(r - 8.0, 0.0) / 8.0
    m = lora * (1.0 + rank_scale * rr)
    return np.column_stack([
        np.ones_like(s), tok, s, c * 1e-3,
        m, m * a * rr, m * tok * a * 1e-3, m * k, m * tl,
        lora * w * 1e-3,
        np.maximum(s - seq_knee, 0.0),
    ])


class StepTimeModel:
    """Scikit-learn-style estimator of the step-time formula (non-negative least squares).

    Parameters
    ----------
    rank_scale : fixed c10 (fitted separately, see twin.calibrate.fit_rank_scale: the profiling
        windows are rank 8 only).
    seq_knee : fixed c12, the knee (requests) of the c11 term.
    relative : weight rows by 1/y so the fit minimises relative (not absolute) error.
    fit_terms : coefficient indices (among 0..9, 11) to fit; the others keep ``fixed_coef``.
    fixed_coef : length-13 coefficient vector supplying the terms that are not fitted.

    ``fit(X, y, sample_weight=None, nuisance=None)``: X has the 8 columns of
    ``FEATURE_NAMES`` (the arguments of step_time_ms after coef; a DataFrame with those names or
    an array in that order). ``nuisance`` (n, q) adds free-sign columns (e.g. per-source
    offsets) that are fitted but not part of the model (``nuisance_coef_``).
    Learned: ``coef_`` (length N_STEP_COEF).
    """

    def __init__(self, rank_scale: float = 0.0, seq_knee: float = 128.0, relative: bool = True,
                 fit_terms: tuple[int, ...] | None = None, fixed_coef=None):
        self.rank_scale = rank_scale
        self.seq_knee = seq_knee
        self.relative = relative
        self.fit_terms = fit_terms
        self.fixed_coef = fixed_coef

    @staticmethod
    def _as_X(X) -> np.ndarray:
        if hasattr(X, "columns"):
            missing = [c for c in FEATURE_NAMES if c not in X.columns]
            if missing:
                raise ValueError(f"X lacks columns {missing}")
            return X[list(FEATURE_NAMES)].to_numpy(dtype=np.float64)
        return np.asarray(X, dtype=np.float64)

    def fit(self, X, y, sample_weight=None, nuisance=None) -> "StepTimeModel":
        from scipy.optimize import lsq_linear

        Xa = self._as_X(X)
        y = np.asarray(y, dtype=np.float64)
        F = design_matrix(Xa, self.rank_scale, self.seq_knee)        # columns = LINEAR_IDX
        full = np.zeros(N_STEP_COEF) if self.fixed_coef is None else np.array(
            self.fixed_coef, dtype=np.float64)
        if full.shape != (N_STEP_COEF,):
            raise ValueError(f"fixed_coef must have length {N_STEP_COEF}")
        terms = list(LINEAR_IDX) if self.fit_terms is None else list(self.fit_terms)
        bad = [t for t in terms if t not in LINEAR_IDX]
        if bad:
            raise ValueError(f"fit_terms {bad} are not linear terms {LINEAR_IDX}")
        col = {c: j for j, c in enumerate(LINEAR_IDX)}
        fit_cols = [col[t] for t in terms]
        fixed_cols = [col[t] for t in LINEAR_IDX if t not in terms]
        fixed_vals = np.array([full[t] for t in LINEAR_IDX if t not in terms])
        target = y - (F[:, fixed_cols] @ fixed_vals if fixed_cols else 0.0)
        w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, float)
        if self.relative:
            w = w / np.maximum(np.abs(y), 1e-9)
        A = F[:, fit_cols]
        nq = 0
        if nuisance is not None:
            N = np.asarray(nuisance, dtype=np.float64).reshape(len(y), -1)
            nq = N.shape[1]
            A = np.column_stack([A, N])
        lb = np.r_[np.zeros(len(terms)), np.full(nq, -np.inf)]
        res = lsq_linear(A * w[:, None], target * w, bounds=(lb, np.inf), method="bvls")
        for t, v in zip(terms, res.x[:len(terms)]):
            full[t] = max(float(v), 0.0)
        full[10] = self.rank_scale
        full[12] = self.seq_knee
        self.coef_ = full
        self.nuisance_coef_ = res.x[len(terms):]
        return self

    def predict(self, X) -> np.ndarray:
        Xa = self._as_X(X)
        F = design_matrix(Xa, float(self.coef_[10]), float(self.coef_[12]))
        return F @ self.coef_[list(LINEAR_IDX)]

    def get_params(self, deep: bool = True) -> dict:
        return {"rank_scale": self.rank_scale, "seq_knee": self.seq_knee,
                "relative": self.relative, "fit_terms": self.fit_terms,
                "fixed_coef": self.fixed_coef}

    def set_params(self, **params) -> "StepTimeModel":
        for k, v in params.items():
            setattr(self, k, v)
        return self


N_DESIGN = 11   # columns of design_matrix: coefficients c0..c9 and c11


@njit(cache=True)
def accumulate_design(out, base, coef, n_seqs, n_prefill_tokens, n_decode_tokens, ctx_tokens,
                      n_distinct, max_loras, max_rank, n_waiting, n_tiles):
    """Add one step's design-matrix row (the columns of :func:`design_matrix`, with c10 and c12
    taken from ``coef``) to ``out[base:base + N_DESIGN]`` (an offset, not a slice: a view made
    every step costs the kernel two atomic reference-count updates). Summed over a run and divided by the step count this is the
    run's mean feature row: the step time is linear in it, which lets calibration fit the
    coefficients to run-level mean step times of simulated runs."""
    tok = float(n_prefill_tokens + n_decode_tokens)
    s = float(n_seqs)
    lora = 1.0 if max_loras > 0 else 0.0
    dr = float(max_rank) - 8.0
    if dr < 0.0:
        dr = 0.0
    m = lora * (1.0 + coef[10] * dr * 0.125)
    a = float(max_loras)
    k = float(n_distinct)
    over = s - coef[12]
    if over < 0.0:
        over = 0.0
    out[base + 0] += 1.0
    out[base + 1] += tok
    out[base + 2] += s
    out[base + 3] += float(ctx_tokens) * 1e-3
    out[base + 4] += m
    out[base + 5] += m * a * dr * 0.125
    out[base + 6] += m * tok * a * 1e-3
    out[base + 7] += m * k
    out[base + 8] += m * float(n_tiles)
    out[base + 9] += lora * float(n_waiting) * 1e-3
    out[base + 10] += over


def accumulate_design_py(out, coef, n_seqs, n_prefill_tokens, n_decode_tokens, ctx_tokens,
                         n_distinct, max_loras, max_rank, n_waiting, n_tiles) -> None:
    """Plain-Python twin of :func:`accumulate_design` (same operations, same result)."""
    tok = float(n_prefill_tokens + n_decode_tokens)
    s = float(n_seqs)
    lora = 1.0 if max_loras > 0 else 0.0
    dr = max(float(max_rank) - 8.0, 0.0)
    m = lora * (1.0 + coef[10] * dr * 0.125)
    a = float(max_loras)
    k = float(n_distinct)
    over = max(s - coef[12], 0.0)
    vals = (1.0, tok, s, float(ctx_tokens) * 1e-3, m, m * a * dr * 0.125, m * tok * a * 1e-3,
            m * k,
            m * float(n_tiles), lora * float(n_waiting) * 1e-3, over)
    for i, v in enumerate(vals):
        out[i] += v
