"""Standard normal CDF and its inverse as compiled ufuncs, for the length model's Gaussian copula.

Why not ``scipy.special.ndtr`` / ``ndtri``: importing ``scipy.special`` costs about 0.14 s, a
seventh of a light ``twin run``'s whole start-up, and the copula is used on every run. ``ndtr``
is ``erfc`` from the C library (as in SciPy); ``ndtri`` refines a closed-form start with Halley
steps on that ``ndtr`` and agrees with SciPy to about 1e-15 relative (``tests/test_normal_dist.py``
compares them). Plain-Python references: :func:`ndtr_py`, :func:`ndtri_py`.
"""

from __future__ import annotations

import math

import numba

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


ndtr = numba.vectorize(["float64(float64)"], cache=True)(ndtr_py)
ndtr.__doc__ = ndtr_py.__doc__
ndtri = numba.vectorize(["float64(float64)"], cache=True)(ndtri_py)
ndtri.__doc__ = ndtri_py.__doc__
