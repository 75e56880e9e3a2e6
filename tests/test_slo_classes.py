"""Latency SLOs per adapter class: the instance field, judging each class's requests by its own
bounds, and the loosest plain SLO the bounds measure under (sound: a GPU that meets its classes'
bounds meets it)."""

from __future__ import annotations

import numpy as np
import pytest

from optim.instance import InstanceError, instance_from_dict
from optim.methods import solve
from optim.placement import Placement
from optim.verify import verify
from twin.slo import Slo, evaluate_slo

PROFILE = "llama-3.1-8b-instruct"
TIERED = {"ttft_p99_ms": 5000, "classes": {
    "premium": {"ttft_p99_ms": 300, "itl_p99_ms": 60, "adapters": ["a0", "a1"]},
    "batch": {"e2e_p99_ms": 120_000, "adapters": ["a2"]}}}


def _inst(slo: dict | None, rates=(0.6,) * 6, duration=300.0, count=4) -> object:
    return instance_from_dict({
        "name": "tiny-classes", "duration_s": duration, "seed": 3,
        "adapters": [{"id": f"a{i}", "rank": 8, "rate": q} for i, q in enumerate(rates)],
        "gpus": [{"name": "h100", "profile": PROFILE, "count": count}],
        **({"slo": slo} if slo else {})})


# ----------------------------------------------------------------------------- the field
def test_class_fields_are_checked_by_name():
    with pytest.raises(InstanceError, match=r"slo\.classes\.premium\.adapters.*'zz'"):
        _inst({"classes": {"premium": {"ttft_p99_ms": 300, "adapters": ["a0", "zz"]}}})
    with pytest.raises(InstanceError, match=r"slo\.classes\.premium\.adapters.*missing"):
        _inst({"classes": {"premium": {"ttft_p99_ms": 300}}})
    with pytest.raises(InstanceError, match=r"slo\.classes\.premium.*at least one bound"):
        _inst({"classes": {"premium": {"adapters": ["a0"]}}})
    with pytest.raises(InstanceError, match=r"slo\.classes\.premium\.ttft_p99_ms.*> 0"):
        _inst({"classes": {"premium": {"ttft_p99_ms": 0, "adapters": ["a0"]}}})
    with pytest.raises(InstanceError, match=r"slo\.classes\.b\.adapters.*already in class 'a'"):
        _inst({"classes": {"a": {"ttft_p99_ms": 300, "adapters": ["a0"]},
                           "b": {"ttft_p99_ms": 900, "adapters": ["a0"]}}})
    with pytest.raises(InstanceError, match=r"slo\.classes\.premium.*unknown bound"):
        _inst({"classes": {"premium": {"ttft_p99": 300, "adapters": ["a0"]}}})
    with pytest.raises(InstanceError, match=r"slo\.classes.*must be an object"):
        _inst({"classes": [{"ttft_p99_ms": 300}]})
    inst = _inst(TIERED)
    assert instance_from_dict(inst.to_dict()).slo == inst.slo
    assert "premium (2 adapter(s))" in inst.slo.describe()
    assert inst.slo.judged_bounds() == {
        "ttft_p99_ms": 5000.0, "batch:ttft_p99_ms": 5000.0, "batch:e2e_p99_ms": 120_000.0,
        "premium:ttft_p99_ms": 300.0, "premium:itl_p99_ms": 60.0}


def test_loosest_takes_the_loosest_bound_of_the_groups_present():
    s = _inst(TIERED).slo
    # every group: ttft at most 5000 everywhere; ITL and E2E unbounded in some group
    assert s.loosest() == Slo(ttft_p99_ms=5000)
    assert s.loosest(["a0", "a1"]) == Slo(ttft_p99_ms=300, itl_p99_ms=60)
    assert s.loosest(["a0", "a2"]) == Slo(ttft_p99_ms=5000)
    best_effort = Slo.from_dict({"classes": {"p": {"ttft_p99_ms": 300, "adapters": ["a0"]}}})
    assert best_effort.loosest(["a0"]) == Slo(ttft_p99_ms=300)
    assert best_effort.loosest(["a0", "a1"]) is None      # a1 is bounded by nothing
    inst = _inst(TIERED)
    assert inst.bound_view().slo == Slo(ttft_p99_ms=5000)
    assert _inst({"ttft_p99_ms": 700}).bound_view().slo == Slo(ttft_p99_ms=700)


# ----------------------------------------------------------------------------- judging a run
def _run(rng, n=600, duration=100.0, n_adapters=4):
    arrival = np.sort(rng.uniform(0, duration, n))
    adapter = rng.integers(0, n_adapters, n)
    # adapter 0's requests wait longest: a premium class on it is the one to miss
    first = arrival + rng.exponential(0.1, n) * (1 + 9 * (adapter == 0))
    finish = first + rng.exponential(2.0, n)
    first[rng.random(n) < 0.003] = -1.0
    finish[(first < 0) | (finish > duration)] = -1.0
    return arrival, adapter, first, finish


def test_each_class_is_judged_by_its_own_bounds_over_its_own_requests():
    rng = np.random.default_rng(0)
    arrival, adapter, first, finish = _run(rng)
    ids = ["a0", "a1", "a2", "a3"]
    hist = np.zeros(4000, np.int64)
    dur = 100.0
    slo = Slo.from_dict({"ttft_p99_ms": 10_000, "warmup_s": 5, "classes": {
        "premium": {"ttft_p99_ms": 1000, "adapters": ["a0"]},
        "gold": {"ttft_p99_ms": 1000, "adapters": ["a1"]}}})
    r = evaluate_slo(slo, arrival, first, finish, hist, dur, adapter, 4, adapter_ids=ids)
    for name, k in (("premium", 0), ("gold", 1)):
        own = evaluate_slo(Slo(ttft_p99_ms=1000, warmup_s=5), arrival[adapter == k],
                           first[adapter == k], finish[adapter == k], hist, dur)
        assert r.observed[f"{name}:ttft_p99_ms"] == own.observed["ttft_p99_ms"]
        assert r.met[f"{name}:ttft_p99_ms"] == own.ok
    rest = adapter >= 2
    plain = evaluate_slo(Slo(ttft_p99_ms=10_000, warmup_s=5), arrival[rest], first[rest],
                         finish[rest], hist, dur)
    assert r.observed["ttft_p99_ms"] == plain.observed["ttft_p99_ms"]
    assert not r.met["premium:ttft_p99_ms"] and r.met["gold:ttft_p99_ms"]
    assert not r.ok and r.score < 1.0
    # per adapter: within the bound of its own class
    judged = arrival >= 5
    for k in range(4):
        m = judged & (adapter == k)
        ttft = np.where(first[m] >= 0, (first[m] - arrival[m]) * 1000, np.inf)
        assert r.adapter_attainment[k] == pytest.approx(
            float(np.mean(ttft <= (1000 if k < 2 else 10_000))))
    with pytest.raises(ValueError, match="adapter ids"):
        evaluate_slo(slo, arrival, first, finish, hist, dur)


@pytest.mark.parametrize("seed", range(12))
def test_meeting_the_classes_implies_meeting_the_loosest(seed):
    """The premise of every bound under classes: a run that meets its classes' bounds meets
    ``Slo.loosest`` (so a GPU excluded under the loosest SLO is excluded under the classes)."""
    rng = np.random.default_rng(seed)
    arrival, adapter, first, finish = _run(rng, n=int(rng.integers(50, 800)))
    ids = ["a0", "a1", "a2", "a3"]
    hist = np.zeros(4000, np.int64)
    hist[rng.integers(0, 4000, 50)] = 1
    pick = lambda lo, hi: float(rng.uniform(lo, hi))            # noqa: E731
    classes = {"p": {"ttft_p99_ms": pick(100, 2000), "adapters": ["a0"]},
               "q": {"e2e_p99_ms": pick(2000, 20_000), "ttft_mean_ms": pick(50, 900),
                     "adapters": ["a1", "a2"]}}
    slo = Slo.from_dict({"ttft_p99_ms": pick(100, 3000), "e2e_p99_ms": pick(2000, 20_000),
                         "attainment": float(rng.choice([0.9, 0.99])), "warmup_s": 5,
                         "classes": classes})
    r = evaluate_slo(slo, arrival, first, finish, hist, 100.0, adapter, 4, adapter_ids=ids)
    loose = slo.loosest(ids)
    plain = evaluate_slo(loose, arrival, first, finish, hist, 100.0)
    assert plain.ok or not r.ok, (r.observed, plain.observed)


# ----------------------------------------------------------------------------- placement
def test_verify_holds_a_premium_class_to_its_bound_and_greedy_serves_it():
    """One GPU serves six adapters under a loose top-level SLO (its p99 TTFT about 175 ms); a
    premium class with a 120 ms p99 TTFT on two of them rejects that GPU — the verdict names
    the class's bound — while the two alone on a GPU meet it (about 85 ms): greedy's repair
    finds a placement whose every GPU meets its classes' bounds."""
    rates = (4.0,) * 6
    plain = solve(_inst({"ttft_p99_ms": 60_000}, rates), "greedy", verify=True, workers=1)
    assert plain.n_gpus == 1 and plain.verdict == "accepted"
    inst = _inst({"ttft_p99_ms": 60_000, "classes": {
        "premium": {"ttft_p99_ms": 120, "adapters": ["a0", "a1"]}}}, rates)
    judged = verify(Placement(inst.name, "given", "solved", plain.gpus), inst)
    s = judged.gpus[0].verified.slo
    assert judged.verdict == "rejected" and s["met"]["ttft_p99_ms"]
    assert not s["met"]["premium:ttft_p99_ms"]
    assert "premium:ttft_p99" in judged.table()
    fixed = solve(inst, "greedy", verify=True, workers=1)
    assert fixed.verdict == "accepted"
    assert all(g.verified.slo["ok"] for g in fixed.gpus)
    assert fixed.n_gpus <= 3, fixed.table()


# ----------------------------------------------------------------------------- optim plan
def _csv(tmp_path, classes):
    p = tmp_path / "tiered.csv"
    p.write_text("id,rank,rate,slo_class\n" + "".join(
        f"a{i},8,0.5,{c}\n" for i, c in enumerate(classes)))
    return p


def test_plan_takes_classes_from_the_csv_and_slo_class(tmp_path):
    from optim.plan import PlanError, plan_instance
    from twin.cli_support import CliError, slo_class_argument
    path = _csv(tmp_path, ["premium", "premium", "", "batch"])
    classes = [slo_class_argument("premium:ttft_p99_ms=300,itl_p99_ms=60"),
               slo_class_argument("batch:e2e_p99_ms=120000")]
    inst = plan_instance(path, slo=Slo(ttft_p99_ms=5000), slo_classes=classes)
    assert inst.slo.adapter_class() == {"a0": "premium", "a1": "premium", "a3": "batch"}
    assert inst.slo.class_slo("premium").bounds() == {"ttft_p99_ms": 300.0, "itl_p99_ms": 60.0}
    assert inst.slo.class_slo(None).bounds() == {"ttft_p99_ms": 5000.0}
    only = plan_instance(path, slo_classes=classes)          # a2: no bound at all
    assert only.slo.bounds() == {} and only.bound_view().slo is None
    with pytest.raises(PlanError, match=r"row 4, column 'slo_class': class 'batch' has no"):
        plan_instance(path, slo_classes=classes[:1])
    with pytest.raises(PlanError, match=r"names batch, premium but no --slo-class"):
        plan_instance(path)
    with pytest.raises(PlanError, match="--slo-class gold: no adapter"):
        plan_instance(path, slo_classes=classes + [slo_class_argument("gold:ttft_p99_ms=9")])
    with pytest.raises(CliError, match="not CLASS:NAME=MS"):
        slo_class_argument("premium")
    with pytest.raises(CliError, match="'fast' is not a number"):
        slo_class_argument("premium:ttft_p99_ms=fast")


def test_a_latency_tail_refit_invalidates_the_cached_slo_verdicts(monkeypatch):
    """Carry limits and exclusions under a client-view SLO are cached by a key that holds the
    fitted latency-tail constants (a refit changes every such verdict); engine-view and plain
    keys do not depend on them."""
    from dataclasses import replace as dc_replace
    import twin.latency_tail as LT
    from optim.capacity import _limit_key
    from optim.feasibility import _gpu_key
    from twin.sharegpt import default_lengths
    from twin.profile import load_profile
    prof = load_profile(PROFILE)
    client, engine = Slo(ttft_p99_ms=500), Slo(ttft_p99_ms=500, latency="engine")
    inst = _inst({"ttft_p99_ms": 500})

    def keys():
        return (_limit_key(prof, 8, 1, default_lengths(), 600.0, (0, 1), 0.9, client),
                _limit_key(prof, 8, 1, default_lengths(), 600.0, (0, 1), 0.9, engine),
                _limit_key(prof, 8, 1, default_lengths(), 600.0, (0, 1), 0.9),
                _gpu_key(inst, inst.adapters, 8, 600.0))
    before = keys()
    tail = LT.latency_tail_for(prof)
    assert tail is not None
    refit = dc_replace(tail, cold_start_ms=tail.cold_start_ms + 1.0)
    monkeypatch.setattr(LT, "latency_tail_for", lambda p: refit)
    after = keys()
    assert after[0] != before[0] and after[3] != before[3]
    assert after[1:3] == before[1:3]
