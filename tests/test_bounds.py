"""Lower bounds (capacity L1, count, Martello–Toth L2, LP relaxation) never exceed a proven
optimum."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from optim.exact.bounds import lower_bounds, martello_toth_l2
from optim.exact.brute import brute_force
from optim.exact.cpsat import solve_cpsat
from tests.exact_helpers import bin_packing, random_problem


def test_l2_examples():
    assert martello_toth_l2([51, 52, 60, 70, 55], 100) == 5        # L1 = 3
    assert martello_toth_l2([49, 41, 34, 33, 29, 26, 26, 22, 20, 19], 100) == 3
    assert martello_toth_l2([], 100) == 0


@given(st.lists(st.integers(1, 100), min_size=1, max_size=7))
@settings(max_examples=40, deadline=None, derandomize=True)
def test_bin_packing_bounds_below_optimum(weights):
    P = bin_packing(weights, 100, len(weights))
    opt = brute_force(P)[0]
    b = lower_bounds(P, lp=True)
    assert b.l1 <= b.l2 <= opt
    assert b.lp is not None and b.lp <= opt + 1e-6
    assert b.best <= opt


@pytest.mark.parametrize("seed", range(10))
def test_bounds_below_proven_optimum(seed):
    for objective in ("gpus", "cost"):
        P = random_problem(seed, objective)
        r = solve_cpsat(P, time_limit_s=20, threads=1)
        b = lower_bounds(P)
        if r.status == "optimal":
            assert b.best <= r.objective + 1e-6
            if objective == "gpus":
                assert max(b.l1, b.l2, b.count) <= r.objective
