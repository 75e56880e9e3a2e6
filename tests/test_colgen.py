"""Column generation for classical bin packing (``optim.exact.colgen``): the pricing knapsack
against plain recursion, the exact bound against brute-force optima, and searches that return
checked packings (the slack-restricted exclusion is branch-and-price's, ``tests/test_bpp_proof.py``)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from optim.exact.colgen import colgen_dive, price, price_reference


def _brute_optimum(weights, cap) -> int:
    """Fewest bins by trying every assignment of items to bins (tiny instances only)."""
    n = len(weights)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            if assign and assign[0] != 0:
                break                      # symmetry: item 0 goes into bin 0
            loads = [0] * k
            for i, b in enumerate(assign):
                loads[b] += weights[i]
            if max(loads) <= cap:
                return k
    return n


def test_price_matches_plain_recursion():
    rng = np.random.default_rng(1)
    for _ in range(200):
        m = int(rng.integers(1, 6))
        cap = int(rng.integers(5, 60))
        w = rng.integers(1, cap + 1, m)
        b = rng.integers(0, 5, m)
        v = rng.integers(0, 1000, m)
        z, a = price(w, b, v, cap)
        assert z == price_reference(list(w), list(b), list(v), cap)
        assert (a <= b).all() and (a >= 0).all() and int(a @ w) <= cap and int(a @ v) == z


def test_bound_never_above_the_optimum_on_brute_forced_instances():
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(2, 8))
        cap = int(rng.integers(10, 40))
        w = [int(x) for x in rng.integers(1, cap + 1, n)]
        opt = _brute_optimum(w, cap)
        r = colgen_dive(w, cap, time.perf_counter() + 10)
        assert r.lower_bound <= opt
        if r.bins is not None:
            assert len(r.bins) >= opt


def test_dive_returns_a_checked_packing_into_the_bound():
    # triplets-like: 3 items fill each of 6 bins exactly; first-fit decreasing needs more
    rng = np.random.default_rng(4)
    w = []
    for _ in range(6):
        a = int(rng.integers(250, 400))
        b = int(rng.integers(250, 400))
        w += [a, b, 1000 - a - b]
    r = colgen_dive(w, 1000, time.perf_counter() + 20, incumbent=7)
    assert r.lower_bound == 6
    assert r.bins is not None and len(r.bins) == 6
    assert sorted(i for b in r.bins for i in b) == list(range(len(w)))
    assert all(sum(w[i] for i in b) <= 1000 for b in r.bins)


def test_dive_skipped_when_the_incumbent_meets_the_bound():
    w = [600, 600, 400, 400]
    r = colgen_dive(w, 1000, time.perf_counter() + 10, incumbent=2)
    assert r.lower_bound == 2 and r.bins is None and r.nodes == 0


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="1..capacity"):
        colgen_dive([5, 20], 10, time.perf_counter() + 1)


def test_the_search_proves_a_waescher_instance_above_its_lp_bound():
    """Wäscher's TEST0065 (60 items, capacity 10000): ceil(LP) = 15 bins, optimum 16;
    branch-and-price shows 15 infeasible and the bound rises to 16."""
    from optim.exact.classical import read_bin_packing
    from tests.exact_helpers import BPP_DIR
    bp = read_bin_packing(BPP_DIR / "Waescher" / "Waescher_TEST0065.txt")[0]
    r = colgen_dive(list(bp.weights), bp.capacity, time.perf_counter() + 60, incumbent=16)
    assert r.lower_bound == 16
