"""The SLO capacity table greedy packs with (``optim.slo_capacity``)."""

from __future__ import annotations

import numpy as np
import pytest

from optim.instance import instance_from_dict
from optim.capacity import carry_limit, predicted_limit
from optim.feasibility import _bound_seeds
from optim.slo_capacity import (BUSY_FEATURE, MAX_COUNT, RankCurve, SloCapacity,
                                measure_slo_capacity)
from surrogates.features import FEATURES, IDX, gpu_features
from twin.profile import load_profile
from twin.slo import Slo

PROFILE = "llama-3.1-8b-instruct"


def _inst(rates, ranks, slo, duration=300.0):
    return instance_from_dict({
        "name": "slo-cap", "duration_s": duration, "seed": 5,
        "adapters": [{"id": f"a{i}", "rank": r, "rate": q}
                     for i, (q, r) in enumerate(zip(rates, ranks))],
        "gpus": [{"name": "h100", "profile": PROFILE, "count": 4}],
        **({"slo": slo.to_dict()} if slo else {})})


def test_a_curve_interpolates_in_the_busy_count_and_is_flat_beyond_its_ends():
    c = RankCurve(8, (1, 2, 4), (6000.0, 5000.0, 3000.0), (1.0, 2.0, 4.0))
    got = c.cap_tps(np.array([0.2, 1.0, 1.5, 3.0, 4.0, 9.0]))
    assert got == pytest.approx([6000, 6000, 5500, 4000, 3000, 3000])


def test_a_point_whose_busy_count_does_not_rise_is_left_out():
    """A limit near zero gives its point a busy count below its predecessor's; interpolating
    through it would make the curve go back in busy count."""
    c = RankCurve(8, (1, 2, 4), (6000.0, 5000.0, 1.0), (1.0, 2.0, 0.01))
    assert c.cap_tps(np.array([2.0, 3.0, 50.0])) == pytest.approx([5000, 5000, 5000])


def test_row_caps_take_the_curve_of_the_row_rank_and_never_exceed_the_one_adapter_limit():
    low = RankCurve(8, (1, 4), (7000.0, 4000.0), (1.0, 4.0))
    high = RankCurve(32, (1, 4), (5000.0, 2000.0), (1.0, 4.0))
    cap = SloCapacity("h100", 6000.0, (low, high))
    rows = np.array([gpu_features([8] * 4, [0.5] * 4, 8, (223.0, 196.3)),
                     gpu_features([32] * 4, [0.5] * 4, 8, (223.0, 196.3)),
                     gpu_features([16], [0.01], 8, (223.0, 196.3))])
    assert rows.shape[1] == len(FEATURES)
    got = cap.row_caps(rows)
    b = rows[:, IDX[BUSY_FEATURE]]
    assert got[0] == pytest.approx(min(6000.0, low.cap_tps(b[:1])[0]))
    assert got[1] == pytest.approx(high.cap_tps(b[1:2])[0])
    assert got[1] < got[0]
    assert got[2] == pytest.approx(5000.0)          # rank 16 takes the rank-32 curve, count 1
    assert cap.curve_for(40).rank == 32              # above every curve: the largest


def test_measured_curves_fall_with_the_count_and_start_at_the_one_adapter_limit():
    inst = _inst([0.5] * 6 + [0.05] * 6, [8] * 6 + [32] * 6, Slo(itl_p99_ms=40.0))
    caps = measure_slo_capacity(inst, inst.duration_s, 1)
    assert set(caps) == {"h100"}
    cap = caps["h100"]
    assert [c.rank for c in cap.curves] == [8, 32]
    for c in cap.curves:
        assert c.counts[0] == 1 and list(c.counts) == sorted(c.counts)
        assert all(a >= b for a, b in zip(c.limits_tps, c.limits_tps[1:]))
        assert c.counts[-1] <= len(inst.adapters)
    assert cap.curves[0].limits_tps[0] == pytest.approx(cap.one_tps)
    assert cap.curves[1].limits_tps[0] <= cap.one_tps
    # one measured curve (the smallest rank, at most MAX_COUNT adapters); a larger rank's is
    # that curve scaled by the ratio of the two ranks' predicted one-adapter limits
    low, high = cap.curves
    assert low.counts == high.counts and low.counts[-1] <= MAX_COUNT
    args = (inst.lengths, inst.duration_s, _bound_seeds(inst), inst.starvation_threshold, 1,
            inst.slo, cap.one_tps)
    ratio = (predicted_limit(load_profile(PROFILE), 32, 1, *args)
             / predicted_limit(load_profile(PROFILE), 8, 1, *args))
    assert 0 < ratio < 1
    assert np.allclose(np.array(high.limits_tps) / np.array(low.limits_tps), ratio)
    assert measure_slo_capacity(_inst([0.5] * 3, [8] * 3, None), 300.0, 1) == {}


def test_greedy_packs_no_gpu_above_its_slo_capacity():
    """Before repair (no verification), every GPU greedy fills is within the table. The load
    (2,013 tok/s) is below the one-adapter limit under the SLO (3,314 at 300 s) and above the
    limit of a dozen busy adapters (1,397): a gate at the one-adapter limit alone fills one GPU."""
    from optim.methods import solve
    from surrogates.features import adapter_feature_matrix
    inst = _inst([0.3] * 16, [16] * 16, Slo(itl_p99_ms=40.0))
    p = solve(inst, "greedy", verify=False, duration_s=300.0, workers=1)
    cap = measure_slo_capacity(inst, 300.0, 1)["h100"]
    assert p.params["slo_capacity"] == [cap.to_dict()]
    assert len(p.gpus) >= 2
    for g in p.gpus:
        ads = [a for a, _ in g.adapters]
        add = adapter_feature_matrix([a.rank for a in ads], [a.rate for a in ads],
                                     inst.lengths).sum(axis=0)
        row = np.concatenate([add, [g.max_lora_rank, g.max_loras]])
        assert row[IDX["load"]] <= cap.row_caps(row[None, :])[0] + 1e-6


def test_one_adapter_only_caps_every_row_at_the_one_adapter_limit():
    cap = SloCapacity("h100", 6000.0, (RankCurve(8, (1, 4), (6000.0, 2000.0), (1.0, 4.0)),))
    rows = np.array([gpu_features([8] * 8, [1.0] * 8, 8, (223.0, 196.3))])
    assert cap.row_caps(rows)[0] < 6000.0
    assert cap.one_adapter_only().row_caps(rows)[0] == 6000.0


def test_the_better_placement_is_accepted_first_then_cheaper_by_the_objective():
    from types import SimpleNamespace as NS
    from optim.greedy import _better, _certified
    obj = NS(value=lambda p: float(p.n_gpus))
    ok3 = NS(verdict="accepted", status="solved", n_gpus=3, params={"lower_bound": 2})
    ok4 = NS(verdict="accepted", status="solved", n_gpus=4, params={"lower_bound": 2})
    bad2 = NS(verdict="rejected", status="solved", n_gpus=2, params={})
    over = NS(verdict="accepted", status="over_pool", n_gpus=2, params={})
    assert _better(ok3, ok4, obj) and not _better(ok4, ok3, obj) and not _better(ok3, ok3, obj)
    assert _better(ok4, bad2, obj) and not _better(bad2, ok4, obj)
    assert not _better(over, ok4, obj) and _better(ok4, over, obj)
    assert not _certified(ok3) and _certified(NS(verdict="accepted", n_gpus=2,
                                                 params={"lower_bound": 2}))
    assert not _certified(bad2)


def test_greedy_under_an_slo_keeps_the_better_of_its_two_packings(monkeypatch):
    """The verified result names its packing and is no worse than the one-adapter packing
    alone (the portfolio's promise), and twin-accepted."""
    from optim.methods import solve
    import optim.greedy as G
    inst = _inst([0.3] * 16, [16] * 16, Slo(itl_p99_ms=40.0))
    p = solve(inst, "greedy", verify=True, duration_s=300.0, workers=1)
    assert p.verdict == "accepted"
    assert p.params["slo_packing"] in ("count-aware", "one-adapter limit")
    real = G.measure_slo_capacity
    monkeypatch.setattr(G, "measure_slo_capacity", lambda *a, **k: {
        n: c.one_adapter_only() for n, c in real(*a, **k).items()})
    q = solve(inst, "greedy", verify=True, duration_s=300.0, workers=1)
    assert q.verdict == "accepted" and p.n_gpus <= q.n_gpus


def test_predicted_limit_is_near_the_carry_limit_and_below_it():
    """The table's cheap prediction (Amax = count, two seeds, no margin) lies below the sound
    carry limit (best Amax, every seed, mean + 4 sd) and not far from it."""
    inst = _inst([0.5] * 4, [8] * 4, Slo(itl_p99_ms=40.0))
    prof = load_profile(PROFILE)
    seeds = _bound_seeds(inst)
    for n in (1, 4):
        sound = carry_limit(prof, 8, n, inst.lengths, inst.duration_s, seeds,
                            inst.starvation_threshold, 1, inst.slo).limit_tps
        pred = predicted_limit(prof, 8, n, inst.lengths, inst.duration_s, seeds,
                               inst.starvation_threshold, 1, inst.slo, sound)
        assert 0.8 * sound <= pred <= 1.01 * sound, (n, pred, sound)
    with pytest.raises(ValueError, match="n_adapters"):
        predicted_limit(prof, 8, 0, inst.lengths, inst.duration_s, seeds, 0.9, 1, None, 1.0)
