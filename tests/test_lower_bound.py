"""Twin-sound lower bounds on GPU counts (``optim.feasibility.twin_lower_bound``), the carry
limits behind them (``optim.capacity.carry_limit``), the certificate, and the gpu_savings
figures built on them. Windows are short (300 s) and every bound is computed for the window the
twin verifies with, as the bound requires."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments.gpu_savings import above_bound, certified, reduction, reduction_ceiling, total_gpus
from optim.capacity import BOUND_SEEDS, carry_limit
from optim.feasibility import (TWIN_OPTIMAL, count_cap, gpu_lower_bound, lora_gpu_lower_bound,
                               one_gpu_excluded,
                               placement_claim, twin_certificate, twin_lower_bound)
from optim.instance import instance_from_dict
from optim.methods import solve
from tests.slot_profiles import four_slot_profile
from twin.fleet import GpuAssignment, simulate_fleet
from twin.sharegpt import default_lengths
from twin.server import ServerConfig
from twin.workload import Adapter

LLAMA = "llama-3.1-8b-instruct"
DUR = 300.0
SEEDS = tuple(range(BOUND_SEEDS))


def _limit(n: int = 1):
    return carry_limit(LLAMA, 8, n, default_lengths(), DUR, SEEDS, 0.9)


def _verdicts(gpus: list[tuple[int, list[Adapter]]], seeds: list[int]) -> list[bool]:
    """Unstarved (and started) per (Amax, adapters) GPU, replayed with the given seeds."""
    jobs = [GpuAssignment(LLAMA, ServerConfig(max_loras=a, max_lora_rank=max(x.rank for x in ads)),
                          tuple((x, 1.0) for x in ads)) for a, ads in gpus]
    res = simulate_fleet(jobs, duration_s=DUR, lengths=default_lengths(), workers=2,
                         check_routing=False, seeds=seeds)
    return [not (m.starved or m.memory_error) for m in res.per_gpu]


def test_carry_limit_is_measured_per_seed_with_a_spread_margin():
    c = _limit()
    assert c.seeds == SEEDS and len(c.per_seed_tps) == len(SEEDS) and c.amax in (1, 2)
    assert c.spread_tps > 0
    assert c.limit_tps >= max(c.per_seed_tps)
    assert c.limit_tps == pytest.approx(max(max(c.per_seed_tps),
                                            np.mean(c.per_seed_tps) + 4 * c.spread_tps))
    assert carry_limit(LLAMA, 8, 1, default_lengths(), DUR, SEEDS, 0.9) is c     # cached
    with pytest.raises(ValueError, match="no configuration with rank 64"):
        carry_limit(LLAMA, 64, 1, default_lengths(), DUR, SEEDS, 0.9)


def test_no_one_adapter_server_is_unstarved_above_the_limit():
    """The counterexample of the old bound was one adapter on Amax 2 just above the cap; every
    one-adapter configuration (Amax 1, 2, 3, 8), every verification seed and more, offered the
    limit, starves."""
    lim = _limit().limit_tps
    per = default_lengths().mean_input + default_lengths().mean_output
    gpus, seeds = [], []
    for amax in (1, 2, 3, 8):
        for s in range(12):
            gpus.append((amax, [Adapter("hot", 8, lim * 1.0005 / per)]))
            seeds.append(s)
    assert not any(_verdicts(gpus, seeds))


def test_count_cap_matches_a_direct_search():
    """count_cap against the definition: the largest E with E <= C(g) for the largest grid
    point g <= max(1, ceil(E / l) - 1), scanned on a fine grid of E."""
    grid = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    for decay in (0.0, 0.002, 0.01, 0.05):
        def C(n, decay=decay):
            return 1000.0 / (1 + decay * (n - 1))
        for l in (5.0, 17.0, 40.0, 90.0, 300.0, 2000.0):
            Es = np.linspace(1, 1000, 20000)

            def direct(counts):
                ok = []
                for E in Es:
                    j = max(1, math.ceil(E / l - 1e-12) - 1)
                    g = max(x for x in counts if x <= j)
                    ok.append(E <= C(g) + 1e-9)
                return Es[np.array(ok)].max()

            cap, pts = count_cap(C, C(1), l, grid, refine=0)
            assert cap == pytest.approx(direct(grid), abs=0.1)
            assert all(v == pytest.approx(C(n)) for n, v in pts)
            assert len(pts) <= 4                          # only around the crossing
            # refined: the value over every integer count, from a few more measurements
            fine, fpts = count_cap(C, C(1), l, grid, refine=10)
            assert fine == pytest.approx(direct(range(1, 65)), abs=0.1)
            assert fine <= cap + 1e-9 and len(fpts) <= 4 + 4


def _inst(adapters, count=8, duration=DUR):
    return instance_from_dict({
        "name": "lb", "adapters": [{"id": f"a{i}", "rank": r, "rate": q}
                                   for i, (r, q) in enumerate(adapters)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": count}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": duration})


def test_bound_fields_and_formula():
    inst = _inst([((8, 16, 32)[i % 3], (2.4, 1.2, 0.6)[i % 3]) for i in range(60)])
    b = twin_lower_bound(inst)
    assert b.duration_s == DUR and b.max_adapter_tps == pytest.approx(2.4 * inst.mean_tokens)
    assert b.gpu_cap_tps == pytest.approx(_limit().limit_tps)
    assert b.one_adapter == math.ceil(inst.total_load_tps / b.gpu_cap_tps)
    assert b.count_cap_tps <= b.gpu_cap_tps and b.by_count >= b.one_adapter
    assert b.best == max(b.one_adapter, b.by_count) == lora_gpu_lower_bound(inst)
    assert b.best >= gpu_lower_bound(inst)
    # the bound is for the window verification uses: another window, another measurement
    assert twin_lower_bound(inst, 600.0).gpu_cap_tps != b.gpu_cap_tps


def test_no_accepted_placement_uses_fewer_gpus_than_the_bound_and_the_certificate():
    inst = _inst([((8, 16, 32)[i % 3], (2.4, 1.2, 0.6)[i % 3]) for i in range(36)])
    lb = lora_gpu_lower_bound(inst)
    for method in ("greedy", "maxbase"):
        p = solve(inst, method, verify=True, duration_s=DUR)
        ok, bound = twin_certificate(inst, p)
        assert bound == lb
        if p.verdict == "accepted":
            assert p.n_gpus >= lb
            assert ok == (p.n_gpus == lb)
            assert placement_claim(inst, p) == (TWIN_OPTIMAL if ok else None)
        else:
            assert not ok and placement_claim(inst, p) is None


def _rows():
    # instance x: maxbase 4 (lb 1), greedy 1; instance y: maxbase 2 (lb 2), greedy 3
    return pd.DataFrame([
        {"instance": "x", "lb": 1, "method": "maxbase", "gpus": 4, "proposed_gpus": 4,
         "failed": False},
        {"instance": "x", "lb": 1, "method": "greedy", "gpus": 1, "proposed_gpus": 1,
         "failed": False},
        {"instance": "y", "lb": 2, "method": "maxbase", "gpus": 2, "proposed_gpus": 1,
         "failed": True},
        {"instance": "y", "lb": 2, "method": "greedy", "gpus": 3, "proposed_gpus": 3,
         "failed": False},
    ])


def test_savings_figures():
    df = _rows()
    red, fails = reduction(df)
    assert red == pytest.approx((0.75 - 0.5) / 2 * 100) and fails == 0
    strict, _ = reduction(df, strict=True)
    assert strict == pytest.approx(75.0)                 # only x: MaxBase's own count accepted
    assert reduction_ceiling(df) == pytest.approx((0.75 + 0.0) / 2 * 100)
    assert above_bound(df) == 0 + 1
    assert reduction_ceiling(df[df["method"] == "greedy"]) is None
    assert total_gpus(df, "maxbase") == (6, 0)            # scaled out: 4 + 2
    assert total_gpus(df, "maxbase", strict=True) == (4, 1)   # y starves on its own
    assert total_gpus(df, "greedy") == (4, 0) and total_gpus(df, "nope") == (None, 0)
    assert certified(df) == 1 and certified(df, "maxbase") == 0


def test_one_gpu_exclusion_replays_every_amax():
    """one_gpu_excluded: True for a load one GPU cannot serve at any Amax, False where the twin
    accepts one GPU; never True where greedy's placement is one accepted GPU."""
    cap = _limit().limit_tps
    per = default_lengths().mean_input + default_lengths().mean_output
    easy = _inst([(8, 0.5 * cap / per / 12)] * 12)
    hard = _inst([(8, 1.3 * cap / per / 12)] * 12)
    assert not one_gpu_excluded(easy, DUR) and one_gpu_excluded(hard, DUR)
    near = _inst([(8, 0.95 * cap / per / 16)] * 16)
    p = solve(near, "greedy", verify=True, duration_s=DUR)
    b = twin_lower_bound(near)
    if p.verdict == "accepted" and p.n_gpus == 1:
        assert not b.one_gpu_excluded and b.best == 1
    assert b.best <= max(p.n_gpus, 1) or p.verdict != "accepted"


def test_one_gpu_exclusion_is_exact_and_order_free():
    """A one-GPU placement's verdict depends on its adapters as a set (the twin takes them in id
    order), so one_gpu_excluded, which replays every Amax without a margin, agrees exactly with
    verifying every one-GPU placement, whatever order it lists its adapters in."""
    from optim.placement import Placement, plan_gpu
    from optim.verify import verify

    cap = _limit().limit_tps
    per = default_lengths().mean_input + default_lengths().mean_output
    rng = np.random.default_rng(3)
    w = rng.dirichlet(np.ones(10))
    outcomes = set()
    for load in (0.92, 0.925, 0.93):              # around the edge: both outcomes occur
        inst = _inst([(8, load * cap / per * x) for x in w])
        excluded = one_gpu_excluded(inst, DUR)
        outcomes.add(excluded)
        t = inst.gpu_types[0]
        accepted = []
        for rank in t.load_profile().supported_ranks:      # every rank >= the adapters' 8
            for amax in range(1, 12):                      # 1..adapters + 1
                order = list(rng.permutation(len(inst.adapters)))
                pairs = [(inst.adapters[i], 1.0) for i in order]
                plan = plan_gpu(t.name, t.profile, amax, pairs, inst.mean_tokens, rank)
                p = Placement(inst.name, "manual", "solved", (plan,))
                v1 = verify(p, inst, duration_s=DUR, workers=2)
                v2 = verify(p.with_(gpus=(plan_gpu(t.name, t.profile, amax, pairs[::-1],
                                                   inst.mean_tokens, rank),)),
                            inst, duration_s=DUR, workers=2)
                assert v1.gpus[0].verified == v2.gpus[0].verified      # order-free
                accepted.append(v1.verdict == "accepted")
        assert excluded == (not any(accepted)), (load, accepted)
    assert outcomes == {True, False}


def _swap_inst(n, profile, rate):
    return instance_from_dict({
        "name": "swap", "adapters": [{"id": f"a{i}", "rank": 8, "rate": rate} for i in range(n)],
        "gpus": [{"name": "g", "profile": profile, "count": 4}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": DUR})


def test_one_gpu_check_runs_where_one_gpu_must_swap(tmp_path, monkeypatch):
    """Below COUNT_BOUND_FROM of the one-adapter cap the one-GPU check is skipped only where
    every adapter fits the slots of some startable Amax; with more adapters than any type
    starts slots for, one GPU must swap and the check runs; its result is cached on disk (a
    second bound replays nothing)."""
    import optim.feasibility as feas

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path / "cache"))
    prof = four_slot_profile(tmp_path)
    per = default_lengths().mean_input + default_lengths().mean_output
    rate = 0.3 * _limit().limit_tps / per / 8          # 0.3 of the cap: far below the shortcut
    assert feas._swaps_on_one_gpu(_swap_inst(8, prof, rate))
    assert not feas._swaps_on_one_gpu(_swap_inst(4, prof, rate))
    assert not feas._swaps_on_one_gpu(_swap_inst(8, LLAMA, rate))
    calls = []
    real = feas._one_gpu_accepted
    monkeypatch.setattr(feas, "_one_gpu_accepted",
                        lambda inst, *a, **k: calls.append(len(inst.adapters)) or real(inst, *a,
                                                                                        **k))
    b = twin_lower_bound(_swap_inst(8, prof, rate))
    assert calls[0] == 8
    assert b.best == (2 if b.one_gpu_excluded else 1)
    n_calls = len(calls)
    assert twin_lower_bound(_swap_inst(8, prof, rate)).one_gpu_excluded == b.one_gpu_excluded
    assert len(calls) == n_calls                        # the second answer came from the cache
    twin_lower_bound(_swap_inst(8, LLAMA, rate))        # all resident at Amax 8: no check
    assert len(calls) == n_calls


def test_fullest_gpu_checks_raise_the_bound_step_by_step(tmp_path, monkeypatch):
    """k >= 2 GPUs: the fullest holds ceil(n / k) adapters; while that many must swap and its
    lightest set fails, the bound rises (at most MAX_FULLEST_STEPS steps); the replayed set is
    the lightest adapters at the smallest rank."""
    import optim.feasibility as feas

    prof = four_slot_profile(tmp_path)
    seen = []

    def fake(inst, ads, rank, *a, **k):             # sets of 8 or more adapters fail
        seen.append((len(ads), rank, max(x.rate for x in ads)))
        return len(ads) >= 8
    monkeypatch.setattr(feas, "gpu_excluded", fake)
    monkeypatch.setattr(feas, "one_gpu_excluded",
                        lambda inst, *a, **k: fake(inst, inst.adapters,
                                                   max(x.rank for x in inst.adapters)))
    inst = instance_from_dict({
        "name": "mix", "adapters": [{"id": f"a{i}", "rank": (8, 16)[i % 2], "rate": 0.01 * (i + 1)}
                                    for i in range(16)],
        "gpus": [{"name": "g", "profile": prof, "count": 8}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": DUR})
    b = twin_lower_bound(inst)
    # one GPU (16 adapters at rank 16) fails; 2 GPUs: the fullest holds 8 (the 8 lightest at
    # rank 8) and fails; 3 GPUs: 6, which pass
    assert [(n, r) for n, r, _ in seen] == [(16, 16), (8, 8), (6, 8)]
    assert seen[1][2] == pytest.approx(0.08) and seen[2][2] == pytest.approx(0.06)
    assert b.one_gpu_excluded and b.fullest_excluded_to == 2 and b.best == 3
    monkeypatch.setattr(feas, "MAX_FULLEST_STEPS", 0)
    assert twin_lower_bound(inst).best == 2
    with pytest.raises(ValueError, match="k must be"):
        feas.fullest_gpu_excluded(inst, 0, DUR)


def _pair_inst(n: int = 40):
    return instance_from_dict({
        "name": "pair", "adapters": [{"id": f"a{i:02d}", "rank": 8, "rate": 0.01 * (1 + i % 5)}
                                     for i in range(n)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 4}], "duration_s": DUR})


def test_canonical_gpu_is_the_lightest_set_with_the_load_concentrated():
    import optim.feasibility as feas

    inst = _pair_inst()
    per, top = inst.mean_tokens, 0.05
    rates = sorted(a.rate for a in inst.adapters)
    for m, share in [(1, 0.01), (5, 0.1), (20, 0.5), (39, 0.97)]:
        load = share * inst.total_load_tps
        got = sorted(a.rate for a in feas.canonical_gpu(inst, m, load))
        assert len(got) <= m and max(got) <= top + 1e-12
        assert sum(got) * per == pytest.approx(load)                 # every such load fits m
        j = sum(1 for r in got if r == top)
        assert got[:len(got) - j - 1] == pytest.approx(rates[:len(got) - j - 1])  # lightest
    # more load than m adapters can offer: capped at m - 1 top rates + one more
    g = feas.canonical_gpu(inst, 3, inst.total_load_tps)
    assert [a.rate for a in g] == pytest.approx([top, top, top])
    with pytest.raises(ValueError, match="m must be"):
        feas.canonical_gpu(inst, 0, 1.0)


@pytest.mark.parametrize("cap_share, excluded", [(0.48, True), (0.55, False)])
def test_two_gpus_excluded_against_a_known_gpu_rule(tmp_path, monkeypatch, cap_share, excluded):
    """With a GPU rule 'fails iff its load >= cap_share x L' (any adapter count), two GPUs are
    excluded iff 2 x cap_share <= 1: at 0.48 every split has a GPU at >= 0.5 L; at 0.55 the
    balanced split of 20 + 20 adapters passes. The budget cuts the proof short (False), and
    the answer is cached on disk."""
    import optim.feasibility as feas

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    inst = _pair_inst()
    seen = []

    def rule(inst_, ads, rank, dur, workers=None):
        load = sum(a.rate for a in ads) * inst_.mean_tokens
        seen.append((len(ads), load / inst_.total_load_tps))
        return load >= cap_share * inst_.total_load_tps
    monkeypatch.setattr(feas, "gpu_excluded", rule)
    assert feas.two_gpus_excluded(inst, DUR, max_checks=64) is excluded
    assert 0 < len(seen) <= 64
    n_seen = len(seen)
    assert feas.two_gpus_excluded(inst, DUR, max_checks=64) is excluded
    assert len(seen) == n_seen                          # from the cache
    assert feas.two_gpus_excluded(inst, DUR, max_checks=1) is False


def test_two_gpus_excluded_only_with_a_budget(tmp_path, monkeypatch):
    """twin_lower_bound runs the two-GPU check only with pair_checks > 0 and 2 GPUs left."""
    import optim.feasibility as feas

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(feas, "two_gpus_excluded",
                        lambda inst, dur, workers, checks: calls.append(checks) or True)
    monkeypatch.setattr(feas, "_must_swap", lambda inst, n, r: True)
    monkeypatch.setattr(feas, "fullest_gpu_excluded", lambda *a, **k: False)
    monkeypatch.setattr(feas, "one_gpu_excluded", lambda *a, **k: True)
    inst = _pair_inst()
    assert twin_lower_bound(inst).best == 2 and calls == []
    b = twin_lower_bound(inst, pair_checks=8)
    assert calls == [8] and b.two_gpus_excluded and b.best == 3


def test_busiest_gpu_check_replays_the_concentrated_gpu(monkeypatch):
    """k GPUs: the busiest carries >= L / k on at least as many adapters as that load takes;
    the GPU replayed carries exactly L / k on that many, all but one at the largest rate, at the
    smallest rank."""
    import optim.feasibility as feas

    inst = _pair_inst()
    seen = []
    monkeypatch.setattr(feas, "gpu_excluded",
                        lambda inst_, ads, rank, *a, **k: seen.append((ads, rank)) or True)
    assert feas.busiest_gpu_excluded(inst, 4, DUR)
    ads, rank = seen[0]
    rates = sorted(a.rate for a in ads)
    load = sum(rates) * inst.mean_tokens
    assert load == pytest.approx(inst.total_load_tps / 4) and rank == 8
    # L / 4 = 0.3 req/s: six adapters of 0.05 (the heaviest first: 0.05 x 6 = 0.3)
    assert len(ads) == feas._adapters_for_load(inst, inst.total_load_tps / 4) == 6
    assert rates == pytest.approx([0.05] * 6)
    with pytest.raises(ValueError, match="k must be"):
        feas.busiest_gpu_excluded(inst, 0, DUR)


def test_busiest_gpu_steps_raise_the_bound(monkeypatch):
    """With L / k above COUNT_BOUND_FROM of the one-adapter cap and the busiest GPU failing,
    the bound rises one GPU per step (at most MAX_FULLEST_STEPS); far below it, no replay."""
    import types

    import optim.feasibility as feas

    inst = _pair_inst()
    cap = 0.55 * inst.total_load_tps                      # two GPUs by the one-adapter bound
    monkeypatch.setattr(feas, "carry_limit",
                        lambda *a, **k: types.SimpleNamespace(limit_tps=cap))
    monkeypatch.setattr(feas, "_must_swap", lambda *a: False)
    ks = []
    monkeypatch.setattr(feas, "busiest_gpu_excluded",
                        lambda inst_, k, *a, **kw: ks.append(k) or k == 2)
    b = twin_lower_bound(inst)
    assert (b.one_adapter, b.busiest_excluded_to, b.best) == (2, 2, 3)
    assert ks == [2]                                # L / 3 = 0.61 x the cap: no replay
    assert b.to_dict()["busiest_excluded_to"] == 2
    monkeypatch.setattr(feas, "busiest_gpu_excluded", lambda inst_, k, *a, **kw: ks.append(k))
    assert twin_lower_bound(inst).best == 2 and ks == [2, 2]      # not shown: bound stays


def test_raise_bound_to_runs_the_exclusion_that_closes_one_step(monkeypatch):
    """One GPU above the bound, the certificate runs the exclusion for bound GPUs without the
    load thresholds: one GPU -> the exact one-GPU check; k >= 2 -> fullest, then busiest; a
    failed check leaves the bound; any other gap runs nothing."""
    import optim.feasibility as feas
    calls = []

    def rec(name, answer):
        def f(inst, *a, **k):
            calls.append((name, a[0] if name != "one" else None))
            return answer
        return f

    inst = _pair_inst()
    monkeypatch.setattr(feas, "one_gpu_excluded", rec("one", True))
    monkeypatch.setattr(feas, "fullest_gpu_excluded", rec("fullest", False))
    monkeypatch.setattr(feas, "busiest_gpu_excluded", rec("busiest", True))
    assert feas.raise_bound_to(inst, 1, 2, DUR) == 2 and calls == [("one", None)]
    calls.clear()
    assert feas.raise_bound_to(inst, 3, 4, DUR) == 4
    assert calls == [("fullest", 3), ("busiest", 3)]
    calls.clear()
    assert feas.raise_bound_to(inst, 2, 4, DUR) == 2 and calls == []     # two steps: nothing
    monkeypatch.setattr(feas, "busiest_gpu_excluded", rec("busiest", False))
    assert feas.raise_bound_to(inst, 3, 4, DUR) == 3


def _best_packing(loads: list[float], cap: float) -> int:
    """Fewest bins of ``cap`` holding ``loads`` whole, by brute force (a few items)."""
    best = len(loads)

    def place(i: int, bins: list[float]) -> None:
        nonlocal best
        if len(bins) >= best:
            return
        if i == len(loads):
            best = len(bins)
            return
        for b in range(len(bins)):
            if bins[b] + loads[i] <= cap:
                bins[b] += loads[i]
                place(i + 1, bins)
                bins[b] -= loads[i]
        place(i + 1, bins + [loads[i]])

    place(0, [])
    return best


def test_packing_bound_never_exceeds_the_best_packing():
    """L2 on rounded loads is a bound: never above brute force, and at least L1 and the count
    of loads above half the cap."""
    from optim.feasibility import packing_bound

    rng = np.random.default_rng(7)
    for _ in range(300):
        cap = float(rng.uniform(1_000, 20_000))
        loads = list(rng.uniform(0.01, 1.0, size=int(rng.integers(1, 8))) * cap)
        b = packing_bound(loads, cap)
        assert b <= _best_packing(sorted(loads, reverse=True), cap)
        assert b >= math.ceil(sum(loads) / cap - 1e-9)
        assert b >= sum(x > cap / 2 for x in loads)
    assert packing_bound([0.6] * 4 + [0.1] * 4, 1.0) == 4
    assert packing_bound([1.5, 0.2], 1.0) == 0 and packing_bound([], 1.0) == 0


def test_packing_bound_raises_the_twin_bound_for_hot_adapters(monkeypatch):
    """Four adapters above half the carry cap need four GPUs although their load fits three."""
    import types

    import optim.feasibility as feas

    inst = _inst([(8, 5.0)] * 4 + [(8, 0.5)] * 4)
    hot = 5.0 * inst.mean_tokens
    cap = 1.8 * hot                                # 3 GPUs by load, hot adapters > cap / 2
    monkeypatch.setattr(feas, "carry_limit",
                        lambda *a, **k: types.SimpleNamespace(limit_tps=cap))
    monkeypatch.setattr(feas, "busiest_gpu_excluded", lambda *a, **k: False)
    b = twin_lower_bound(inst)
    assert (b.one_adapter, b.by_packing, b.best) == (3, 4, 4)
    assert b.to_dict()["by_packing"] == 4


def test_two_hot_adapters_above_half_the_cap_starve_together():
    """The premise in the twin: two adapters each offering more than half the one-adapter
    carry limit starve on one GPU at every Amax that fits them."""
    one = _limit().limit_tps
    rate = 0.55 * one / (223.0 + 196.3)
    ads = [Adapter("h0", 8, rate), Adapter("h1", 8, rate)]
    assert not any(_verdicts([(a, ads) for a in (1, 2, 3)], [0, 0, 0]))
