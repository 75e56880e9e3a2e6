"""Integer search of Amax (optim.integer_search, optim.amax_search): the search agrees with brute
force over every integer, on synthetic curves and on the twin itself."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from optim.amax_search import amax_upper, twin_best_amax, twin_scores
from optim.instance import instance_from_dict
from optim.integer_search import coarse_probes, search_max
from optim.placement import plan_gpu

LLAMA = "llama-3.1-8b-instruct"
WINDOW = 300.0


def test_coarse_probes():
    assert coarse_probes(5) == [1, 2, 3, 4, 5]
    p = coarse_probes(384)
    assert p[0] == 1 and p[-1] == 384 and p == sorted(set(p)) and len(p) <= 10
    assert coarse_probes(0) == [] and coarse_probes(1) == [1]
    with pytest.raises(ValueError, match="hi"):
        search_max(lambda xs: xs, 0)


@given(hi=st.integers(1, 600), peak=st.floats(0.0, 1.0), width=st.floats(0.05, 3.0),
       plateau=st.integers(0, 5), skew=st.floats(0.3, 3.0))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_search_finds_the_maximum_of_unimodal_curves(hi, peak, width, plateau, skew):
    """Curves rising to a (possibly flat) top and falling, on a log scale like throughput vs
    Amax: the search returns brute force's argmax (smallest on ties) with few evaluations."""
    c = max(1, int(round(hi ** peak)))

    def f(x: int) -> float:
        d = max(0.0, abs(np.log(x / c)) - np.log1p(plateau / c))
        return -d / width * (skew if x > c else 1.0)

    calls: list[int] = []

    def score(xs):
        calls.extend(xs)
        return [f(x) for x in xs]

    best, val, seen = search_max(score, hi)
    brute = max(range(1, hi + 1), key=lambda x: (f(x), -x))
    assert val == f(brute) and best == brute
    assert len(calls) == len(set(calls)) == len(seen)
    assert len(calls) <= 10 + 2 * int(np.ceil(np.log2(hi + 1))) + 2


def _inst(n, seed, window, load_tps):
    """``n`` rank-8 adapters of mixed rates offering ``load_tps`` in total."""
    rng = np.random.default_rng(seed)
    rates = rng.choice([0.05, 0.3, 0.9, 2.4], size=n)
    rates = np.round(rates * load_tps / 419.3 / rates.sum(), 4)
    return instance_from_dict({
        "name": f"tiny{seed}", "adapters": [{"id": f"a{i}", "rank": 8, "rate": float(q)}
                                            for i, q in enumerate(rates)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": window})


@pytest.mark.parametrize("n,seed,load", [(14, 0, 12_600.0), (18, 1, 13_000.0), (24, 2, 12_800.0),
                                         (16, 3, 13_400.0)])
def test_twin_search_agrees_with_brute_force_over_every_amax(n, seed, load):
    """Small GPUs near capacity (three accepted in a window of Amax, one starved at every
    Amax), every integer Amax replayed: the search (4 coarse probes, so that refinement does the
    work) returns the brute-force best Amax and the same verdict with fewer runs."""
    inst = _inst(n, seed, WINDOW, load)
    ads = [(a, 1.0) for a in inst.adapters]
    plan = plan_gpu("h100", LLAMA, 1, ads, inst.mean_tokens, 8)
    top = amax_upper(plan)
    brute = twin_scores(inst, plan, list(range(1, top + 1)), seed=5, duration_s=WINDOW, workers=2)
    scores = [s for s, _ in brute]
    b = int(np.argmax(scores)) + 1
    found, runs = twin_best_amax(inst, plan, 5, WINDOW, workers=2, k=4)
    if scores[b - 1] >= 1.0:
        assert found is not None and found.max_loras == b
        assert found.verified is not None and found.verified.ok
        assert runs < top
    else:                       # given up only after every integer Amax was replayed
        assert found is None and runs == top


def _bimodal(xs):
    """A score curve with a narrow accepted peak at Amax 37 that the coarse scan (probes 1, 2,
    4, 8, 15, 29, 56, ...) and its refinement around the wide local maximum at 8 never see."""
    return [1.2 if a == 37 else 0.95 - 0.01 * abs(a - 8) / 8 for a in xs]


def test_twin_best_amax_finds_an_accepted_amax_the_search_skips(monkeypatch):
    """The score-vs-Amax curve is not unimodal (experiments.amax_curves): when the search's
    best is rejected, twin_best_amax replays every Amax it skipped before it gives the GPU up."""
    import optim.amax_search as AS
    from types import SimpleNamespace
    calls = []

    def fake_scores(inst, plan, amaxes, seed, duration_s, workers=None, stop_below=None):
        calls.append((list(amaxes), stop_below))
        return [(v, SimpleNamespace(tag=a)) for a, v in zip(amaxes, _bimodal(amaxes))]

    monkeypatch.setattr(AS, "twin_scores", fake_scores)
    monkeypatch.setattr(AS.GpuMetrics, "from_run", staticmethod(lambda m: None))
    inst = _inst(64, 0, WINDOW, 10_000.0)
    plan = plan_gpu("h100", LLAMA, 1, [(a, 1.0) for a in inst.adapters], inst.mean_tokens, 8)
    top = amax_upper(plan)
    _, s, seen = search_max(lambda xs: _bimodal(xs), top)
    assert s < 1.0 and 37 not in seen                  # the search alone gives it up
    found, runs = twin_best_amax(inst, plan, 0, WINDOW)
    assert found is not None and found.max_loras == 37 and runs == top
    assert calls[-1][1] == 1.0 and 37 in calls[-1][0]  # the fallback stops replays early


def test_overload_candidates_take_every_amax_near_the_best():
    """The count-aware carry limits rank Amax by saturated throughput over every integer (no
    search): the global best of a curve with several local maxima, and every Amax within
    CANDIDATE_RTOL of it, are candidates."""
    from optim.capacity import CANDIDATE_MAX, CANDIDATE_RTOL, _overload_candidates
    curve = {a: 100.0 - abs(a - 6) for a in range(1, 41)}
    curve[33] = 104.0
    curve[34] = 104.0 * (1 - CANDIDATE_RTOL) - 0.01
    curve[30] = 104.0 * (1 - CANDIDATE_RTOL)
    seen = []
    best, top, near = _overload_candidates(lambda xs: (seen.extend(xs), [curve[a] for a in xs])[1],
                                           40)
    assert (best, top) == (33, 104.0) and sorted(seen) == list(range(1, 41))
    assert near == [30, 33]
    # a noisy plateau: only the CANDIDATE_MAX best near ones, the global best among them
    plateau = {a: 100.0 + 0.01 * ((a * 7) % 11) for a in range(1, 61)}
    best, top, near = _overload_candidates(lambda xs: [plateau[a] for a in xs], 60)
    assert len(near) == CANDIDATE_MAX and best in near
    assert min(plateau[a] for a in near) >= max(plateau[a] for a in plateau if a not in near)


def test_the_amax_search_keeps_the_gpus_power_cap():
    """A power-capped GPU is searched and returned with its cap (the search built its candidate
    plans without it, so a capped GPU was judged at full power)."""
    from dataclasses import replace
    inst = instance_from_dict({
        "name": "capped", "adapters": [{"id": f"a{i}", "rank": 8, "rate": 2.0}
                                       for i in range(16)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": WINDOW})
    plan = plan_gpu("h100", LLAMA, 8, [(a, 1.0) for a in inst.adapters], inst.mean_tokens, 8)
    capped = replace(plan, power_cap_w=200.0)
    full = [m.throughput_tps for _, m in twin_scores(inst, plan, [8, 16], inst.seed, WINDOW, 1)]
    low = [m.throughput_tps for _, m in twin_scores(inst, capped, [8, 16], inst.seed, WINDOW, 1)]
    assert all(lo < hi for lo, hi in zip(low, full))
    best, _ = twin_best_amax(inst, replace(capped, adapters=capped.adapters[:2],
                                           offered_tps=capped.offered_tps / 8), inst.seed,
                             WINDOW, 1)
    assert best is not None and best.power_cap_w == 200.0


def test_refinement_is_search_max_step():
    from optim.integer_search import refinement
    seen = {1: 0.1, 10: 0.5, 20: 0.9, 30: 0.4}
    assert refinement(seen) == [15, 25]
    seen.update({15: 0.2, 25: 0.3, 17: 0.1, 23: 0.1, 18: 0.1, 22: 0.1, 19: 0.1, 21: 0.1})
    assert refinement(seen) == []


def test_seed_bests_find_each_seed_hump_from_the_band(monkeypatch):
    """``_seed_bests``: a bimodal curve whose higher hump moves with the seed; every seed's
    search starts from the candidates and ends at its own best, including a dent beside it."""
    import optim.amax_search as A
    from optim.feasibility import _seed_bests

    def curve(a: int, s: int) -> float:
        h1 = 0.95 - 0.01 * abs(a - 10)
        h2 = 0.96 + 0.005 * s - 0.01 * abs(a - (30 + s))
        dent = -0.05 if a == 30 + s - 1 else 0.0
        return max(h1, h2 + dent)

    calls = []

    def fake(inst, plan, amaxes, seed, duration_s, workers=None, stop_below=None):
        seeds = [seed] * len(amaxes) if isinstance(seed, int) else list(seed)
        calls.append(len(amaxes))
        return [(curve(a, s), None) for a, s in zip(amaxes, seeds)]

    monkeypatch.setattr(A, "twin_scores", fake)
    got = _seed_bests(None, None, [9, 10, 11, 29, 30, 31], 60, [0, 1, 2, 3], 300.0, 1)
    want = [max(curve(a, s) for a in range(1, 61)) for s in range(4)]
    assert got == pytest.approx(want)
    assert sum(calls) < 4 * 60                  # a search, not every Amax


def test_seed_bests_replay_every_amax_for_a_seed_far_below_the_others(monkeypatch):
    """A seed whose only high score is a narrow spike away from the starts and the coarse probes
    ends far below the median seed after its climb: every Amax is replayed for it alone."""
    import optim.amax_search as A
    from optim.feasibility import _seed_bests
    from optim.integer_search import coarse_probes
    spike = next(a for a in range(45, 60) if all(abs(a - p) > 2 for p in coarse_probes(60)))

    def curve(a: int, s: int) -> float:
        if s == 3:
            return 0.95 if a == spike else 0.6 - 0.01 * abs(a - 30)
        return 0.9 - 0.01 * abs(a - 30)

    replays = {}

    def fake(inst, plan, amaxes, seed, duration_s, workers=None, stop_below=None):
        seeds = [seed] * len(amaxes) if isinstance(seed, int) else list(seed)
        for s in seeds:
            replays[s] = replays.get(s, 0) + 1
        return [(curve(a, s), None) for a, s in zip(amaxes, seeds)]

    monkeypatch.setattr(A, "twin_scores", fake)
    got = _seed_bests(None, None, [29, 30, 31], 60, [0, 1, 2, 3], 600.0, 1)
    assert got == pytest.approx([0.9, 0.9, 0.9, 0.95])
    assert replays[3] == 60 and replays[0] < 30        # only the low seed replays every Amax
