"""The compiled normal CDF / inverse used by the length copula agree with SciPy's."""

import numpy as np
import pytest
from scipy.special import ndtr as scipy_ndtr, ndtri as scipy_ndtri

from twin.normal_dist import ndtr, ndtr_py, ndtri, ndtri_py

P = np.concatenate([np.logspace(-300, -1, 2000), np.linspace(1e-3, 1 - 1e-3, 20001),
                    1.0 - np.logspace(-16, -1, 1000)])


def test_ndtri_matches_scipy():
    got, want = ndtri(P), scipy_ndtri(P)
    assert np.max(np.abs(got - want)) < 1e-13
    away = np.abs(want) > 1e-3
    assert np.max(np.abs(got - want)[away] / np.abs(want[away])) < 1e-12


def test_ndtr_matches_scipy():
    x = np.linspace(-30.0, 9.0, 20001)
    want = scipy_ndtr(x)
    assert np.max(np.abs(ndtr(x) - want) / want) < 1e-12


def test_round_trip_and_edges():
    assert np.max(np.abs(ndtr(ndtri(P[2000:-1000])) - P[2000:-1000])) < 1e-15
    assert ndtri(0.0) == -np.inf and ndtri(1.0) == np.inf
    assert np.isnan(ndtri(-0.1)) and np.isnan(ndtri(1.1)) and np.isnan(ndtri(np.nan))


@pytest.mark.parametrize("p", [1e-200, 1e-5, 0.3, 0.5, 0.77, 1 - 1e-9])
def test_reference_equals_compiled(p):
    assert ndtri_py(p) == pytest.approx(float(ndtri(p)), rel=1e-15, abs=1e-15)
    assert ndtr_py(ndtri_py(p)) == pytest.approx(float(ndtr(ndtri(p))), rel=1e-15)
