"""The two-GPU split exclusion (optim.feasibility.two_gpu_splits_excluded): every split of a
few adapters over two GPUs inside the load window is replayed, each GPU with the seed its
position gives it, and the bound rises to 3 only when no split is accepted either way round."""

from __future__ import annotations

import itertools

import numpy as np

from optim import feasibility as F
from optim.instance import instance_from_dict

LLAMA = "llama-3.1-8b-instruct"


def _inst(rates, ranks=None, seed=0, duration=120.0):
    ranks = ranks or [8] * len(rates)
    return instance_from_dict({
        "name": "splits", "adapters": [{"id": f"a{i:02d}", "rank": r, "rate": q}
                                       for i, (r, q) in enumerate(zip(ranks, rates))],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 4}], "seed": seed,
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": duration})


def test_splits_are_every_unordered_split_inside_the_window():
    rng = np.random.default_rng(5)
    inst = _inst(list(rng.uniform(0.5, 3.0, 9)))
    loads = [inst.load_tps(a) for a in inst.adapters]
    cap = 0.6 * sum(loads)
    got = F.two_gpu_splits(inst, cap)
    want = set()
    n = len(loads)
    for k in range(1, n):
        for first in itertools.combinations(range(n), k):
            rest = [i for i in range(n) if i not in first]
            if sum(loads[i] for i in first) <= cap and sum(loads[i] for i in rest) <= cap:
                key = frozenset([frozenset(first), frozenset(rest)])
                want.add(key)
    seen = {frozenset([frozenset(f), frozenset(set(range(n)) - set(f))]) for f in got}
    assert seen == want and len(got) == len(want)          # each unordered split once
    assert all(n - 1 not in f for f in got)                 # the last adapter on the second GPU
    # too many adapters: None (the check is skipped, the bound stays)
    assert F.two_gpu_splits(_inst([1.0] * (F.SPLIT_MAX_ADAPTERS + 1)), 1e9) is None


def test_count_caps_drop_the_splits_whose_sides_exceed_them():
    """With caps per adapter count (under an SLO: ``count_bound.count_caps``) a split stays
    only when each side's load is within the cap of its own count."""
    rng = np.random.default_rng(7)
    inst = _inst(list(rng.uniform(0.5, 3.0, 8)))
    loads = [inst.load_tps(a) for a in inst.adapters]
    n, total = len(loads), sum(loads)
    caps = np.array([0.0] + [total * (0.9 - 0.07 * k) for k in range(1, n + 1)])
    got = F.two_gpu_splits(inst, 1e9, caps)
    want = set()
    for k in range(1, n):
        for first in itertools.combinations(range(n - 1), k):
            e = sum(loads[i] for i in first)
            if e <= caps[k] and total - e <= caps[n - k]:
                want.add(first)
    assert set(got) == want and 0 < len(got) < len(F.two_gpu_splits(inst, 1e9))


def test_splits_of_one_adapter_kind_need_one_check_per_gpu_size_and_seed(monkeypatch):
    """12 equal adapters: 2047 splits, but a GPU's draw depends only on its (rank, rate)
    sequence in id order, so the replays are one per GPU size (1..11) and seed: 22 checks,
    each asked once; a mix of two kinds gives more keys than one kind, fewer than splits."""
    inst = _inst([1.0] * 12, seed=3)
    splits = F.two_gpu_splits(inst, 1e9)
    assert len(splits) == 2047 and F.split_checks(inst, splits) == 22
    asked = []

    def first_seed_only(inst_, adapters, seed, duration_s, workers):
        asked.append((tuple((a.rank, a.rate) for a in adapters), seed))
        return seed == 3                    # no order gives both GPUs the first seed
    monkeypatch.setattr(F, "_gpu_accepted", first_seed_only)
    assert F._some_split_accepted(inst, splits, 60.0, 1) is False
    assert len(asked) == len(set(asked)) == 22
    mixed = _inst([1.0] * 6 + [2.0] * 6)
    sp = F.two_gpu_splits(mixed, 1e9)
    assert 22 < F.split_checks(mixed, sp) < 4 * len(sp)
    # equal keys, other ids: the same GPUs
    assert F.split_gpus(inst, (0, 1)) == F.split_gpus(inst, (5, 9))


def test_too_many_distinct_checks_skip_the_replays(monkeypatch, tmp_path):
    """Distinct rates on 14 adapters: every split is a GPU of its own, far beyond
    SPLIT_MAX_CHECKS: None, nothing replayed."""
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    inst = _inst([0.5 + 0.01 * i for i in range(14)])
    monkeypatch.setattr(F, "one_adapter_caps", lambda *a, **k: {"h100": 1e12})

    def boom(*a, **k):
        raise AssertionError("nothing may be replayed")
    monkeypatch.setattr(F, "_gpu_accepted", boom)
    assert F.split_checks(inst, F.two_gpu_splits(inst, 1e12)) > F.SPLIT_MAX_CHECKS
    assert F.two_gpu_splits_excluded(inst, 60.0) is None


def test_a_split_counts_only_if_both_gpus_pass_with_the_seeds_of_one_order(monkeypatch):
    """With an oracle for one GPU's verdict: a split passes only when both GPUs pass in one of
    the two orders (first GPU seed s, second s + 1); each (GPU, seed) is asked once."""
    inst = _inst([1.0, 1.5, 2.0, 2.5], seed=7)
    asked = []

    def oracle(rule):
        def accepted(inst_, adapters, seed, duration_s, workers):
            asked.append((tuple(a.id for a in adapters), seed))
            return rule(tuple(a.id for a in adapters), seed)
        return accepted

    def run(rule):
        asked.clear()
        monkeypatch.setattr(F, "_gpu_accepted", oracle(rule))
        return not F._some_split_accepted(inst, F.two_gpu_splits(inst, 1e9), 60.0, 1)

    # a GPU passes only with seed 7 (the first position): no order gives both GPUs seed 7
    assert run(lambda ids, seed: seed == 7) is True
    # the pair {a00, a02} passes at seed 8 and {a01, a03} at seed 7: accepted in that order
    assert run(lambda ids, seed: (ids, seed) in {(("a00", "a02"), 8), (("a01", "a03"), 7)}) is False
    # every GPU of one adapter fails: only the 3-1 splits have one, so all 2-2 splits decide
    assert run(lambda ids, seed: len(ids) == 2) is False
    assert run(lambda ids, seed: False) is True
    assert len(asked) == len(set(asked))                        # memoised per (GPU, seed)


def test_the_exclusion_agrees_with_verifying_every_split_on_a_tiny_instance(tmp_path,
                                                                              monkeypatch):
    """Against the verification itself: four adapters, 120 s window; the exclusion holds exactly
    when no two-GPU placement (every split, both orders, every rank and Amax 1..adapters + 1)
    is accepted by optim.verify (GPU g of a placement draws with seed instance.seed + g, so a
    second GPU is verified alone with that seed)."""
    from optim.placement import Placement, plan_gpu
    from optim.verify import verify

    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    outcomes = set()
    for rates in ([22.0, 21.0, 20.0, 19.0], [3.0, 3.0, 2.0, 2.0]):
        inst = _inst(rates, ranks=[8, 16, 8, 16])
        t = inst.gpu_types[0]
        ranks = sorted(t.load_profile().supported_ranks)

        def passes(group, position):
            alone = instance_from_dict({       # the group as an instance of its own
                "name": "alone", "adapters": [{"id": a.id, "rank": a.rank, "rate": a.rate}
                                              for a in group],
                "gpus": [{"name": "h100", "profile": LLAMA, "count": 1}], "seed": inst.seed,
                "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": 120.0})
            for rank in (r for r in ranks if r >= max(a.rank for a in group)):
                for amax in range(1, len(group) + 2):
                    plan = plan_gpu(t.name, t.profile, amax, [(a, 1.0) for a in group],
                                    inst.mean_tokens, rank)
                    v = verify(Placement(inst.name, "manual", "solved", (plan,)), alone,
                               duration_s=120.0, workers=2, seed=inst.seed + position)
                    if v.verdict == "accepted":
                        return True
            return False

        splits = F.two_gpu_splits(inst, 1e12)
        excluded = not F._some_split_accepted(inst, splits, 120.0, 2)
        outcomes.add(excluded)
        any_ok = False
        for first in splits:
            g = [[inst.adapters[i] for i in first],
                 [a for i, a in enumerate(inst.adapters) if i not in first]]
            any_ok |= any(passes(x, 0) and passes(y, 1) for x, y in (g, g[::-1]))
        assert excluded == (not any_ok), rates
    assert outcomes == {True, False}


def test_many_adapters_are_skipped_before_any_replay(monkeypatch):
    """Beyond SPLIT_MAX_ADAPTERS the check says None at once: no limit measured, no replay."""
    def boom(*a, **k):
        raise AssertionError("nothing may be measured")
    monkeypatch.setattr(F, "carry_limit", boom)
    monkeypatch.setattr(F, "_gpu_accepted", boom)
    assert F.two_gpu_splits_excluded(_inst([0.5] * (F.SPLIT_MAX_ADAPTERS + 1)), 60.0) is None
