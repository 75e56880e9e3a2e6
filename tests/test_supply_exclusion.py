"""The supply exclusion (optim.supply_exclusion): its test GPU, the recursion, the search
against an oracle that meets the premises, and the premise itself in the twin."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.exact_helpers import assert_study_cache_rule

from optim.supply_exclusion import (best_vector, best_vector_levels, least_work_loads,
                                    load_range, shape_ok,
                                    supply_excluded, supply_group, top_group_size,
                                    uniform_group)


def _prefix(x) -> np.ndarray:
    return np.cumsum(np.sort(np.asarray(x, float))[::-1])


def _majorizes(a, b, tol=1e-6) -> bool:
    """Sorted-descending prefix sums of ``a`` >= those of ``b`` (padded with zeros), equal
    totals."""
    n = max(len(a), len(b))
    pa = _prefix(np.concatenate([a, np.zeros(n - len(a))]))
    pb = _prefix(np.concatenate([b, np.zeros(n - len(b))]))
    return abs(pa[-1] - pb[-1]) <= tol * max(1.0, pb[-1]) and bool(np.all(pa >= pb - tol))


def _instance_loads(rng) -> np.ndarray:
    classes = rng.choice([50.0, 120.0, 300.0, 700.0, 1000.0], size=rng.integers(2, 5),
                         replace=False)
    return np.concatenate([np.full(rng.integers(2, 9), c) for c in classes]
                          + [rng.uniform(10, 60, size=rng.integers(0, 4))])


@pytest.mark.parametrize("seed", range(40))
def test_the_test_gpu_majorizes_every_gpu_of_its_shape(seed):
    rng = np.random.default_rng(seed)
    loads = _instance_loads(rng)
    t = top_group_size(loads) if rng.random() < 0.5 else int(rng.integers(1, len(loads)))
    g = supply_group(loads, t)
    top_ids = set(np.argsort(-loads, kind="stable")[:t])
    for _ in range(20):
        m = int(rng.integers(1, len(loads) + 1))
        pick = rng.choice(len(loads), size=m, replace=False)
        h = sum(int(i in top_ids) for i in pick)
        real = loads[pick]
        # the group is the t heaviest; ties at its edge may fall either side
        if h != int(np.sum(real > g.rest_cap)) and np.any(real == g.rest_cap):
            continue
        e = float(real.sum())
        lo, hi = load_range(g, m, h)
        assert lo - 1e-6 <= e <= hi + 1e-6
        T = least_work_loads(g, m, h, e)
        assert T is not None and len(T) == m
        assert T.max() <= g.largest + 1e-9
        assert _majorizes(T, real), (m, h, e)


@pytest.mark.parametrize("seed", range(20))
def test_the_test_gpu_is_monotone_in_adapters_and_load(seed):
    rng = np.random.default_rng(100 + seed)
    loads = _instance_loads(rng)
    g = supply_group(loads, top_group_size(loads))
    for _ in range(20):
        h = int(rng.integers(0, g.t + 1))
        m = int(rng.integers(max(h, 1), h + len(g.rest)))       # m + 1 has a rest slot
        lo1, hi1 = load_range(g, m + 1, h)
        lo0, hi0 = load_range(g, m, h)
        if max(lo0, lo1) > min(hi0, hi1):
            continue
        e = float(rng.uniform(max(lo0, lo1), min(hi0, hi1)))
        # one more adapter: T(m, e, h) with an idle adapter majorizes T(m + 1, e, h)
        assert _majorizes(least_work_loads(g, m, h, e), least_work_loads(g, m + 1, h, e))
        # more load: every entry (descending) at least as large
        e2 = float(rng.uniform(e, hi0))
        assert np.all(least_work_loads(g, m, h, e2) >= least_work_loads(g, m, h, e) - 1e-9)


def test_a_load_outside_the_shape_has_no_test_gpu():
    g = supply_group([10.0, 10.0, 5.0, 1.0], 2)
    assert load_range(g, 2, 1) == (11.0, 15.0)
    assert least_work_loads(g, 2, 1, 10.0) is None and least_work_loads(g, 2, 1, 16.0) is None
    assert least_work_loads(g, 3, 3, 20.0) is None                   # only 2 in the group
    assert list(least_work_loads(g, 2, 1, 13.0)) == [10.0, 3.0]


@pytest.mark.parametrize("seed", range(25))
def test_best_vector_agrees_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, t, k = int(rng.integers(1, 7)), int(rng.integers(0, 4)), int(rng.integers(1, 4))
    t = min(t, n)
    U = rng.uniform(0, 10, size=(n + 1, t + 1))
    U[rng.random(U.shape) < 0.2] = -np.inf
    U[0, 0] = 0.0
    for m in range(n + 1):
        U[m, m + 1:] = -np.inf
    best, shapes = best_vector(U, k)
    brute = -np.inf
    cells = [(m, h) for m in range(n + 1) for h in range(t + 1) if np.isfinite(U[m, h])]
    for vec in itertools.product(cells, repeat=k):
        if sum(c[0] for c in vec) == n and sum(c[1] for c in vec) == t:
            brute = max(brute, sum(U[c] for c in vec))
    assert best == pytest.approx(brute) if np.isfinite(brute) else best == -np.inf
    if np.isfinite(brute):
        assert len(shapes) == k
        assert sum(s[0] for s in shapes) == n and sum(s[1] for s in shapes) == t
        assert sum(U[s] for s in shapes) == pytest.approx(best)


def _oracle(cost):
    """A GPU fails when sum_i sqrt(load_i) exceeds ``cost``: more load or more adapters cost
    more, concentrating load costs less (sqrt is concave) — the premises the exclusion rests
    on."""
    return lambda loads: float(np.sum(np.sqrt(np.asarray(loads, float)))) > cost


def _feasible_on(loads, k, fails) -> bool:
    """Some placement of every adapter on at most k GPUs with no GPU failing (brute force)."""
    n = len(loads)
    for assign in itertools.product(range(k), repeat=n - 1):
        groups = [[loads[0]]] + [[] for _ in range(k - 1)]
        for i, gpu in enumerate(assign, start=1):
            groups[gpu].append(loads[i])
        if all(not grp or not fails(np.array(grp)) for grp in groups):
            return True
    return False


def _oracle_case(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 10))
    loads = np.sort(rng.choice([1.0, 2.0, 4.0, 9.0, 16.0], size=n))[::-1]
    k = int(rng.integers(2, 4))
    return loads, k, _oracle(float(rng.uniform(2.0, 8.0)))


ORACLE_SEEDS = range(60)


@pytest.mark.parametrize("seed", ORACLE_SEEDS)
def test_supply_exclusion_is_sound_against_an_oracle(seed):
    loads, k, fails = _oracle_case(seed)
    # no count-aware cap in the oracle's world: a GPU carries at most the whole load
    if supply_excluded(loads, k, float(loads.sum()), float(loads.sum()), fails, 200):
        assert not _feasible_on(list(loads), k, fails), (list(loads), k)


def test_supply_exclusion_proves_cases_the_shapes_alone_do_not():
    proven = 0
    for seed in ORACLE_SEEDS:
        loads, k, fails = _oracle_case(seed)
        L = float(loads.sum())
        # with no check, only the most each shape can offer bounds it: never below the load
        assert not supply_excluded(loads, k, L, L, fails, max_checks=0)
        proven += supply_excluded(loads, k, L, L, fails, 200)
    assert proven >= 40


def test_the_test_gpu_scores_no_worse_than_gpus_of_its_shape_in_the_twin(tmp_path):
    """The premise in the twin: on a GPU that must swap (four slots) near or above saturation, the
    least-work GPU of a shape (adapters, how many of the heaviest, load; smallest rank) scores
    at least as well as sampled real GPUs of that shape at their own ranks (best score over
    every Amax, mean over 4 seeds, within two standard errors)."""
    from optim.amax_search import twin_scores
    from optim.instance import instance_from_dict
    from optim.placement import plan_gpu
    from tests.slot_profiles import four_slot_profile
    from twin.workload import Adapter

    dur = 300.0
    prof = four_slot_profile(tmp_path)
    rng = np.random.default_rng(1)
    rates = [x * 2.0 for x in [4.0] * 4 + [2.0] * 5 + [1.0] * 5 + [0.5] * 4]
    ads = [Adapter(f"a{i:02d}", (8, 16)[i % 2], r) for i, r in enumerate(rates)]
    inst = instance_from_dict({
        "name": "supply", "adapters": [{"id": a.id, "rank": a.rank, "rate": a.rate} for a in ads],
        "gpus": [{"name": "g", "profile": prof, "count": 4}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": dur})
    per = inst.mean_tokens
    g = supply_group([a.rate * per for a in ads], 4)

    def best(group, rank):
        plan = plan_gpu("g", prof, 1, [(a, 1.0) for a in group], per, rank)
        return np.array([max(v for v, _ in twin_scores(inst, plan, [1, 2, 3, 4], s, dur, 2))
                         for s in range(4)])

    for _ in range(5):
        m = int(rng.integers(5, 9))
        group = [ads[i] for i in rng.choice(len(ads), m, replace=False)]
        h = sum(a.rate == 8.0 for a in group)
        e = sum(a.rate for a in group) * per
        T = least_work_loads(g, m, h, e)
        easy = best([Adapter(f"t{i}", 8, float(q) / per) for i, q in enumerate(T) if q > 0], 8)
        real = best(group, max(a.rank for a in group))
        se = np.sqrt((easy.var(ddof=1) + real.var(ddof=1)) / 4)
        assert easy.mean() >= real.mean() - 2 * se, (m, h, easy, real)


def test_a_certificate_tries_the_supply_exclusion_last(monkeypatch):
    from optim import feasibility as F
    from optim.instance import instance_from_dict

    inst = instance_from_dict({
        "name": "supply-cert", "adapters": [{"id": f"a{i:03d}", "rank": 8,
                                             "rate": 2.0 if i < 4 else 0.5} for i in range(20)],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 8}],
        "duration_s": 120.0})
    for name in ("one_gpu_excluded", "fullest_gpu_excluded", "busiest_gpu_excluded",
                 "two_gpu_splits_excluded", "two_gpus_excluded"):
        monkeypatch.setattr(F, name, lambda *a, **k: False)
    calls = []

    def supply(inst, k, duration_s, workers=None, max_checks=None):
        calls.append(k)
        return k == 3
    monkeypatch.setattr(F, "supply_gpus_excluded", supply)
    pair = []
    monkeypatch.setattr(F, "pair_supply_gpus_excluded",
                        lambda *a, **k: pair.append(1) or len(pair) > 1)
    assert F.raise_bound_to(inst, 3, 4, 120.0) == 4
    assert F.raise_bound_to(inst, 2, 3, 120.0) == 2          # neither shows two GPUs
    assert calls == [3, 2] and pair == [1]
    assert F.raise_bound_to(inst, 2, 3, 120.0) == 3          # the two classes' supply does
    assert F.raise_bound_to(inst, 4, 5, 120.0) == 4 and pair == [1, 1]   # two GPUs only
    # equal adapters have no lighter supply to count: not run, and not shown
    monkeypatch.undo()
    same = instance_from_dict({**inst.to_dict(), "adapters": [
        {"id": f"a{i:03d}", "rank": 8, "rate": 0.5} for i in range(20)]})
    assert F.supply_gpus_excluded(same, 3, 120.0) is False


def test_a_studys_cached_success_holds_for_a_solve(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import optim.supply_exclusion as S
    from optim import feasibility as F
    from optim.instance import instance_from_dict

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    inst = instance_from_dict({
        "name": "supply-cache", "adapters": [{"id": f"a{i:03d}", "rank": 8,
                                              "rate": 2.0 if i < 4 else 0.5} for i in range(20)],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 8}],
        "duration_s": 120.0})
    monkeypatch.setattr(F, "twin_lower_bound",
                        lambda *a, **k: SimpleNamespace(count_cap_tps=1e9))
    budgets = []

    def fake(loads, k, total, cap, check, checks, progress=None, ranks=None):
        budgets.append(checks)
        return checks >= S.SUPPLY_CHECKS
    monkeypatch.setattr(S, "supply_excluded", fake)
    assert_study_cache_rule(lambda **kw: F.supply_gpus_excluded(inst, 3, 120.0, **kw),
                            S.SUPPLY_CHECKS, budgets)


def test_a_shape_whose_least_load_fails_is_ruled_out():
    # two GPUs, 2 heavy (10) and 6 light (1) adapters; a GPU fails with more than 4 light
    # adapters whatever its load: every shape carries exactly its least load, and the split
    # the loads allow (1 heavy + 3 light each) is the only one that passes
    loads = np.array([10.0, 10.0] + [1.0] * 6)

    def fails(vec):
        return int(np.sum((vec > 0) & (vec < 5))) > 3

    assert not supply_excluded(loads, 2, float(loads.sum()), 1e9, fails, 50)

    def fails_more(vec):
        return int(np.sum((vec > 0) & (vec < 5))) > 2

    assert supply_excluded(loads, 2, float(loads.sum()), 1e9, fails_more, 50)
    assert not _feasible_on(list(loads), 2, fails_more)


@pytest.mark.parametrize("seed", range(4))
def test_one_more_group_adapter_majorizes_when_the_group_is_uniform(seed):
    """**Fewer from the group**: T(m, E, h) majorizes T(m, E, h - 1) wherever both exist, when
    every group adapter offers the same load (the default group)."""
    rng = np.random.default_rng(seed)
    tested = 0
    for _ in range(400):
        n = int(rng.integers(3, 40))
        classes = rng.choice([0.5, 1.0, 2.0, 3.0, 5.0, 8.0], size=int(rng.integers(2, 5)),
                             replace=False)
        loads = rng.choice(classes, size=n)
        if len(set(loads)) < 2:
            continue
        g = supply_group(loads, top_group_size(loads))
        assert uniform_group(g)
        m, h = int(rng.integers(1, n + 1)), int(rng.integers(1, g.t + 1))
        if not (shape_ok(g, m, h) and shape_ok(g, m, h - 1)):
            continue
        lo = max(load_range(g, m, h)[0], load_range(g, m, h - 1)[0])
        hi = min(load_range(g, m, h)[1], load_range(g, m, h - 1)[1])
        if lo > hi:
            continue
        e = float(rng.uniform(lo, hi))
        more, fewer = least_work_loads(g, m, h, e), least_work_loads(g, m, h - 1, e)
        assert np.all(np.cumsum(more) >= np.cumsum(fewer) - 1e-9), (list(loads), m, h, e)
        tested += 1
    assert tested >= 50
    spread = supply_group(np.array([1.0, 2.0, 5.0, 6.0]), 2)     # group loads 6 and 5
    assert not uniform_group(spread)


def test_an_earlier_searchs_success_holds_but_not_its_failure(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import optim.supply_exclusion as S
    from optim import feasibility as F
    from optim.capacity import _disk_put
    from optim.instance import instance_from_dict

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    inst = instance_from_dict({
        "name": "supply-versions", "adapters": [{"id": f"a{i:03d}", "rank": 8,
                                                 "rate": 2.0 if i < 4 else 0.5}
                                                for i in range(20)],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 8}],
        "duration_s": 120.0})
    monkeypatch.setattr(F, "twin_lower_bound",
                        lambda *a, **k: SimpleNamespace(count_cap_tps=1e9))
    calls = []
    monkeypatch.setattr(S, "supply_excluded", lambda *a, **k: calls.append(1) or False)
    old = min(S.SUPPLY_SOUND_VERSIONS)
    assert old < S.SUPPLY_VERSION

    def put(k, excluded):
        _disk_put(F._gpu_key(inst, inst.adapters, 8, 120.0,
                             what=f"supply_gpus_excluded/{old}/{k}/{S.SUPPLY_CHECKS}"),
                  {"excluded": excluded})
    put(3, False)                   # an earlier search's "not shown" is searched again ...
    assert F.supply_gpus_excluded(inst, 3, 120.0) is False and calls == [1]
    put(4, True)                    # ... its exclusion is a proof and holds
    assert F.supply_gpus_excluded(inst, 4, 120.0, max_checks=0) is True and calls == [1]


@pytest.mark.parametrize("seed", range(8))
def test_best_vector_levels_agrees_with_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    n, t, k = int(rng.integers(3, 6)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
    q = 2 + seed % 2                                     # two or three levels
    base = np.where(rng.random((n + 1, t + 1)) < 0.8, rng.uniform(0, 10, (n + 1, t + 1)),
                    -np.inf)
    Us = [base - lv * rng.uniform(0, 2, base.shape) for lv in range(q)]   # higher: less
    for U in Us:
        U[0, 0] = 0.0
    needs = [(0, 0)]
    for _ in range(1, q):                               # nested: fewer at higher levels
        c0, t0 = needs[-1]
        needs.append((int(rng.integers(max(c0, 1), n + 1)) if c0 == 0 else
                      int(rng.integers(0, c0 + 1)), int(rng.integers(0, t + 1))))
    needs = [needs[0]] + sorted(needs[1:], reverse=True)
    best, shapes = best_vector_levels(Us, k, needs)
    cells = [(m, h) for m in range(n + 1) for h in range(t + 1)]

    def meets(vec, lv):
        return all(sum(v[0] for v, x in zip(vec, lv) if x >= ell) >= needs[ell][0]
                   and sum(v[1] for v, x in zip(vec, lv) if x >= ell) >= needs[ell][1]
                   for ell in range(1, q))
    brute = -np.inf
    for lv in itertools.product(range(q), repeat=k):
        for vec in itertools.product(cells, repeat=k):
            if (sum(v[0] for v in vec) == n and sum(v[1] for v in vec) == t
                    and meets(vec, lv)):
                brute = max(brute, sum(Us[x][v] for v, x in zip(vec, lv)))
    if not np.isfinite(brute):
        assert best == -np.inf
        return
    assert best == pytest.approx(brute)
    assert len(shapes) == k
    vec, lv = [(m, h) for _, m, h in shapes], [x for x, _, _ in shapes]
    assert sum(m for m, _ in vec) == n and sum(h for _, h in vec) == t and meets(vec, lv)
    assert sum(Us[x][m, h] for x, m, h in shapes) == pytest.approx(best)


def _ranked_oracle_case(seed):
    """Loads, a rank per adapter (8, 16 or 32), k, and a world where a GPU fails when sum_i
    sqrt(load_i) x its rank's slowdown (the largest rank it holds) exceeds a cost."""
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(4, 9))
    loads = np.sort(rng.choice([1.0, 2.0, 4.0, 9.0, 16.0], size=n))[::-1]
    ranks = rng.choice([8, 16, 32], size=n)
    k = int(rng.integers(2, 4))
    cost = float(rng.uniform(2.0, 8.0))
    slow = {8: 1.0, 16: float(rng.uniform(1.0, 1.3))}
    slow[32] = slow[16] * float(rng.uniform(1.0, 1.3))

    def fails(vec, rank=8):
        return float(np.sum(np.sqrt(np.asarray(vec, float)))) * slow[rank] > cost
    return loads, ranks, k, fails


def _ranked_feasible_on(loads, ranks, k, fails) -> bool:
    n = len(loads)
    for assign in itertools.product(range(k), repeat=n - 1):
        gpus = [0] + list(assign)
        if all(not any(g == i for g in gpus)
               or not fails(np.array([loads[j] for j in range(n) if gpus[j] == i]),
                            max(ranks[j] for j in range(n) if gpus[j] == i))
               for i in range(k)):
            return True
    return False


def test_the_ranked_supply_exclusion_is_sound_and_proves_more():
    proven_ranked = proven_plain = infeasible = 0
    for seed in range(40):
        loads, ranks, k, fails = _ranked_oracle_case(seed)
        L = float(loads.sum())
        feasible = _ranked_feasible_on(list(loads), list(ranks), k, fails)
        infeasible += not feasible
        ranked = supply_excluded(loads, k, L, L, fails, 200, ranks=ranks)
        if ranked:
            assert not feasible, (list(loads), list(ranks), k)
        proven_ranked += ranked
        proven_plain += supply_excluded(loads, k, L, L, lambda v: fails(v, 8), 200)
    # measured: 30 of the 32 infeasible cases proven with ranks, 25 with every GPU at rank 8
    assert proven_ranked > proven_plain and proven_ranked >= 0.8 * infeasible


def test_a_balanced_split_not_shown_failing_ends_the_search_at_once():
    loads = np.array([9.0] * 6 + [1.0] * 30)
    calls = []

    def never(vec):
        calls.append(len(vec))
        return False
    assert not supply_excluded(loads, 3, float(loads.sum()), 1e9, never, 100)
    assert calls == [12]                  # one shape: 12 adapters, 2 of the group, L / 3
    calls.clear()
    odd = np.array([9.0] * 5 + [1.0, 3.0] * 15)   # 35 adapters, 5 heavy, 2 GPUs: two shapes
    assert not supply_excluded(odd, 2, float(odd.sum()), 1e9, never, 100)
    assert sorted(calls) == [17, 18]
