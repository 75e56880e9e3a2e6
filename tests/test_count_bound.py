"""The adapter-count partition bound under a latency SLO (``optim.count_bound``): the knapsack
against brute force, the caps' soundness rules, and its premises on sampled GPUs in the twin."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from optim.capacity import BOUND_SEEDS
from optim.count_bound import box_loads, caps_by_count, count_limit, partition_bound
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.sharegpt import default_lengths
from twin.slo import Slo
from twin.workload import Adapter

PROFILE = "llama-3.1-8b-instruct"


@given(n=st.integers(1, 12), l=st.floats(1.0, 500.0), frac=st.floats(0.0, 1.0),
       lmin_share=st.floats(0.0, 1.0))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_a_constant_box_majorises_the_equal_split(n, l, frac, lmin_share):
    """With every entry in [l_min, l] the box vector sums to the total, stays in the range,
    and its partial sums (largest first) are at least those of the equal split."""
    l_min = lmin_share * l
    total = n * l_min + frac * n * (l - l_min)
    v = box_loads(total, [l] * n, [l_min] * n)
    assert v is not None and len(v) == n
    assert abs(sum(v) - total) <= 1e-6 * max(1.0, total)
    assert all(l_min - 1e-9 <= x <= l + 1e-9 for x in v)
    eq = np.cumsum([total / n] * n)
    assert np.all(np.cumsum(sorted(v, reverse=True)) >= eq - 1e-6 * max(1.0, total))
    assert box_loads(n * l * 1.01 + 1, [l] * n, [l_min] * n) is None


def _bottom_fill(total, upper, lower):
    """The least concentrated corner: floors, then the entries from the bottom raised."""
    out, rest = list(lower), total - sum(lower)
    for i in reversed(range(len(out))):
        x = min(upper[i] - lower[i], max(rest, 0.0))
        out[i] += x
        rest -= x
    return out


@given(xs=st.lists(st.floats(0.5, 100.0), min_size=2, max_size=14), data=st.data())
@settings(max_examples=200, deadline=None, derandomize=True)
def test_box_loads_majorise_every_subset_of_the_same_size_and_total(xs, data):
    """Any n of the loads, sorted, lie in the box (caps: the n heaviest, floors: the n
    lightest); the box vector with their total majorises them."""
    xs = sorted(xs, reverse=True)
    n = data.draw(st.integers(1, len(xs)))
    pick = data.draw(st.lists(st.integers(0, len(xs) - 1), min_size=n, max_size=n, unique=True))
    sub = sorted((xs[i] for i in pick), reverse=True)
    upper, lower = xs[:n], xs[len(xs) - n:]
    assert all(lo - 1e-9 <= v <= up + 1e-9 for v, up, lo in zip(sub, upper, lower))
    v = box_loads(sum(sub), upper, lower)
    assert v is not None and abs(sum(v) - sum(sub)) < 1e-6 * sum(xs)
    assert np.all(np.cumsum(v) >= np.cumsum(sub) - 1e-6 * sum(xs))
    assert box_loads(sum(upper) * 1.01 + 1, upper, lower) is None


def _brute(load: float, cap: np.ndarray, k_from: int, k_max: int) -> int:
    n_total = len(cap) - 1
    for k in range(k_from, k_max + 1):
        for cut in itertools.combinations(range(1, n_total), k - 1):
            sizes = np.diff((0,) + cut + (n_total,))
            if sum(cap[s] for s in sizes) >= load * (1 - 1e-9):
                return k
    return k_max + 1


@given(caps=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=9),
       frac=st.floats(0.05, 1.0), k_from=st.integers(1, 4))
@settings(max_examples=150, deadline=None, derandomize=True)
def test_partition_bound_agrees_with_brute_force(caps, frac, k_from):
    cap = np.array([0.0] + caps)
    n_total = len(caps)
    load = frac * n_total * max(caps + [1e-3])
    k_max = n_total
    least = _brute(load, cap, 1, k_max)
    want = least if least > k_max else max(k_from, least)
    assert partition_bound(load, cap, k_from, k_max) == want


def test_caps_use_only_limits_the_slo_set():
    """K(g) = S(g) (the g heaviest accepted) says nothing of larger counts; K(g) < S(g) caps
    every count from g on; every count is capped by its heaviest loads S(n)."""
    loads = [10.0] * 4 + [1.0] * 8
    K = {1: 10.0, 2: 20.0, 3: 25.0, 4: 40.0, 6: 22.0, 8: 30.0, 12: 18.0}
    cap = caps_by_count(loads, K.__getitem__, grid=(1, 2, 3, 4, 6, 8, 12))
    assert list(cap[:4]) == [0.0, 10.0, 20.0, 25.0]      # S(1), S(2), then K(3) = 25 < 30
    assert cap[5] == 25.0 and cap[6] == 22.0 and cap[8] == 22.0   # K(8) = 30 > K(6)
    assert cap[11] == 22.0 and cap[12] == 18.0


SLO = Slo(ttft_p99_ms=300.0, itl_p99_ms=40.0)
DUR = 300.0
LOADS = [900.0] * 4 + [300.0] * 4 + [30.0] * 6          # an instance's loads, descending


def _k(n: int) -> float:
    return count_limit(PROFILE, 8, n, LOADS, default_lengths(), DUR,
                       tuple(range(BOUND_SEEDS)), 0.9, SLO, workers=1).limit_tps


def _assert_rejected_at_every_amax(total, upper, lower, shape, seed, limit):
    """A GPU whose loads mix the box's most (``shape``) and least concentrated corners with
    this total is rejected under the SLO at every Amax 1..n + 1."""
    loads = (shape * np.array(box_loads(total, upper, lower))
             + (1 - shape) * np.array(_bottom_fill(total, upper, lower)))
    per = default_lengths().mean_input + default_lengths().mean_output
    ads = [Adapter(f"a{i}", 8, float(x / per)) for i, x in enumerate(loads)]
    for amax in range(1, len(ads) + 2):
        m = simulate_server(load_profile(PROFILE), ads, ServerConfig(max_loras=amax, slo=SLO),
                            DUR, lengths=default_lengths(), seed=seed)
        assert not m.accepted, (f"{len(ads)} adapters accepted at Amax {amax}: "
                                f"{total:.0f} tok/s above {limit}")


@pytest.mark.parametrize("n,seed,over,shape", [
    (6, 0, 1.002, 0.2), (6, 3, 1.02, 0.9), (10, 1, 1.002, 0.5), (10, 6, 1.01, 0.0)])
def test_no_sampled_gpu_meets_the_slo_above_its_count_limit(n, seed, over, shape):
    """GPUs of ``n`` rank-8 adapters whose loads lie in the box of ``n`` of the instance's
    (mixes of its most and least concentrated corners, ``shape`` of the first), offered just
    above K(n) where the SLO set it, are rejected at every Amax 1..n + 1 with any seed."""
    k = _k(n)
    upper, lower = LOADS[:n], LOADS[len(LOADS) - n:]
    if k >= sum(upper) * (1 - 1e-9):
        pytest.skip(f"K({n}) is set by the loads, not the SLO")
    total = over * k
    _assert_rejected_at_every_amax(total, upper, lower, shape, seed, f"K({n}) = {k:.0f}")


@pytest.mark.parametrize("g,n,seed,shape", [(6, 8, 2, 1.0), (6, 10, 5, 0.6), (8, 10, 4, 1.0)])
def test_no_larger_gpu_meets_the_slo_above_a_smaller_count_limit(g, n, seed, shape):
    """The cap rule itself: GPUs of ``n`` > ``g`` adapters (loads in their box, as
    concentrated as allowed or mixed with the least concentrated corner) offered just above
    K(g) are rejected at every Amax."""
    k = _k(g)
    if k >= sum(LOADS[:g]) * (1 - 1e-9):
        pytest.skip(f"K({g}) is set by the loads, not the SLO")
    upper, lower = LOADS[:n], LOADS[len(LOADS) - n:]
    total = 1.002 * k
    if box_loads(total, upper, lower) is None:
        pytest.skip("no GPU of that many adapters carries that load")
    _assert_rejected_at_every_amax(total, upper, lower, shape, seed, f"K({g}) = {k:.0f}")


def test_count_limits_fall_with_the_count_where_the_slo_sets_them():
    """The premise behind using K(g) for every count above g: more adapters, with higher
    floors, carry less (the measured limits of 6 and 10 adapters, where the SLO sets them)."""
    k6, k10 = _k(6), _k(10)
    if k6 >= sum(LOADS[:6]) * (1 - 1e-9):
        pytest.skip("K(6) is set by the loads")
    assert k10 <= k6


def test_a_solve_measures_only_small_counts_and_reads_the_rest_from_the_cache(tmp_path,
                                                                            monkeypatch):
    """``measure=False`` returns a cached K or None, never measures; a solve's budget measures
    counts up to 16 at a 600 s window and only the one-adapter box at 3,600 s."""
    from optim.count_bound import solve_count_max
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    args = (PROFILE, 8, 3, LOADS, default_lengths(), 123.0, (0, 1), 0.9, SLO)
    assert count_limit(*args, workers=1, measure=False) is None
    got = count_limit(*args, workers=1)
    assert got is not None and count_limit(*args, workers=1, measure=False) == got
    assert solve_count_max(600.0) == 16 and solve_count_max(3600.0) == 1
