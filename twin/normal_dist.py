"""Standard normal CDF and its inverse compiled with numba, for the length model's Gaussian copula.

Why not ``scipy.special.ndtr`` / ``ndtri``: importing ``scipy.special`` costs about 0.14 s, a
seventh of a light ``twin run``'s whole start-up, and the copula is used on every run. ``ndtr``
is ``erfc`` from the C library (as in SciPy); ``ndtri`` refines a closed-form start with Halley
steps on that ``ndtr`` and agrees with SciPy to about 1e-15 relative (``tests/test_normal_dist.py``
compares them). Plain-Python references: :func:`ndtr_py`, :func:`ndtri_py`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def ndtr_py(x: float) -> float:
    """P(Z <= x) for a standard normal Z."""
    return 0.5 * math.erfc(-x * _SQRT1_2)


def ndtri_py(p: float) -> float:
    """The x with P(Z <= x) = p; -inf at 0, +inf at 1, nan outside [0, 1]."""
    if not 0.0 <= p <= 1.0:
        return math.nan
    if p == 0.0:
        return -math.inf
    if p == 1.0:
        return math.inf
    lower = p <= 0.5
    q = p if lower else 1.0 - p            # the tail probability, <= 0.5
    # Abramowitz & Stegun 26.2.23 (|error| < 4.5e-4) as the start ...
    t = math.sqrt(-2.0 * math.log(q))
    z = -(t - (2.515517 + 0.802853 * t + 0.010328 * t * t)
          / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t))
    # ... then Halley steps on the lower tail, where ndtr has full relative precision.
    for _ in range(4):
        dens = _INV_SQRT_2PI * math.exp(-0.5 * z * z)
        if dens == 0.0:
            break
        r = (0.5 * math.erfc(-z * _SQRT1_2) - q) / dens
        step = r / (1.0 + 0.5 * z * r)
        z -= step
        if abs(step) <= 1e-16 * max(1.0, abs(z)):
            break
    return z if lower else -z


_ndtr_scalar = numba.njit(cache=True)(ndtr_py)
_ndtri_scalar = numba.njit(cache=True)(ndtri_py)


@numba.njit(cache=True)
def _ndtr_flat(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = _ndtr_scalar(x[i])
    return out


@numba.njit(cache=True)
def _ndtri_flat(p: np.ndarray) -> np.ndarray:
    out = np.empty_like(p)
    for i in range(p.size):
        out[i] = _ndtri_scalar(p[i])
    return out


def _elementwise(flat, x):
    """``flat`` (a compiled 1-D loop) over any array or scalar: same shape out, float for a
    scalar."""
    a = np.asarray(x, dtype=np.float64)
    out = flat(np.ascontiguousarray(a).ravel()).reshape(a.shape)
    return out if out.ndim else float(out)


def ndtr(x):
    """P(Z <= x) for a standard normal Z, elementwise (array in, array of the same shape out)."""
    return _elementwise(_ndtr_flat, x)


def ndtri(p):
    """The x with P(Z <= x) = p, elementwise; -inf at 0, +inf at 1, nan outside [0, 1]."""
    return _elementwise(_ndtri_flat, p)
