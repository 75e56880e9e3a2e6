"""Adversarial GPUs against the twin-sound bounds: no sampled GPU is unstarved while offered
more than the per-GPU cap the bounds use (``optim.feasibility``), and the assumptions behind the
adapter-count-aware cap hold where they are measured. Windows are 300 s, with bounds measured
for 300 s; ``python -m experiments.twin_bounds --adversarial N --duration 7200`` runs the
hot-adapter check with long windows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from optim.amax_search import twin_best_amax
from optim.capacity import BOUND_SEEDS, carry_limit
from optim.feasibility import count_cap
from optim.instance import instance_from_dict
from optim.placement import plan_gpu
from twin.sharegpt import default_lengths
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.workload import Adapter

LLAMA = "llama-3.1-8b-instruct"
DUR = 300.0
SEEDS = tuple(range(BOUND_SEEDS))
PER = default_lengths().mean_input + default_lengths().mean_output


def _C(n: int) -> float:
    return carry_limit(LLAMA, 8, n, default_lengths(), DUR, SEEDS, 0.9).limit_tps


@given(cold=st.integers(0, 3), amax=st.integers(1, 4), seed=st.integers(0, 60),
       hot_share=st.floats(0.7, 1.0), over=st.floats(1.0005, 1.05),
       cold_rank=st.sampled_from([8, 16, 32]))
@settings(max_examples=25, deadline=None, derandomize=True)
def test_hot_adapter_with_few_slots_never_beats_the_one_adapter_limit(cold, amax, seed,
                                                                      hot_share, over, cold_rank):
    """One hot rank-8 adapter with up to three colder ones (any rank), 1-4 slots, any seed,
    offered above the one-adapter limit: starved."""
    load = over * _C(1)
    hot = hot_share if cold else 1.0
    ads = [Adapter("hot", 8, hot * load / PER)]
    ads += [Adapter(f"c{i}", cold_rank, (1 - hot) * load / PER / cold) for i in range(cold)]
    m = simulate_server(load_profile(LLAMA), ads, ServerConfig(max_loras=amax), DUR,
                        lengths=default_lengths(), seed=seed)
    assert m.starved or m.memory_error


def _gpu(n, spread, seed, load):
    rng = np.random.default_rng(seed)
    w = 1.0 - spread * rng.random(n)
    rates = w / w.sum() * load / PER
    return [Adapter(f"a{i}", 8, float(q)) for i, q in enumerate(rates)]


def _instance(name: str, ads, profile: str = LLAMA, count: int = 1, gpu: str = "h100"):
    return instance_from_dict({
        "name": name, "adapters": [{"id": a.id, "rank": a.rank, "rate": a.rate} for a in ads],
        "gpus": [{"name": gpu, "profile": profile, "count": count}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": DUR})


def _best_scores(inst, group, rank, seeds, amaxes=None, profile: str = LLAMA,
                 gpu: str = "h100") -> np.ndarray:
    """One GPU of ``group`` at server rank ``rank``: its best twin score over ``amaxes``
    (default every Amax it starts) with each of ``seeds``."""
    from optim.amax_search import amax_upper, twin_scores
    plan = plan_gpu(gpu, profile, 1, [(a, 1.0) for a in group], inst.mean_tokens, rank)
    xs = list(amaxes) if amaxes is not None else list(range(1, amax_upper(plan) + 1))
    return np.array([max(v for v, _ in twin_scores(inst, plan, xs, s, DUR, 2)) for s in seeds])


@pytest.mark.parametrize("n,spread,seed", [(14, 0.5, 0), (20, 0.3, 1), (20, 0.8, 2), (28, 0.5, 3)])
def test_many_adapter_gpus_never_beat_the_count_cap(n, spread, seed):
    """GPUs of ``n`` rank-8 adapters of unequal rates, offered just above the count-aware cap
    for their largest adapter: starved at every Amax the twin search tries (the best Amax
    among every integer)."""
    probe = _gpu(n, spread, seed, 1.0)
    lmax_share = max(a.rate for a in probe) * PER          # largest adapter's share of the load
    # the cap depends on the largest adapter's load, which scales with the total: fixed point
    load = _C(1)
    for _ in range(6):
        load = count_cap(_C, _C(1), lmax_share * load)[0]
    load *= 1.0005
    ads = _gpu(n, spread, seed, load)
    cap = count_cap(_C, _C(1), max(a.rate for a in ads) * PER)[0]
    assert sum(a.rate for a in ads) * PER > cap
    inst = _instance("adv", ads)
    plan = plan_gpu("h100", LLAMA, 1, [(a, 1.0) for a in ads], inst.mean_tokens, 8)
    for s in (seed, seed + 10):
        best, _ = twin_best_amax(inst, plan, s, DUR, workers=2)
        assert best is None


def test_carry_limit_falls_with_the_adapter_count():
    """The count-aware cap assumes C(n) non-increasing in n. Each C(n) is measured on other
    workload draws (n adapters draw n streams), so the check is statistical: the mean per-seed
    limit of n adapters is below the one-adapter mean plus two standard errors, and 16
    adapters carry clearly less than one."""
    one = carry_limit(LLAMA, 8, 1, default_lengths(), DUR, SEEDS, 0.9)
    means = {}
    for n in (4, 8, 16):
        c = carry_limit(LLAMA, 8, n, default_lengths(), DUR, SEEDS, 0.9)
        means[n] = float(np.mean(c.per_seed_tps))
        se = one.spread_tps / np.sqrt(len(c.per_seed_tps))
        assert means[n] <= float(np.mean(one.per_seed_tps)) + 2 * se
    assert means[16] < means[4] and means[16] < 0.99 * float(np.mean(one.per_seed_tps))


def test_lighter_fewer_lower_rank_sets_swap_no_worse(tmp_path):
    """The assumption of ``fullest_gpu_excluded``: on a GPU that must swap (four slots), the m
    lightest adapters of an instance at its smallest rank score at least as well as any set of m
    or more of its adapters at their own ranks (best score over every Amax, mean over 4 seeds,
    within two standard errors)."""
    from tests.slot_profiles import four_slot_profile

    prof = four_slot_profile(tmp_path)
    rng = np.random.default_rng(0)
    ads = [Adapter(f"a{i}", (8, 16)[i % 2], float(r))
           for i, r in enumerate(2.0 * rng.lognormal(0.0, 0.6, 12))]
    inst = _instance("swap", ads, prof, 4, "g")

    def best(group, rank):
        return _best_scores(inst, group, rank, range(4), [1, 2, 3, 4], prof, "g")

    m = 6
    light = best([Adapter(a.id, 8, a.rate)
                  for a in sorted(ads, key=lambda a: (a.rate, a.rank, a.id))[:m]], 8)
    for _ in range(6):
        group = [ads[i] for i in rng.choice(len(ads), int(rng.integers(m, m + 3)), replace=False)]
        other = best(group, max(a.rank for a in group))
        se = np.sqrt((light.var(ddof=1) + other.var(ddof=1)) / 4)
        assert light.mean() >= other.mean() - 2 * se, (light, other)


def test_count_limit_is_the_best_over_every_integer_amax():
    """Issue 28's property on a small GPU: no integer Amax 1..n + 1 carries n equal adapters
    unstarved above the measured per-seed limit (brute force over every Amax, the first two
    seeds). The measurement replays every Amax at overload and keeps each near-best one; it does
    not rely on the throughput-vs-Amax curve being unimodal, which it is not."""
    from optim.capacity import LIMIT_RTOL, _unstarved
    n = 24
    c = carry_limit(LLAMA, 8, n, default_lengths(), DUR, SEEDS, 0.9)
    jobs = [(a, v * (1 + 2 * LIMIT_RTOL), s) for s, v in zip(c.seeds[:2], c.per_seed_tps[:2])
            for a in range(1, n + 2)]
    ok = _unstarved(load_profile(LLAMA), 8, n, jobs, default_lengths(), DUR, 0.9, None)
    assert not any(ok), [j for j, good in zip(jobs, ok) if good]


@pytest.mark.parametrize("n,spread,seed,loads", [
    (16, 0.5, 0, (16200, 16400, 16600, 16800)),
    (40, 0.8, 1, (14000, 14100, 14150, 14200, 14400))])
def test_gpus_gpu_excluded_fails_fail_at_fresh_seeds(n, spread, seed, loads, tmp_path,
                                                      monkeypatch):
    """``gpu_excluded``'s spread margin (each bound seed's own best Amax) against draws it never
    saw: GPUs of ``n`` rank-8 adapters at loads across the edge of acceptance; every one it
    excludes scores below 1 at every Amax with each of 12 fresh seeds (100-111), and the sweep
    holds both verdicts (the edge lies inside it)."""
    from optim.feasibility import gpu_excluded
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    verdicts = []
    for load in loads:
        inst = _instance("edge", _gpu(n, spread, seed, float(load)))
        excluded = gpu_excluded(inst, inst.adapters, 8, DUR, workers=2)
        verdicts.append(excluded)
        if not excluded:
            continue
        fresh = _best_scores(inst, inst.adapters, 8, range(100, 112))
        assert (fresh < 1.0).all(), (load, fresh)
    assert any(verdicts) and not all(verdicts), verdicts


@pytest.mark.parametrize("n,load,seed", [(12, 15500.0, 0), (24, 14500.0, 1), (40, 13500.0, 2)])
def test_mixed_rank_gpus_at_the_smallest_rank_score_no_worse(n, load, seed):
    """The premise of the class step on mixed ranks (``class_gpus_excluded`` checks every GPU
    at the server rank of its largest adapter rank, its adapters at the instance's smallest):
    GPUs of ``n`` adapters of ranks 8 / 16 / 32 near the edge of acceptance score no better at
    their own ranks (server rank their largest) than the same adapters at rank 8, at server
    rank 8 or at their largest (best score over every Amax, mean over 4 seeds, within two
    standard errors)."""
    rng = np.random.default_rng(seed)
    w = 1.0 - 0.6 * rng.random(n)
    rates = w / w.sum() * load / PER
    real = [Adapter(f"a{i}", int(rng.choice([8, 16, 32])), float(q)) for i, q in enumerate(rates)]
    low = [Adapter(a.id, 8, a.rate) for a in real]
    inst = _instance("ranks", real)

    def best(group, rank):
        return _best_scores(inst, group, rank, range(4))

    top = max(a.rank for a in real)
    own = best(real, top)
    assert 0.9 < own.mean() < 1.1, own          # near the edge: the premise is tested there
    # the one-rank relaxation, and the rank-tier one (server rank kept, adapters at rank 8)
    for relaxed in (best(low, 8), best(low, top)):
        se = np.sqrt((relaxed.var(ddof=1) + own.var(ddof=1)) / 4)
        assert relaxed.mean() >= own.mean() - 2 * se, (relaxed, own)
