"""The load-class exclusion (``optim.class_exclusion``): classes, dominance, shrinking, and
soundness against brute force in an oracle world that meets the premises (a GPU fails when the
sum of the square roots of its loads exceeds a cost: adding an adapter or raising a load never
helps)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from optim.class_exclusion import class_excluded, load_classes, shrink
from tests.exact_helpers import assert_study_cache_rule


def dominates(c, f) -> bool:
    """Class-count vector ``c`` dominates ``f`` (module docstring of ``optim.class_exclusion``):
    every prefix sum, heaviest class first, is at least ``f``'s."""
    return bool(np.all(np.cumsum(c) >= np.cumsum(f)))


def test_load_classes_group_equal_loads_heaviest_first():
    c = load_classes([1.0, 4.0, 2.0, 4.0, 1.0, 1.0])
    assert c.loads == (4.0, 2.0, 1.0) and c.supply == (2, 1, 3) and c.n == 6
    assert c.vector_loads([1, 0, 2]) == [4.0, 1.0, 1.0]


def test_dominance_is_adding_or_moving_to_heavier_classes():
    assert dominates([1, 0, 0], [0, 0, 1])          # moved to a heavier class
    assert dominates([0, 1, 1], [0, 1, 0])          # one added
    assert not dominates([0, 0, 2], [1, 0, 0])      # two light ones are not one heavy
    assert dominates([2, 0], [1, 1]) and not dominates([1, 1], [2, 0])


def test_shrink_keeps_a_failing_vector_dominated_by_the_input():
    loads = (9.0, 4.0, 1.0)

    def fails(c):
        return sum(math.sqrt(w) * k for w, k in zip(loads, c)) > 5.5
    c = [1, 2, 3]
    s = shrink(c, fails, steps=10)
    assert fails(s) and dominates(c, s) and sum(s) < sum(c)
    # one adapter fewer (its lightest dropped) no longer fails
    drop = list(s)
    j = max(i for i, k in enumerate(drop) if k)
    drop[j] -= 1
    assert not fails(drop)


def _oracle(cost: float):
    return lambda loads: float(np.sum(np.sqrt(loads))) > cost


def _splits(supply, k):
    """Every way to give k GPUs class-count vectors summing to ``supply`` (GPUs unordered)."""
    per_class = []
    for s in supply:
        per_class.append([c for c in itertools.product(range(s + 1), repeat=k) if sum(c) == s])
    for combo in itertools.product(*per_class):
        yield [[combo[j][i] for j in range(len(supply))] for i in range(k)]


def _feasible(loads_by_class, supply, k, fails, cap):
    for gpus in _splits(supply, k):
        ok = True
        for c in gpus:
            v = [w for w, n in zip(loads_by_class, c) for _ in range(n)]
            if v and (fails(v) or sum(v) > cap(len(v)) + 1e-9):
                ok = False
                break
        if ok:
            return True
    return False


@pytest.mark.parametrize("seed", range(30))
def test_never_excludes_a_feasible_k_and_proves_most_infeasible_ones(seed):
    rng = np.random.default_rng(seed)
    J = int(rng.integers(2, 4))
    loads_by_class = sorted((float(x) for x in rng.choice([1, 2, 4, 8, 16], J, replace=False)),
                            reverse=True)
    supply = [int(x) for x in rng.integers(1, 4, J)]
    loads = [w for w, s in zip(loads_by_class, supply) for _ in range(s)]
    k = int(rng.integers(2, 4))
    cost = float(np.sum(np.sqrt(loads))) / k * float(rng.uniform(0.8, 1.3))
    fails = _oracle(cost)
    cap_n = float(rng.uniform(0.5, 1.2)) * sum(loads) / k * 1.5

    def cap(n):
        return cap_n if n >= 3 else math.inf

    feasible = _feasible(loads_by_class, supply, k, fails, cap)
    trace: dict = {}
    got = class_excluded(loads, k, cap, fails, max_checks=200, trace=trace)
    assert not (got and feasible), "excluded a k the oracle can serve"
    assert trace["master_wall_s"] >= 0 and trace["master_fallback_seeds"] >= 0
    if not got:     # the split that ended the search holds the supply and passes
        split = trace["passing"]
        assert trace["why"] == "a proposed split passes every check"
        assert [sum(c[j] for c in split) for j in range(J)] == supply
        assert not any(fails([w for w, n in zip(loads_by_class, c) for _ in range(n)])
                       for c in split if sum(c))
    # with enough checks, an infeasible k is shown: the search is complete in a world where
    # the check is exact (every proposed GPU that passes is really accepted)
    assert got == (not feasible)


@pytest.mark.parametrize("seed", range(12))
def test_no_check_is_spent_on_a_gpu_that_a_passing_one_spreads(seed):
    """A GPU easier than one shown passing (the passing one spreads it) passes without a
    replay, as one harder than a failure fails without one: no replayed vector is spread by
    an earlier failure or spread *by* an earlier pass; the verdict is the brute force's."""
    from optim.class_exclusion import spreads
    rng = np.random.default_rng(500 + seed)
    J = 3
    loads_by_class = sorted((float(x) for x in rng.choice([1, 2, 4, 8, 16], J, replace=False)),
                            reverse=True)
    supply = [int(x) for x in rng.integers(2, 5, J)]
    loads = [w for w, s in zip(loads_by_class, supply) for _ in range(s)]
    k = int(rng.integers(2, 4))
    oracle = _oracle(float(np.sum(np.sqrt(loads))) / k * float(rng.uniform(0.85, 1.3)))
    replayed: list[tuple[list[float], bool]] = []

    def fails(v):
        out = oracle(v)
        for u, failed in replayed:
            assert not (failed and spreads(v, u)) and not (not failed and spreads(u, v)), v
        replayed.append((list(v), out))
        return out

    got = class_excluded(loads, k, lambda n: math.inf, fails, max_checks=500)
    assert got == (not _feasible(loads_by_class, supply, k, oracle, lambda n: math.inf))
    assert replayed


@pytest.mark.parametrize("seed", range(6))
def test_a_search_resumed_from_any_saved_round_ends_as_the_uninterrupted_one(seed):
    """The progress saved after each round (``save``) lets a stopped search go on
    (``resume``): from every saved round it ends with the same verdict, checks, rounds, cuts
    and passing split, and asks ``fails`` only about what the uninterrupted search asked
    after that round; a state of another search is refused."""
    import json
    rng = np.random.default_rng(100 + seed)
    asked: list = []

    def fails(v, rank=None):
        asked.append((tuple(v), rank))
        return oracle(v) if rank is None else oracle(list(v) + [0.5] * (rank == 32))

    for _ in range(50):         # a search of several rounds (most draws end in one or two)
        loads_by_class = [8.0, 4.0, 2.0, 1.0]
        supply = [int(x) for x in rng.integers(1, 4, 4)]
        loads = [w for w, n in zip(loads_by_class, supply) for _ in range(n)]
        ranks = [(8, 32)[i % 2] for i in range(len(loads))] if seed % 2 else None
        oracle = _oracle(float(np.sum(np.sqrt(loads))) / 2 * float(rng.uniform(0.8, 1.1)))
        asked.clear()
        states: list = []
        trace: dict = {}
        got = class_excluded(loads, 2, lambda n: math.inf, fails, max_checks=300, trace=trace,
                             ranks=ranks,
                             save=lambda st: states.append(json.loads(json.dumps(st))))
        if len(states) >= 3:
            break
    full = list(asked)
    assert len(states) >= 3 and states[-1]["rounds"] == len(trace["cuts"])
    for st in states:
        asked.clear()
        t2: dict = {}
        again = class_excluded(loads, 2, lambda n: math.inf, fails, max_checks=300, trace=t2,
                               ranks=ranks, resume=st)
        assert again == got
        for f in ("why", "checks", "rounds", "cuts", "passing"):
            assert t2.get(f) == trace.get(f), f
        assert asked == full[len(full) - len(asked):]       # only the later checks
    with pytest.raises(ValueError, match="another search"):
        class_excluded([x * 2 for x in loads], 2, lambda n: math.inf, fails, ranks=ranks,
                       resume=states[0])


@pytest.mark.parametrize("seed", range(20))
def test_spreading_covers_dominance_and_never_lowers_a_schur_concave_cost(seed):
    """``spreads(c, f)``: c is f with adapters added, loads raised or spread. Prefix dominance of
    class vectors is a special case, and an increasing Schur-concave cost (the sum of square
    roots) of c is never below f's."""
    from optim.class_exclusion import spreads
    rng = np.random.default_rng(seed)
    w = sorted((float(x) for x in rng.choice([1, 2, 4, 8, 16, 32], 4, replace=False)),
               reverse=True)
    for _ in range(200):
        f = [int(x) for x in rng.integers(0, 4, 4)]
        c = [int(x) for x in rng.integers(0, 4, 4)]
        fv = [x for x, k in zip(w, f) for _ in range(k)]
        cv = [x for x, k in zip(w, c) for _ in range(k)]
        if dominates(c, f):
            assert spreads(cv, fv)
        if spreads(cv, fv):
            assert np.sum(np.sqrt(cv)) >= np.sum(np.sqrt(fv)) - 1e-9
    # spreading one heavy adapter's load over two: covered; the reverse is not
    assert spreads([4.0, 4.0], [8.0]) and not spreads([8.0], [4.0, 4.0])
    assert not spreads([8.0, 0.5], [4.0, 4.0])


def _cert_instance():
    from optim.instance import instance_from_dict
    return instance_from_dict({
        "name": "class-cert", "adapters": [{"id": f"a{i:03d}", "rank": 8,
                                            "rate": (2.0, 1.0, 0.5)[i % 3]} for i in range(24)],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 8}],
        "duration_s": 120.0})


def test_a_certificate_runs_the_class_exclusion_with_the_studys_budget(monkeypatch):
    """``raise_bound_to``: the class step runs with its full budget where the study spends the
    supply budget, reads the cache only on a solve's path, and its success raises the bound."""
    from optim import feasibility as F
    inst = _cert_instance()
    for name in ("one_gpu_excluded", "fullest_gpu_excluded", "busiest_gpu_excluded",
                 "two_gpu_splits_excluded", "two_gpus_excluded", "supply_gpus_excluded",
                 "pair_supply_gpus_excluded"):
        monkeypatch.setattr(F, name, lambda *a, **k: False)
    calls = []

    def cls(inst, k, duration_s, workers=None, max_checks=None, cached_only=False):
        calls.append((k, "cache" if cached_only else max_checks))
        return k == 3 and max_checks is None
    monkeypatch.setattr(F, "class_gpus_excluded", cls)
    assert F.raise_bound_to(inst, 3, 4, 120.0) == 3                      # a solve: cache only
    assert F.raise_bound_to(inst, 3, 4, 120.0, supply_checks=128) == 4   # a study
    assert F.raise_bound_to(inst, 2, 3, 120.0, supply_checks=128) == 2
    # a study reads the searches' cached successes first (max_checks 0), then runs them
    assert calls == [(3, 0), (3, "cache"), (3, None), (2, "cache"), (2, None)]
    del calls[:]                                # a study's own budget (--class-checks)
    assert F.raise_bound_to(inst, 3, 4, 120.0, supply_checks=128, class_checks=900) == 3
    assert F.raise_bound_to(inst, 3, 4, 120.0, class_checks=900) == 3   # a solve: still 0
    assert calls == [(3, "cache"), (3, 900), (3, 0)]


def test_a_studys_class_exclusion_holds_for_a_solve(tmp_path, monkeypatch):
    """The checked search: a study's success holds for a solve, a smaller budget's failure does
    not; the caps-only stage runs first (also on a solve's path, it replays nothing); with
    several ranks the checked search runs too, every GPU checked at the smallest rank."""
    from types import SimpleNamespace

    import optim.class_exclusion as C
    from optim import feasibility as F
    from optim.instance import instance_from_dict
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    inst = _cert_instance()
    monkeypatch.setattr(F, "twin_lower_bound", lambda *a, **k: SimpleNamespace(count_cap_tps=1e9))
    budgets, caps_only = [], []

    def fake(loads, k, cap_of, fails, checks, progress=None, trace=None, ranks=None, **_):
        assert C.load_classes(loads).supply == (8, 8, 8) and cap_of(5) == 1e9
        if fails is None:
            caps_only.append(k)
            return False
        budgets.append(checks)
        return checks >= C.CLASS_CHECKS
    monkeypatch.setattr(C, "class_excluded", fake)
    assert_study_cache_rule(lambda **kw: F.class_gpus_excluded(inst, 3, 120.0, **kw),
                            C.CLASS_CHECKS, budgets)
    assert caps_only == [3]                       # once: its "not shown" is cached
    # several ranks: the checked search too, at the GPU's largest rank, adapters at the smallest
    two = instance_from_dict({**inst.to_dict(), "adapters": [
        {"id": f"a{i:03d}", "rank": (8, 16)[i % 2], "rate": (2.0, 1.0, 0.5)[i % 3]}
        for i in range(24)]})
    checked = []
    monkeypatch.setattr(F, "gpu_excluded", lambda inst_, ads, rank, *a, **k:
                        checked.append((rank, {x.rank for x in ads})) or True)
    real = C.class_excluded

    def probe(loads, k, cap_of, fails, checks, progress=None, trace=None, ranks=None, **_):
        assert sorted(set(ranks)) == [8, 16]
        if fails is not None:
            fails(list(loads[:3]), 16)
        return fake(loads, k, cap_of, fails, checks, progress, trace)
    monkeypatch.setattr(C, "class_excluded", probe)
    assert F.class_gpus_excluded(two, 3, 120.0) is True and len(budgets) == 3
    assert caps_only == [3, 3] and checked == [(16, {8})]   # server rank 16, adapters at 8
    assert F.class_gpus_excluded(two, 3, 120.0) is True and caps_only == [3, 3]   # cached
    monkeypatch.setattr(C, "class_excluded", real)
    # where the caps and the supply alone exclude k, no GPU is checked
    monkeypatch.setattr(C, "class_excluded",
                        lambda loads, k, cap_of, fails, checks, progress=None, trace=None,
                        ranks=None, **_: fails is None or pytest.fail("checked search ran"))
    assert F.class_gpus_excluded(inst, 2, 120.0, max_checks=0) is True
    assert F.class_gpus_excluded(two, 2, 120.0, max_checks=0) is True


def _fake_checked_search(tmp_path, monkeypatch, saved) -> list:
    """``class_gpus_excluded`` on ``_cert_instance`` with a fresh disk cache and
    ``class_excluded`` replaced by a stand-in that records each call's
    ``(fails is None, resume, save is None)`` and has a checked search save
    ``saved(calls so far)``; returns the record."""
    from types import SimpleNamespace

    import optim.class_exclusion as C
    from optim import feasibility as F
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    monkeypatch.setattr(F, "twin_lower_bound", lambda *a, **k: SimpleNamespace(count_cap_tps=1e9))
    seen: list = []

    def fake(loads, k, cap_of, fails, checks, progress=None, trace=None, ranks=None,
             resume=None, save=None):
        seen.append((fails is None, resume, save is None))
        if fails is not None:
            save(saved(len(seen)))
        return False
    monkeypatch.setattr(C, "class_excluded", fake)
    return seen


def test_a_stopped_checked_search_resumes_from_its_saved_progress(tmp_path, monkeypatch):
    """``class_gpus_excluded`` saves the checked search's progress on disk every round and
    hands it back to the next search of the same instance and k (a larger budget, a rerun);
    the caps-only stage neither saves nor resumes."""
    from optim import feasibility as F
    seen = _fake_checked_search(tmp_path, monkeypatch, lambda n: {"v": 1, "rounds": n})
    inst = _cert_instance()
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=20) is False
    assert seen[0] == (True, None, True)                       # caps only
    assert seen[1] == (False, None, False)                     # nothing saved yet
    assert seen[2] == (False, {"v": 1, "rounds": 2}, False)    # the first search's progress
    assert F.class_gpus_excluded(inst, 2, 120.0, max_checks=10) is False
    assert seen[-1][1] is None                                 # another k: its own


def test_a_search_saved_in_the_store_goes_on_where_the_user_cache_is_empty(tmp_path,
                                                                           monkeypatch):
    """With a search store (``$LORA_PLACEMENT_STORE``, a study's ``--search-store``) the
    checked search's progress and verdicts are written there too: a later session on a machine
    whose user cache is empty resumes the stopped search from the store; where the cache and
    the store both hold progress, the furthest is taken."""
    from optim import feasibility as F
    from optim.capacity import STORE_ENV
    from optim.disk_cache import read_json
    store = tmp_path / "store.json"
    monkeypatch.setenv(STORE_ENV, str(store))
    seen = _fake_checked_search(tmp_path / "first", monkeypatch,
                                lambda n: {"checks": 10 * n, "rounds": n, "cuts": []})
    inst = _cert_instance()
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    saved = read_json(store)
    assert {"checks": 20, "rounds": 2, "cuts": []} in saved.values()  # the progress
    assert any(v.get("excluded") is False for v in saved.values())  # the verdict
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path / "second"))   # an empty cache
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=20) is False
    assert seen[-1][1] == {"checks": 20, "rounds": 2, "cuts": []}
    # the store behind the cache: the cache's furthest progress is taken, and vice versa
    monkeypatch.delenv(STORE_ENV)
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=30) is False   # cache only: 4
    monkeypatch.setenv(STORE_ENV, str(store))
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=40) is False
    assert seen[-1][1] == {"checks": 50, "rounds": 5, "cuts": []}  # the cache's, ahead
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path / "first"))   # holds round 2
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=50) is False
    assert seen[-1][1] == {"checks": 60, "rounds": 6, "cuts": []}  # the store's, ahead
    assert F.class_search_status(inst, 3, 120.0).checks == 70


def test_an_unwritable_search_store_warns_once_and_keeps_the_cache(tmp_path, monkeypatch):
    from optim import capacity
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(capacity.STORE_ENV, str(tmp_path / "no" / "such" / "dir" / "s.json"))
    (tmp_path / "no").write_text("a file where a folder would be")
    with pytest.warns(UserWarning, match="cannot write the search store"):
        capacity._disk_put("a", {"x": 1}, durable=True)
    capacity._disk_put("b", {"x": 2}, durable=True)                # warned once
    assert capacity._disk_get("a") == {"x": 1} and capacity._disk_get("b") == {"x": 2}


def test_an_exclusion_found_with_a_larger_budget_is_read_by_every_later_call(tmp_path,
                                                                            monkeypatch):
    """A checked search that excludes only with a larger budget than the default (a study's
    ``--class-checks``) is recorded so that every later call reads it without searching: the
    default budget, a solve's path (0) and the cache alone."""
    import optim.class_exclusion as C
    from optim import feasibility as F
    seen = _fake_checked_search(tmp_path, monkeypatch, lambda n: {"v": 1, "rounds": n})
    monkeypatch.setattr(C, "class_excluded",
                        lambda loads, k, cap_of, fails, checks, **kw:
                        seen.append(checks) or (fails is not None and checks >= 500))
    inst = _cert_instance()
    assert F.class_gpus_excluded(inst, 3, 120.0) is False          # the default budget
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=600) is True
    searched = len(seen)
    assert seen[-1] == 600
    assert F.class_gpus_excluded(inst, 3, 120.0) is True
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=0) is True
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=0, cached_only=True) is True
    assert len(seen) == searched                                   # none searched again
    assert F.class_gpus_excluded(inst, 2, 120.0, max_checks=0) is False   # another k: its own


def test_a_search_of_a_new_version_resumes_an_earlier_sound_versions_progress(tmp_path,
                                                                              monkeypatch):
    """The saved cuts and checks are facts of the twin, whatever search found them: after a
    version bump the checked search resumes the latest sound version's progress (and saves
    under its own); a version no longer sound is not read."""
    import optim.class_exclusion as C
    from optim import feasibility as F
    seen = _fake_checked_search(tmp_path, monkeypatch,
                                lambda n: {"v": 1, "by": C.CLASS_VERSION, "rounds": n})
    inst = _cert_instance()
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    old = C.CLASS_VERSION
    monkeypatch.setattr(C, "CLASS_VERSION", old + 1)
    monkeypatch.setattr(C, "CLASS_SOUND_VERSIONS", C.CLASS_SOUND_VERSIONS + (old + 1,))
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    assert seen[-1][1] == {"v": 1, "by": old, "rounds": 2}     # the earlier version's
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=20) is False
    assert seen[-1][1]["by"] == old + 1                        # then its own
    monkeypatch.setattr(C, "CLASS_VERSION", old + 2)
    monkeypatch.setattr(C, "CLASS_SOUND_VERSIONS", (old + 2,))
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    assert seen[-1][1] is None                                 # none of them sound


def test_a_spread_gpu_scores_no_better_in_the_twin(tmp_path):
    """The premise in the twin: on a GPU that must swap (four slots) near or above saturation, a
    GPU that ``spreads`` another (adapters added, load moved to lighter adapters, loads raised)
    scores no better (best score over every Amax, mean over 4 seeds, within two standard
    errors)."""
    from optim.amax_search import twin_scores
    from optim.class_exclusion import spreads
    from optim.instance import instance_from_dict
    from optim.placement import plan_gpu
    from tests.slot_profiles import four_slot_profile
    from twin.workload import Adapter

    dur = 300.0
    prof = four_slot_profile(tmp_path)
    inst = instance_from_dict({
        "name": "spread", "adapters": [{"id": "x", "rank": 8, "rate": 1.0}],
        "gpus": [{"name": "g", "profile": prof, "count": 4}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": dur})
    per = inst.mean_tokens

    def best(rates):
        ads = [Adapter(f"t{i:02d}", 8, r) for i, r in enumerate(rates)]
        plan = plan_gpu("g", prof, 1, [(a, 1.0) for a in ads], per, 8)
        return np.array([max(v for v, _ in twin_scores(inst, plan, [1, 2, 3, 4], s, dur, 2))
                         for s in range(4)])

    rng = np.random.default_rng(2)
    for _ in range(4):
        f = sorted((float(x) for x in rng.choice([8.0, 4.0, 2.0, 1.0], 6)), reverse=True)
        c = list(f)
        heavy = int(np.argmax(c))
        moved = c[heavy] / 2                          # spread half the heaviest one's load
        c[heavy] -= moved
        c[int(np.argmin(c))] += moved
        c += [1.0] * int(rng.integers(0, 3))          # and add light adapters
        assert spreads([x * per for x in c], [x * per for x in f])
        easy, hard = best(f), best(c)
        se = np.sqrt((easy.var(ddof=1) + hard.var(ddof=1)) / 4)
        assert hard.mean() <= easy.mean() + 2 * se, (f, c, easy, hard)


def _assert_two_gpu_cut_exact(cls, f, tier: int) -> None:
    """Every split of ``cls``'s supply over two GPUs, GPU 0 fixed in a model cut by ``f`` at
    ``tier``, is feasible iff its loads are in order and neither GPU is cut: holds tier
    ``tier`` or above and ``spreads`` ``f``."""
    from optim.class_exclusion import _Master, spreads
    fv = cls.vector_loads(f)

    def cut(c) -> bool:
        return cls.vector_tier(c) >= tier and spreads(cls.vector_loads(c), fv)

    for c0 in itertools.product(*(range(s + 1) for s in cls.supply)):
        c1 = [s - x for s, x in zip(cls.supply, c0)]
        master = _Master(cls, 2, lambda n: math.inf)
        master.cut(f, tier)
        for j, x in enumerate(c0):
            master.m.Add(master.c[0][j] == x)
        got = master.solve(5.0)
        l0, l1 = sum(cls.vector_loads(c0)), sum(cls.vector_loads(c1))
        want = l0 >= l1 and not cut(list(c0)) and not cut(c1)
        assert (got not in (None, False)) == want, (cls, f, tier, c0)


@pytest.mark.parametrize("seed", range(6))
def test_the_models_cut_is_exactly_not_spreading(seed):
    """``_Master.cut(f)`` admits a GPU exactly when it does not spread ``f``: every split of a
    small supply over two GPUs, fixed in the model, is feasible iff neither GPU spreads ``f``
    (and the loads are in order)."""
    from optim.class_exclusion import LoadClasses
    rng = np.random.default_rng(seed)
    w = tuple(sorted((float(x) for x in rng.choice([1, 2, 3, 5, 8], 3, replace=False)),
                     reverse=True))
    cls = LoadClasses(w, tuple(int(x) for x in rng.integers(1, 4, 3)))
    f = [int(rng.integers(0, s + 1)) for s in cls.supply]
    if sum(f) == 0:
        f[-1] = 1
    _assert_two_gpu_cut_exact(cls, f, 0)


@pytest.mark.parametrize("seed", range(4))
def test_one_gpus_cut_is_exactly_not_spreading_on_random_vectors(seed):
    """One GPU holding the whole supply ``c`` (five classes of loads 1-40), cut by a random
    ``f``: the model is feasible iff ``c`` does not spread ``f`` — on 150 pairs per seed, a
    fifth of them chosen to spread ``f`` (``f`` moved to heavier classes and shortened)."""
    from optim.class_exclusion import LoadClasses, _Master, spreads
    rng = np.random.default_rng(300 + seed)
    hits = 0
    for _ in range(150):
        w = tuple(sorted((float(x) for x in rng.choice(np.arange(1, 41), 5, replace=False)),
                         reverse=True))
        c = [int(x) for x in rng.integers(0, 5, 5)]
        if sum(c) == 0:
            c[0] = 1
        f = [int(x) for x in rng.integers(0, 5, 5)]
        if rng.random() < 0.2:                      # a vector c surely spreads
            f = [0] * 5
            for j, k in enumerate(c):
                for _ in range(k):
                    if rng.random() < 0.7:
                        f[min(4, j + int(rng.integers(0, 2)))] += 1
        if sum(f) == 0:
            f[-1] = 1
        cls = LoadClasses(w, tuple(c))
        master = _Master(cls, 1, lambda n: math.inf)
        master.cut(f)
        got = master.solve(5.0)
        want = not spreads(cls.vector_loads(c), LoadClasses(w, tuple(f)).vector_loads(f))
        hits += not want
        assert (got not in (None, False)) == want, (w, c, f)
    assert hits >= 10           # the pairs that spread are exercised too


@pytest.mark.parametrize("seed", range(8))
def test_the_models_tiered_cut_is_exactly_not_spreading_at_that_rank_or_above(seed):
    """With rank tiers (classes of equal load at several tiers, four or five classes) the cut of
    ``f`` at tier ``t`` admits a GPU exactly when it holds no tier ``t`` or above or does not
    spread ``f``: every split over two GPUs, fixed in the model, is feasible iff neither GPU is
    cut (and the loads are in order)."""
    from optim.class_exclusion import LoadClasses
    rng = np.random.default_rng(100 + seed)
    loads = sorted((float(x) for x in rng.choice([1, 2, 3, 5, 8], 3, replace=False)),
                   reverse=True)
    classes = sorted({(w, int(t)) for w in loads for t in rng.integers(0, 2, 2)},
                     key=lambda e: (-e[0], -e[1]))[:5]
    cls = LoadClasses(tuple(w for w, _ in classes),
                      tuple(int(x) for x in rng.integers(1, 3, len(classes))),
                      tuple(t for _, t in classes))
    if cls.n_tiers < 2:
        cls = LoadClasses(cls.loads, cls.supply, (1,) + cls.tiers[1:])
    f = [int(rng.integers(0, s + 1)) for s in cls.supply]
    if sum(f) == 0:
        f[-1] = 1
    _assert_two_gpu_cut_exact(cls, f, int(rng.integers(0, cls.n_tiers)))


@pytest.mark.parametrize("seed", range(20))
def test_caps_that_rise_then_fall_with_the_count_stay_sound(seed):
    """Count caps shaped like the SLO's (``min(S(n), K(n))``: the n heaviest loads, then a
    limit falling with n): the model takes their non-increasing envelope, so it never excludes
    a k that brute force serves; with every GPU passing the twin check, what it excludes comes
    from the caps and the supply alone."""
    rng = np.random.default_rng(100 + seed)
    J = 3
    w = sorted((float(x) for x in rng.choice([1, 2, 4, 8, 16], J, replace=False)), reverse=True)
    supply = [int(x) for x in rng.integers(1, 4, J)]
    loads = [x for x, s in zip(w, supply) for _ in range(s)]
    heavy = np.concatenate([[0.0], np.cumsum(sorted(loads, reverse=True))])
    k = int(rng.integers(2, 4))
    K = sum(loads) / k * float(rng.uniform(0.9, 1.6))
    drop = float(rng.uniform(0.0, 0.2))

    def cap(n):
        return min(heavy[min(n, len(loads))], K * (1 - drop * n / len(loads)))

    def never(v):
        return False
    feasible = _feasible(w, supply, k, never, cap)
    assert not (class_excluded(loads, k, cap, never, max_checks=50) and feasible)


@pytest.mark.parametrize("seed", range(30))
def test_rank_tiers_never_exclude_a_feasible_k_and_prove_most_infeasible_ones(seed):
    """Several ranks: classes of (load, rank), every GPU checked at the largest rank it holds.
    In an oracle world meeting the premises (a GPU fails when a Schur-concave cost of its loads,
    scaled up with its server rank, passes a limit), the search never excludes a k that brute
    force serves, and shows every one it cannot."""
    rng = np.random.default_rng(500 + seed)
    levels = [8, 16, 32][:int(rng.integers(2, 4))]
    J = int(rng.integers(2, 4))
    loads_by = sorted((float(x) for x in rng.choice([1, 2, 4, 8], J, replace=False)),
                      reverse=True)
    loads, ranks = [], []
    for w in loads_by:
        for r in levels:
            for _ in range(int(rng.integers(0, 3))):
                loads.append(w)
                ranks.append(int(r))
    if len(set(ranks)) < 2:
        loads += [loads_by[-1], loads_by[0]]
        ranks += [levels[0], levels[-1]]
    k = int(rng.integers(2, 4))
    scale = {8: 1.0, 16: 1.15, 32: 1.3}
    limit = float(np.sum(np.sqrt(loads))) / k * float(rng.uniform(0.9, 1.5))

    def fails(v, rank):
        return float(np.sum(np.sqrt(v))) * scale[rank] > limit

    cls = load_classes(loads, ranks)
    tiers = sorted(set(ranks))
    feasible = False
    for gpus in _splits(list(cls.supply), k):
        if all(not sum(c) or not fails(cls.vector_loads(c), tiers[cls.vector_tier(c)])
               for c in gpus):
            feasible = True
            break
    trace: dict = {}
    got = class_excluded(loads, k, lambda n: math.inf, fails, max_checks=400, trace=trace,
                         ranks=ranks)
    assert not (got and feasible), "excluded a k the oracle can serve"
    assert got == (not feasible), trace


def test_load_classes_split_equal_loads_by_rank_tier():
    c = load_classes([1.0, 4.0, 4.0, 1.0], ranks=[8, 32, 8, 8])
    assert c.loads == (4.0, 4.0, 1.0) and c.supply == (1, 1, 2) and c.tiers == (1, 0, 0)
    assert c.vector_tier([0, 1, 2]) == 0 and c.vector_tier([1, 0, 0]) == 1
    assert load_classes([1.0, 2.0], ranks=[8, 8]).tiers == ()


def test_a_study_takes_any_searchs_cached_success_before_replaying(monkeypatch):
    """``raise_bound_to`` in a study: a cached exclusion by the supply step ends the certificate
    before the fullest / busiest / two-GPU / class steps replay anything."""
    from optim import feasibility as F
    inst = _cert_instance()
    ran = []
    for name in ("one_gpu_excluded", "fullest_gpu_excluded", "busiest_gpu_excluded",
                 "two_gpu_splits_excluded", "two_gpus_excluded", "pair_supply_gpus_excluded"):
        monkeypatch.setattr(F, name, lambda *a, _n=name, **k: ran.append(_n) or False)
    monkeypatch.setattr(F, "class_gpus_excluded",
                        lambda inst, k, d, w=None, max_checks=None, cached_only=False:
                        ran.append(("class", cached_only)) or False)
    monkeypatch.setattr(F, "supply_gpus_excluded",
                        lambda inst, k, d, w=None, max_checks=None: max_checks == 0)
    assert F.raise_bound_to(inst, 3, 4, 120.0, supply_checks=128) == 4
    assert ran == [("class", True)]


def test_cached_only_reads_the_cache_and_solves_nothing(monkeypatch):
    """``class_gpus_excluded(..., cached_only=True)`` without a cached result is False before
    any bound, count cap or caps-only solve is computed."""
    from optim import feasibility as F
    inst = _cert_instance()

    def boom(*a, **k):
        raise AssertionError("computed something")
    monkeypatch.setattr(F, "twin_lower_bound", boom)
    monkeypatch.setattr(F, "count_caps", boom)
    monkeypatch.setattr(F, "_cached_exclusion", lambda keys: None)
    assert F.class_gpus_excluded(inst, 3, 120.0, 1, 0, cached_only=True) is False


def test_class_index_names_each_loads_class_in_load_classes():
    from optim.class_exclusion import class_index, load_classes
    loads = [2.0, 5.0, 2.0 * (1 + 1e-12), 5.0, 1.0, 5.0]
    ranks = [8, 8, 8, 32, 8, 8]
    cls = load_classes(loads, ranks)
    idx = class_index(loads, ranks)
    assert [sum(1 for j in idx if j == c) for c in range(len(cls.loads))] == list(cls.supply)
    for x, r, j in zip(loads, ranks, idx):
        assert cls.loads[j] == pytest.approx(x) and cls.tier(j) == sorted(set(ranks)).index(r)


def test_the_class_step_status_reads_the_cache_without_searching(tmp_path, monkeypatch, capsys):
    """``class_search_status`` (the studies' ``--status``): how the class step of a point
    stands, from the disk cache alone — never run, stopped, ended with its budget, its budget
    spent, excluded — and ``print_class_status`` counts the points."""
    import optim.class_exclusion as C
    from experiments.common import print_class_status
    from optim import feasibility as F
    from optim.instance import instance_from_dict
    seen = _fake_checked_search(tmp_path, monkeypatch, lambda n: {})
    runs = []

    def fake(loads, k, cap_of, fails, checks, progress=None, trace=None, ranks=None,
             resume=None, save=None):
        runs.append(checks)
        if fails is None:
            return False
        save({"v": 1, "rounds": 3, "checks": min(checks, 12), "cuts": [[1], [2], [3]]})
        trace["why"] = "check budget spent" if checks < 30 else "no k GPUs hold the supply"
        return checks >= 30
    monkeypatch.setattr(C, "class_excluded", fake)
    inst = _cert_instance()
    st = F.class_search_status(inst, 3, 120.0, budget=10)
    assert (st.version, st.ended, st.excluded) == (None, None, False)
    assert "no checked search saved" in st.describe()
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=10) is False
    n_runs = len(runs)
    st = F.class_search_status(inst, 3, 120.0, budget=10)
    assert (st.version, st.checks, st.rounds, st.cuts) == (C.CLASS_VERSION, 10, 3, 3)
    assert "with 10 checks it ended: check budget spent" in st.describe()
    assert "stopped (rerun the study" in F.class_search_status(inst, 3, 120.0, 20).describe()
    assert "budget is spent" in F.class_search_status(inst, 3, 120.0, 8).describe()
    with monkeypatch.context() as m:         # a new version: its own search has not ended,
        old = C.CLASS_VERSION                # the earlier one's ending is shown beside
        m.setattr(C, "CLASS_CHECKS", 10)
        m.setattr(C, "CLASS_VERSION", old + 1)
        m.setattr(C, "CLASS_SOUND_VERSIONS", C.CLASS_SOUND_VERSIONS + (old + 1,))
        st = F.class_search_status(inst, 3, 120.0)
        assert st.ended is None and st.version == old
        assert st.describe().endswith(f"; version {old} ended: check budget spent")
    assert len(runs) == n_runs and not seen                   # nothing searched by the status
    assert F.class_gpus_excluded(inst, 3, 120.0, max_checks=40) is True
    assert F.class_search_status(inst, 3, 120.0).excluded
    one = instance_from_dict({"name": "one", "adapters": [{"id": "a", "rank": 8, "rate": 1.0}],
                              "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct",
                                        "count": 2}]})
    assert "not applicable" in F.class_search_status(one, 2, 120.0).describe()
    rows = [("a", inst, 120.0, {"gpus": 3, "lb": 3}), ("b", inst, 120.0, {"gpus": 4, "lb": 3}),
            ("c", inst, 120.0, {"gpus": 6, "lb": 3}), ("d", inst, 120.0, None),
            ("e", inst, 120.0, {"gpus": float("nan"), "lb": 3})]
    capsys.readouterr()
    print_class_status(rows, 384)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("points=5 certified=1 one_above=1 two_or_more_above=1 failed=1 "
                       "not_stored=1")
    assert out[0] == "b: greedy 4, bound 3: excluded by the class step (the bound is raised)"
