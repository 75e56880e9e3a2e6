"""Placement over GPU types, power caps, cost and energy (optim.gpu_configs, optim.config_greedy,
optim.exact.templates) and the hetero instance fields."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optim.config_greedy import best_plan, plan_configurations, plan_value
from optim.exact.templates import _solve_model
from optim.gpu_configs import GpuConfig, config_index
from optim.instance import InstanceError, instance_from_dict, load_instance

LLAMA = "llama-3.1-8b-instruct"
REPO = Path(__file__).resolve().parent.parent


def _cfg(t: str, cap_tps: float, amax: int = 8, price: float = 1.0, idle: float = 100.0,
         slope: float = 0.02, cap_w: float | None = None, rank: int = 16) -> GpuConfig:
    return GpuConfig(t, LLAMA, False, cap_w, amax, rank, price, cap_tps, (cap_tps,), idle,
                     slope, ())


def _inst(rates, counts: dict[str, int], prices: dict[str, float] | None = None,
          objective: str = "cost", budget: float | None = None):
    d = {"name": "t", "adapters": [{"id": f"a{i}", "rank": 16, "rate": float(r)}
                                   for i, r in enumerate(rates)],
         "gpus": [{"name": n, "profile": LLAMA, "count": c,
                   "price_per_hour": (prices or {}).get(n, 1.0)} for n, c in counts.items()],
         "objective": objective}
    if budget is not None:
        d["power_budget_w"] = budget
    return instance_from_dict(d)


def _brute(inst, configs, kind: str) -> float:
    """Optimum by enumeration: every set partition of the adapters, every configuration per
    block, within availability (and the power budget)."""
    loads = [inst.load_tps(a) for a in inst.adapters]
    n = len(loads)
    avail = {t.name: t.count for t in inst.gpu_types}
    best = float("inf")

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            yield [[first]] + p
            for k in range(len(p)):
                yield p[:k] + [[first] + p[k]] + p[k + 1:]

    for part in partitions(list(range(n))):
        options = []
        for block in part:
            load = sum(loads[i] for i in block)
            options.append([c for c in configs if c.fits(len(block), 16, load)])
        for choice in itertools.product(*options):
            used: dict[str, int] = {}
            for c in choice:
                used[c.gpu_type] = used.get(c.gpu_type, 0) + 1
            if any(used[t] > avail[t] for t in used):
                continue
            power = sum(c.power_w(sum(loads[i] for i in b)) for c, b in zip(choice, part))
            if inst.power_budget_w is not None and power > inst.power_budget_w:
                continue
            if kind == "cost":
                v = sum(c.price_per_hour for c in choice)
            elif kind == "energy":
                v = 3600 * power
            else:
                v = len(choice)
            best = min(best, v)
    return best


# ----------------------------------------------------------------------------- exact model
@pytest.mark.parametrize("seed", range(6))
def test_cost_with_one_type_at_price_1_is_the_gpu_count_optimum(seed):
    rng = np.random.default_rng(seed)
    inst = _inst(rng.uniform(2, 12, 9), {"h": 9})
    configs = [_cfg("h", 9000, amax=4), _cfg("h", 8500, amax=8)]
    by_cost, proven_c, _ = _solve_model(inst, configs, "cost", 20, None, 2)
    by_gpus, proven_g, _ = _solve_model(inst, configs, "gpus", 20, None, 2)
    assert proven_c and proven_g
    assert len(by_cost) == len(by_gpus)
    assert len(by_gpus) == _brute(inst, configs, "gpus")


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", ["cost", "energy"])
@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_exact_matches_brute_force_on_tiny_two_type_instances(seed, kind, solver):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 6))
    inst = _inst(rng.uniform(3, 20, n), {"big": int(rng.integers(1, 3)), "small": 3},
                 {"big": 2.5, "small": float(rng.uniform(0.6, 1.4))}, objective=kind)
    configs = [_cfg("big", 14000, amax=4, price=2.5, idle=110, slope=0.022),
               _cfg("big", 12000, amax=4, price=2.5, idle=100, slope=0.017, cap_w=400),
               _cfg("small", 6500, amax=2, price=inst.gpu_type("small").price_per_hour,
                    idle=60, slope=0.03)]
    want = _brute(inst, configs, kind)
    bins, proven, bound = _solve_model(inst, configs, kind, 20, None, 2, solver)
    loads = [inst.load_tps(a) for a in inst.adapters]
    if want == float("inf"):
        assert bins is None and proven
        return
    assert proven
    got = plan_value(kind, bins, loads)
    # the model rounds loads up to whole tok/s and power to 0.1 mW per tok/s
    assert got == pytest.approx(want, rel=2e-3)
    greedy, _ = best_plan(inst, configs, kind)
    if greedy is not None:
        assert plan_value(kind, greedy, loads) >= got - 1e-6 * max(got, 1)


def test_power_budget_is_a_constraint_in_both_methods():
    inst = _inst([10, 10, 10, 10], {"h": 4}, objective="cost", budget=700.0)
    configs = [_cfg("h", 9000, amax=4, idle=110, slope=0.025),
               _cfg("h", 8000, amax=4, idle=100, slope=0.015, cap_w=300)]
    loads = [inst.load_tps(a) for a in inst.adapters]
    bins, proven, _ = _solve_model(inst, configs, "cost", 20, None, 2)
    assert proven and sum(b.config.power_w(sum(loads[i] for i in b.items)) for b in bins) <= 700
    assert plan_value("cost", bins, loads) == _brute(inst, configs, "cost")
    g = plan_configurations(inst, configs, "cost")
    assert g is not None
    assert sum(b.config.power_w(sum(loads[i] for i in b.items)) for b in g) <= 700
    tight = replace(inst, power_budget_w=250.0)
    assert plan_configurations(tight, configs, "cost") is None
    bins, proven, _ = _solve_model(tight, configs, "cost", 20, None, 2)
    assert bins is None and proven


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rates=st.lists(st.floats(1.0, 30.0), min_size=1, max_size=14),
       avail=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
       kind=st.sampled_from(["gpus", "cost", "energy"]))
def test_greedy_never_exceeds_availability(rates, avail, kind):
    counts = dict(zip(("a", "b", "c"), avail))
    inst = _inst(rates, counts, {"a": 2.0, "b": 1.0, "c": 0.7}, objective=kind)
    configs = [_cfg("a", 14000, 8, 2.0, 110, 0.02), _cfg("b", 7000, 8, 1.0, 60, 0.03),
               _cfg("c", 4500, 4, 0.7, 50, 0.035), _cfg("c", 4000, 4, 0.7, 45, 0.03, 250)]
    for types in (None, ["a"], ["b"], ["c"]):
        bins = plan_configurations(inst, configs, kind, types)
        if bins is None:
            continue
        used: dict[str, int] = {}
        for b in bins:
            used[b.config.gpu_type] = used.get(b.config.gpu_type, 0) + 1
            load = sum(inst.load_tps(inst.adapters[i]) for i in b.items)
            assert b.config.fits(len(b.items), 16, load)
        assert all(used[t] <= counts[t] for t in used)
        assert sorted(i for b in bins for i in b.items) == list(range(len(rates)))


@pytest.mark.parametrize("seed", range(4))
def test_exact_never_exceeds_availability(seed):
    rng = np.random.default_rng(seed)
    counts = {"a": 1, "b": int(rng.integers(1, 3)), "c": 4}
    inst = _inst(rng.uniform(5, 25, 10), counts, {"a": 1.0, "b": 1.1, "c": 0.9})
    configs = [_cfg("a", 14000, 8, 1.0), _cfg("b", 9000, 8, 1.1), _cfg("c", 5000, 4, 0.9)]
    bins, proven, _ = _solve_model(inst, configs, "cost", 20, None, 2)
    if bins is None:
        return
    used: dict[str, int] = {}
    for b in bins:
        used[b.config.gpu_type] = used.get(b.config.gpu_type, 0) + 1
    assert all(used[t] <= counts[t] for t in used)


def test_greedy_mixed_never_costs_more_than_its_best_single_type():
    rng = np.random.default_rng(7)
    for _ in range(20):
        inst = _inst(rng.uniform(2, 25, 12), {"a": 3, "b": 4, "c": 6},
                     {"a": 2.5, "b": 1.3, "c": 0.86})
        configs = [_cfg("a", 14000, 8, 2.5), _cfg("b", 7000, 8, 1.3), _cfg("c", 4400, 4, 0.86)]
        loads = [inst.load_tps(a) for a in inst.adapters]
        mixed, _ = best_plan(inst, configs, "cost")
        homo, _ = best_plan(inst, configs, "cost", homogeneous_only=True)
        if homo is not None:
            assert mixed is not None
            assert plan_value("cost", mixed, loads) <= plan_value("cost", homo, loads) + 1e-9


# ----------------------------------------------------------------------------- twin-measured
def _cap_instance(rate_total: float, duration: float = 120.0):
    per = 2
    return instance_from_dict({
        "name": "caps", "adapters": [{"id": f"a{i}", "rank": 16, "rate": rate_total / per}
                                     for i in range(per)],
        "gpus": [{"name": "h100", "gpu": "H100-64GB", "model": LLAMA, "availability": 1,
                  "price_per_hour": 2.0, "power_caps_w": [300, 700]}],
        "objective": "energy", "duration_s": duration, "seed": 0})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))
    return tmp_path


def test_energy_picks_the_lower_cap_under_slack_and_the_full_cap_under_tight_demand(cache):
    from optim.config_greedy import solve_configurations
    from optim.exact.templates import solve_templates
    slack = _cap_instance(4.0)                       # ~1,700 tok/s offered
    configs = config_index(slack, workers=2)
    by_cap = {c.cap_w: c for c in configs}
    assert set(by_cap) == {300.0, 700.0}
    low, full = by_cap[300.0], by_cap[700.0]
    assert low.capacity_tps < full.capacity_tps      # a lower cap never carries more
    assert low.power_w(2000) < full.power_w(2000)
    for solve in (lambda i: solve_configurations(i, "energy", True, None, 2),
                  lambda i: solve_templates(i, "energy", 30, True, None, 2)):
        p = solve(slack)
        assert p.verdict == "accepted" and [g.power_cap_w for g in p.gpus] == [300.0]
        assert p.gpus[0].verified.avg_power_w <= 300.0
    mid = 0.5 * (low.capacity_tps + full.capacity_tps)
    tight = _cap_instance(mid / slack.mean_tokens)
    assert config_index(tight, workers=2) == configs   # same measurements (cached)
    bins = plan_configurations(tight, configs, "energy")
    assert [b.config.cap_w for b in bins] == [700.0]
    exact, proven, _ = _solve_model(tight, configs, "energy", 20, None, 2)
    assert proven and [b.config.cap_w for b in exact] == [700.0]


def test_each_gpu_is_verified_with_its_own_profile_and_cap(cache):
    from optim.placement import GpuPlan
    from optim.verify import verify
    from optim.placement import Placement, plan_gpu
    inst = instance_from_dict({
        "name": "two", "adapters": [{"id": "x", "rank": 16, "rate": 8.0},
                                    {"id": "y", "rank": 16, "rate": 8.0}],
        "gpus": [{"name": "h100", "gpu": "H100-64GB", "model": LLAMA, "availability": 1,
                  "power_caps_w": [250]},
                 {"name": "l40s", "gpu": "L40S", "model": LLAMA, "availability": 1}],
        "duration_s": 120})
    plans = []
    for t, a in zip(inst.gpu_types, inst.adapters):
        p = plan_gpu(t.name, t.profile, 4, [(a, 1.0)], inst.mean_tokens)
        plans.append(GpuPlan(p.gpu_type, p.profile, p.max_loras, p.max_lora_rank, p.adapters,
                             p.offered_tps, None, None, t.power_caps_w[0] if t.power_caps_w
                             else None))
    v = verify(Placement("two", "manual", "solved", tuple(plans)), inst, workers=1)
    h, l = v.gpus
    assert h.verified.avg_power_w <= 250.0 + 1e-6
    assert "L40S" in l.profile and l.verified.avg_power_w <= 350.0
    assert l.verified.throughput_tps < h.verified.throughput_tps   # the L40S is the slower
    again = GpuPlan.from_dict(json.loads(json.dumps(h.to_dict())))
    assert again.power_cap_w == 250.0


# ----------------------------------------------------------------------------- instances
def test_shipped_hetero_instances_load_and_round_trip():
    files = sorted((REPO / "instances" / "hetero").glob("*.json"))
    assert len(files) >= 6
    for f in files:
        inst = load_instance(f)
        assert inst.uses_configurations
        again = instance_from_dict(inst.to_dict())
        assert again.gpu_types == inst.gpu_types
        assert again.power_budget_w == inst.power_budget_w
        assert again.objective == inst.objective


def test_a_measured_profile_wins_and_derived_types_resolve_to_their_files():
    inst = load_instance(REPO / "instances" / "hetero" / "hetero-mixed-n12.json")
    by = {t.name: t for t in inst.gpu_types}
    assert by["h100"].profile == LLAMA                  # H100-64GB + Llama is measured
    assert by["a100"].load_profile().is_derived
    assert by["a100"].load_profile().gpu == "A100-80GB"


def test_old_instances_do_not_use_configurations():
    for f in list((REPO / "instances" / "small").glob("*.json"))[:5]:
        assert not load_instance(f).uses_configurations


GOOD = {"name": "g", "adapters": [{"id": "a", "rank": 16, "rate": 1.0}],
        "gpus": [{"name": "a100", "gpu": "A100-80GB", "model": LLAMA, "availability": 2,
                  "price_per_hour": 1.3, "power_caps_w": [250, 400]}]}


def _bad(change):
    d = json.loads(json.dumps(GOOD))
    change(d)
    return d


@pytest.mark.parametrize("change, field", [
    (lambda d: d["gpus"][0].update(gpu="B200"), "gpus[0].gpu"),
    (lambda d: d["gpus"][0].update(model="gpt-9"), "gpus[0].model"),
    (lambda d: d["gpus"][0].pop("model"), "gpus[0].model"),
    (lambda d: d["gpus"][0].update(profile=LLAMA), "gpus[0].profile"),
    (lambda d: d["gpus"][0].update(count=2), "gpus[0].count"),
    (lambda d: d["gpus"][0].update(availability=0), "gpus[0].availability"),
    (lambda d: d["gpus"][0].update(power_caps_w=[40]), "gpus[0].power_caps_w[0]"),
    (lambda d: d["gpus"][0].update(power_caps_w=[250, 900]), "gpus[0].power_caps_w[1]"),
    (lambda d: d["gpus"][0].update(power_caps_w=[250, 250]), "gpus[0].power_caps_w[1]"),
    (lambda d: d["gpus"][0].update(power_caps_w=[]), "gpus[0].power_caps_w"),
    (lambda d: d["gpus"][0].update(power_caps_w="300"), "gpus[0].power_caps_w"),
    (lambda d: d.update(power_budget_w=-5), "power_budget_w"),
    (lambda d: d.update(power_budget_w="lots"), "power_budget_w"),
    (lambda d: d.update(objective="joules"), "objective.kind"),
    (lambda d: d.update(objective={"kind": "latency", "gpu_budget": 1}), "objective.kind"),
])
def test_bad_hetero_fields_name_the_field(change, field):
    with pytest.raises(InstanceError) as e:
        instance_from_dict(_bad(change), source="bad.json")
    assert f"field '{field}'" in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_hetero_instance_is_one_line_on_the_command_line(tmp_path, capsys):
    from optim.cli import main
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(_bad(lambda d: d["gpus"][0].update(power_caps_w=[1000]))))
    assert main(["solve", str(f), "--method", "greedy", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "gpus[0].power_caps_w[0]" in err and "1000" in err


@settings(max_examples=50, deadline=None)
@given(pts=st.lists(st.tuples(st.floats(100, 20000), st.floats(50, 700)), min_size=2,
                    max_size=6, unique_by=lambda p: round(p[0])))
def test_power_line_is_never_below_a_measured_point(pts):
    from optim.gpu_configs import power_line
    icpt, slope = power_line(pts)
    assert slope >= 0
    assert all(icpt + slope * x >= y - 1e-6 * max(1.0, y) for x, y in pts)


def test_a_derived_profile_file_is_placed_by_configurations_never_by_a_surrogate(tmp_path):
    from twin.derive import profile_for
    prof = profile_for("A100-80GB", LLAMA)
    f = tmp_path / "a100.json"
    prof.to_json(f)
    inst = instance_from_dict({"name": "d", "adapters": [{"id": "a", "rank": 16, "rate": 1.0}],
                               "gpus": [{"name": "a100", "profile": str(f), "count": 1}]})
    assert inst.uses_configurations
