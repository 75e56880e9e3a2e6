"""Exact means of clipped request lengths, from probability mass functions.

A length model's ``mean_input`` / ``mean_output`` must equal the expected value of what it
samples, rounding and the benchmark's clipping included (``twin.lengths``); these functions
compute them from the PMFs of the rounded values, and ``_solve_scale`` finds the scale that
makes a mean hit a target (used by ``EmpiricalLengths.scaled_to``).
"""

from __future__ import annotations

import math

import numpy as np
from .normal_dist import ndtr, ndtri



def _input_pmf_clipped(support: np.ndarray, pmf: np.ndarray, lo: int, hi: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Push the mass of an integer PMF outside [lo, hi] onto the bounds; returns (support, pmf)."""
    vals = np.clip(support, lo, hi if hi is not None else np.inf)
    uniq, inv = np.unique(vals, return_inverse=True)
    p = np.bincount(inv, weights=pmf, minlength=len(uniq))
    return uniq.astype(np.float64), p


def _mean_min(support: np.ndarray, pmf: np.ndarray, h: np.ndarray) -> np.ndarray:
    """E[min(O, h)] for each h, where O has sorted integer ``support`` with probabilities ``pmf``."""
    cum_p = np.concatenate(([0.0], np.cumsum(pmf)))
    cum_vp = np.concatenate(([0.0], np.cumsum(pmf * support)))
    k = np.searchsorted(support, h, side="left")  # support[:k] < h
    total = cum_p[-1]
    return cum_vp[k] + h * (total - cum_p[k])


def _exact_means(
    in_support: np.ndarray,
    in_pmf: np.ndarray,
    out_support: np.ndarray,
    out_pmf: np.ndarray,
    min_len: int,
    max_input: int | None,
    max_total: int | None,
) -> tuple[float, float]:
    """Exact means of the clipped (input, output) pair for independent integer PMFs."""
    hi_in = max_input if max_input is not None else (max_total - min_len if max_total is not None else None)
    si, pi = _input_pmf_clipped(in_support, in_pmf, min_len, hi_in)
    so, po = _input_pmf_clipped(out_support, out_pmf, min_len, None)
    mean_in = float(np.dot(si, pi) / pi.sum())
    if max_total is None:
        mean_out = float(np.dot(so, po) / po.sum())
    else:
        mean_out = float(np.dot(pi, _mean_min(so, po, max_total - si)) / (pi.sum() * po.sum()))
    # a mean lies within the values it averages; summation rounding can push it out by an ulp
    mean_in = min(max(mean_in, float(si[0])), float(si[-1]))
    out_lo, out_hi = float(so[0]), float(so[-1])
    if max_total is not None:
        out_lo, out_hi = min(out_lo, max_total - float(si[-1])), min(out_hi, max_total - float(si[0]))
    mean_out = min(max(mean_out, out_lo), out_hi)
    return mean_in, mean_out


def _hist_pmf(edges: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PMF of rint(U), U from the piecewise-uniform histogram density (exact, via the linear CDF)."""
    lo = math.floor(edges[0] - 0.5)
    hi = math.ceil(edges[-1] + 0.5)
    m = np.arange(max(lo, 0), hi + 1, dtype=np.float64)
    cdf_knots = np.concatenate(([0.0], np.cumsum(probs)))
    cdf = np.interp(np.concatenate((m - 0.5, [m[-1] + 0.5])), edges, cdf_knots)
    # mass below 0 (edges >= 0 enforced, so none) / above the last point (none): pmf sums to 1
    return m, np.diff(cdf)


def _copula_cells(p_in: np.ndarray, p_out: np.ndarray, rho: float) -> np.ndarray:
    """Bin-pair probabilities of a Gaussian copula with correlation ``rho``; rows sum to
    ``p_in``, columns to ``p_out``. For input bin i (normal-score interval [a_i, a_i+1]):
    P_ij = int_{a_i}^{a_i+1} phi(z) [Phi((b_j+1 - rho z)/s) - Phi((b_j - rho z)/s)] dz with
    s = sqrt(1 - rho^2), by 64-point Gauss-Legendre quadrature per bin (tails cut at +-9)."""
    a = np.clip(ndtri(np.clip(np.concatenate(([0.0], np.cumsum(p_in))), 0, 1)), -9.0, 9.0)
    b = ndtri(np.clip(np.concatenate(([0.0], np.cumsum(p_out))), 0, 1))
    x, w = np.polynomial.legendre.leggauss(64)
    sd = math.sqrt(1.0 - rho * rho)
    P = np.zeros((len(p_in), len(p_out)))
    for i in range(len(p_in)):
        lo, hi = a[i], a[i + 1]
        if hi <= lo:
            continue
        z = 0.5 * (hi - lo) * x + 0.5 * (hi + lo)
        wz = 0.5 * (hi - lo) * w * np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        cdf = ndtr((b[None, :] - rho * z[:, None]) / sd)          # (64, n_out + 1)
        P[i] = wz @ np.diff(cdf, axis=1)
    P = np.maximum(P, 0.0)
    return P / P.sum()


def _copula_means(in_edges: np.ndarray, out_edges: np.ndarray, cells: np.ndarray, min_len: int,
                  max_input: int | None, max_total: int | None) -> tuple[float, float]:
    """Exact means of the clipped pair when bins are drawn jointly (``cells``) and positions
    within bins independently. Given input bin i, the output is the mixture over output bins j
    with weights ``cells[i, j]``, so E[min(output, max_total - input)] needs one pass per input
    bin over that mixture's PMF (``_mean_min`` is linear in the PMF)."""
    hi_in = max_input if max_input is not None else (
        max_total - min_len if max_total is not None else None)
    ins = [_input_pmf_clipped(*_hist_pmf(in_edges[i:i + 2], np.ones(1)), min_len, hi_in)
           for i in range(len(in_edges) - 1)]
    outs = [_input_pmf_clipped(*_hist_pmf(out_edges[j:j + 2], np.ones(1)), min_len, None)
            for j in range(len(out_edges) - 1)]
    mean_in = sum(cells[i].sum() * float(np.dot(si, pi)) for i, (si, pi) in enumerate(ins))
    if max_total is None:
        out_means = np.array([float(np.dot(so, po)) for so, po in outs])
        return float(mean_in), float(np.einsum("ij,j->", cells, out_means))
    lo = int(min(so[0] for so, _ in outs))
    support = np.arange(lo, int(max(so[-1] for so, _ in outs)) + 1, dtype=np.float64)
    per_bin = np.zeros((len(outs), len(support)))
    for j, (so, po) in enumerate(outs):
        per_bin[j, so.astype(np.int64) - lo] = po
    # row i: output PMF given input bin i (einsum: a small product, no BLAS thread start-up)
    mixture = np.einsum("ij,jk->ik", cells, per_bin)
    mean_out = sum(float(np.dot(pi, _mean_min(support, mixture[i], max_total - si)))
                   for i, (si, pi) in enumerate(ins))
    return float(mean_in), float(mean_out)


_erf = np.frompyfunc(math.erf, 1, 1)


def _normal_rounded_pmf(mu: float, sigma: float, lo: int, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """PMF of clip(rint(X), lo, hi) for X ~ N(mu, sigma^2) (tails lumped onto the bounds)."""
    if sigma == 0.0:
        v = float(np.clip(np.rint(mu), lo, hi))
        return np.array([v]), np.array([1.0])
    if not math.isfinite(hi):
        hi = max(lo, math.ceil(mu + 40.0 * sigma) + 1)
    hi = int(hi)
    m = np.arange(lo, hi + 1, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore"):  # tiny sigma: +-inf, erf handles it
        x = (np.concatenate((m - 0.5, [hi + 0.5])) - mu) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + _erf(x).astype(np.float64))
    pmf = np.diff(cdf)
    pmf[0] += cdf[0]  # everything below lo - 0.5 rounds to <= lo - 1 and is clipped to lo
    pmf[-1] += 1.0 - cdf[-1]
    return m, pmf


def _solve_scale(f, target: float, what: str, lo_bound: float, hi_bound: float) -> float:
    """Find s > 0 with f(s) = target for a non-decreasing f (bisection in log space)."""
    if not (lo_bound < target < hi_bound):
        raise ValueError(f"{what} must be strictly between {lo_bound:g} and {hi_bound:g} for this model, got {target:g}")
    a, b = 1.0, 1.0
    fa = fb = f(1.0)
    for _ in range(200):
        if fa <= target:
            break
        a /= 2.0
        fa = f(a)
    for _ in range(200):
        if fb >= target:
            break
        b *= 2.0
        fb = f(b)
    if not (fa <= target <= fb):
        raise ValueError(f"{what}: cannot reach target mean {target:g} by rescaling (range {fa:g}..{fb:g})")
    for _ in range(200):
        if b / a - 1.0 < 1e-13:
            break
        mid = math.sqrt(a * b)
        fm = f(mid)
        if fm < target:
            a, fa = mid, fm
        else:
            b, fb = mid, fm
    return a if abs(fa - target) <= abs(fb - target) else b
