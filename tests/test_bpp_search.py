"""The packing search into a target bin count (optim.exact.bpp_search): valid packings, the best
swap against a plain-Python scan, the two-bin split against brute force, and the exact methods
proving u120_19 by it."""

from __future__ import annotations


import itertools
import math
import time

import numpy as np
import pytest

from optim.exact import bpp_search as B
from optim.exact.classical import read_bin_packing
from tests.exact_helpers import BPP_DIR


def _valid(bins, weights, capacity):
    items = sorted(i for b in bins for i in b)
    assert items == list(range(len(weights))), "every item exactly once"
    assert all(sum(weights[i] for i in b) <= capacity for b in bins)


def test_packs_u120_19_into_its_lower_bound():
    """49 bins = ceil(total / capacity): a proof of optimality with the packing (the exact
    models alone hit their 20 s limit here)."""
    bp = read_bin_packing(BPP_DIR / "Falkenauer_u120_19.txt")[0]
    w, c = list(bp.weights), bp.capacity
    target = -(-sum(w) // c)
    assert len(B.first_fit_decreasing(w, c)) == target + 1
    # a step budget, not a clock: the same result on a busy machine and on a cold numba cache
    bins = B.pack_into(w, c, target, math.inf, seed=1, max_iters=200_000)
    assert bins is not None and len(bins) <= target
    assert B.pack_into(w, c, target, math.inf, seed=1, max_iters=200_000) == bins
    assert B.pack_into(w, c, target, math.inf, seed=1, max_iters=100) is None   # budget kept
    _valid(bins, w, c)


def test_same_seed_same_packing_and_none_below_the_bound():
    bp = read_bin_packing(BPP_DIR / "Falkenauer_u120_08.txt")[0]
    w, c = list(bp.weights), bp.capacity
    target = -(-sum(w) // c)
    a = B.pack_into(w, c, target, math.inf, seed=3, max_iters=200_000)
    b = B.pack_into(w, c, target, math.inf, seed=3, max_iters=200_000)
    assert a == b and a is not None
    # below ceil(total / capacity) nothing exists: it says so by returning None
    assert B.pack_into(w, c, target - 1, time.perf_counter() + 0.5) is None


def test_two_bin_split_agrees_with_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        w = [int(x) for x in rng.integers(1, 60, n)]
        cap = int(rng.integers(30, 120))
        items = list(range(n))
        brute = any(sum(w[i] for i in items if (m >> i) & 1) <= cap
                    and sum(w[i] for i in items if not (m >> i) & 1) <= cap
                    for m in range(1 << n))
        got = B.two_bin_split(w, items, cap)
        assert (got is not None) == brute
        arr = np.array(w, np.int64)
        assert B.splits_in_two(arr, np.arange(n), n, cap, sum(w)) == brute
        if got is not None:
            first, rest = got
            assert sorted(first + rest) == items
            assert sum(w[i] for i in first) <= cap and sum(w[i] for i in rest) <= cap


def _best_swaps_py(w, cap, K, bin_items, bin_cnt, load, s_items, s_cnt, tabu_until, it,
                   s_weight, best_s):
    """Plain-Python scan: the best score and every swap reaching it (as in ``best_swap``)."""
    best, moves = None, []
    for b in range(K):
        cnt = int(bin_cnt[b])
        outs = [()] + [(p,) for p in range(cnt)] + list(itertools.combinations(range(cnt), 2))
        ins = [(q,) for q in range(s_cnt)] + list(itertools.combinations(range(s_cnt), 2))
        for p in outs:
            for q in ins:
                pi = [int(bin_items[b, x]) for x in p]
                qi = [int(s_items[x]) for x in q]
                wp, wq = sum(w[i] for i in pi), sum(w[j] for j in qi)
                if load[b] - wp + wq > cap:
                    continue
                gain = wq - wp
                if gain == 0 and (len(p) <= 1 and len(q) == 1 or not p):
                    continue
                tabu = any(tabu_until[i] > it for i in pi + qi)
                if tabu and s_weight - gain >= best_s:
                    continue
                score = gain * 8 + (len(p) - len(q) + 2)
                key = (b, p + (-1,) * (2 - len(p)), q + (-1,) * (2 - len(q)))
                if best is None or score > best:
                    best, moves = score, [key]
                elif score == best:
                    moves.append(key)
    return best, moves


@pytest.mark.parametrize("seed", range(30))
def test_best_swap_is_a_best_move_of_the_plain_scan(seed):
    rng = np.random.default_rng(seed)
    n, cap, K = 24, 100, 5
    w = rng.integers(5, 60, n).astype(np.int64)
    order = rng.permutation(n)
    bin_items = np.full((K, n), -1, np.int64)
    bin_cnt = np.zeros(K, np.int64)
    load = np.zeros(K, np.int64)
    s = []
    for i in order:                          # first fit into K bins, the rest unpacked
        for b in range(K):
            if load[b] + w[i] <= cap:
                bin_items[b, bin_cnt[b]] = i
                bin_cnt[b] += 1
                load[b] += w[i]
                break
        else:
            s.append(int(i))
    s_items = np.array(s + [-1] * (n - len(s)), np.int64)
    tabu_until = rng.integers(0, 8, n).astype(np.int64)
    s_weight = int(w[s].sum())
    best_s = s_weight - int(rng.integers(0, 20))
    rng_state = np.array([seed + 1], np.int64)
    gain, b, pa, pb, qa, qb = B.best_swap(w, cap, K, bin_items, bin_cnt, load, s_items,
                                          len(s), tabu_until, 4, s_weight, best_s, rng_state)
    score, moves = _best_swaps_py(w, cap, K, bin_items, bin_cnt, load, s_items, len(s),
                                  tabu_until, 4, s_weight, best_s)
    if score is None:
        assert b == -1
        return
    assert (int(b), (int(pa), int(pb)), (int(qa), int(qb))) in moves
