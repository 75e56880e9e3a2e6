"""Each baseline's defining behaviour, determinism, the registry and the vLLM arguments."""

from __future__ import annotations

import math

import pytest

from optim.capacity import backbone_max_throughput, max_startable_amax
from optim.instance import instance_from_dict
from optim.methods import MethodOptions, get_method, method_names, register_method, solve
from optim.placement import Placement, shares_consistent

LLAMA = "llama-3.1-8b-instruct"


def make(adapters, count=16, **kw):
    d = {"name": "t", "adapters": [{"id": i, "rank": r, "rate": q} for i, r, q in adapters],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": count, "price_per_hour": 2.0}],
         "lengths": {"mean_input": 223.0, "mean_output": 196.3}, **kw}
    return instance_from_dict(d)


def mixed(n, rate=1.0):
    return make([(f"a{i}", (8, 16, 32)[i % 3], rate * (1 + i % 4)) for i in range(n)])


def test_registry_lists_baselines_and_accepts_new_methods():
    assert {"maxbase", "maxbase-half", "random", "dlora", "loraserve"} <= set(method_names())
    with pytest.raises(ValueError):
        register_method("maxbase", lambda *a: None)
    with pytest.raises(KeyError, match="unknown method"):
        get_method("nope")


def test_maxbase_fills_to_backbone_capacity_with_amax_n():
    inst = mixed(60)
    p = solve(inst, "maxbase")
    cap = backbone_max_throughput(LLAMA, inst.lengths)
    assert p.status == "solved" and not shares_consistent(p.gpus, inst.adapters)
    for g in p.gpus:
        assert g.max_loras == g.n_adapters
        assert g.offered_tps <= cap + 1e-6
    # first fit: every adapter of GPU k+1 onwards did not fit in any earlier GPU
    loads = [g.offered_tps for g in p.gpus]
    first_later = p.gpus[1].adapters[0][0]
    assert loads[0] + inst.load_tps(first_later) > cap
    assert p.n_gpus == math.ceil(inst.total_load_tps / cap) or p.n_gpus > 1


def test_maxbase_memory_guard_and_half():
    inst = make([(f"a{i}", 32, 0.005) for i in range(200)])        # tiny load, many rank-32
    p = solve(inst, "maxbase")
    assert all(g.max_loras <= max_startable_amax(LLAMA, 32) for g in p.gpus)
    assert p.n_gpus == math.ceil(200 / max_startable_amax(LLAMA, 32))
    h = solve(inst, "maxbase-half")
    assert all(g.max_loras == math.ceil(g.n_adapters / 2) for g in h.gpus)
    assert h.n_gpus < p.n_gpus


def test_maxbase_scaled_out_balances_load_with_all_adapters_resident():
    inst = mixed(60)
    own = solve(inst, "maxbase")
    for half in (False, True):
        name = "maxbase-half" if half else "maxbase"
        p = solve(inst, name, options=MethodOptions(n_gpus=own.n_gpus + 2))
        assert p.n_gpus == own.n_gpus + 2 and p.params["scaled_out"]
        assert not shares_consistent(p.gpus, inst.adapters)
        for g in p.gpus:
            assert g.max_loras == (math.ceil(g.n_adapters / 2) if half else g.n_adapters)
        loads = [g.offered_tps for g in p.gpus]
        # least-loaded assignment: no GPU exceeds another by more than one adapter's load
        assert max(loads) - min(loads) <= max(inst.load_tps(a) for a in inst.adapters) + 1e-6
    with pytest.raises(ValueError, match="n_gpus"):
        solve(inst, "maxbase", options=MethodOptions(n_gpus=0))


def test_random_is_seeded_and_amax_in_range():
    inst = mixed(40)
    a = solve(inst, "random", options=MethodOptions(n_gpus=4, seed=7))
    b = solve(inst, "random", options=MethodOptions(n_gpus=4, seed=7))
    c = solve(inst, "random", options=MethodOptions(n_gpus=4, seed=8))
    key = lambda p: [(g.max_loras, [x.id for x, _ in g.adapters]) for g in p.gpus]
    assert key(a) == key(b) and key(a) != key(c)
    assert all(1 <= g.max_loras <= g.n_adapters for g in a.gpus)
    assert a.n_gpus <= 4 and not shares_consistent(a.gpus, inst.adapters)


def test_dlora_replicates_and_splits_uniformly():
    inst = mixed(12, rate=0.5)
    p = solve(inst, "dlora", options=MethodOptions(n_gpus=3))
    assert not shares_consistent(p.gpus, inst.adapters)
    hosts: dict[str, list[float]] = {}
    for g in p.gpus:
        assert g.max_loras == g.n_adapters
        for a, s in g.adapters:
            hosts.setdefault(a.id, []).append(s)
    assert sum(len(v) for v in hosts.values()) >= 3 + 12 - 1       # n + M - 1 replicas
    assert any(len(v) > 1 for v in hosts.values())
    for v in hosts.values():
        assert all(abs(s - 1 / len(v)) < 1e-12 for s in v)         # uniform split


def test_loraserve_rank_budgets_and_fractional_split():
    inst = make([(f"h{i}", 32, 6.0) for i in range(6)] + [(f"l{i}", 8, 6.0) for i in range(6)])
    p = solve(inst, "loraserve")
    assert p.status == "solved" and not shares_consistent(p.gpus, inst.adapters)
    n = p.params["n_gpus"]
    assert p.params["target_util"] <= 1 + 1e-9 and n >= 2
    # rank-aware: rank-32 adapters stay on the GPUs budgeted to rank 32 (leftovers only move to
    # GPUs whose max rank is at least the adapter's)
    budgets = p.params["rank_budgets"]
    assert set(budgets) == {8, 32} and sum(budgets.values()) == n
    hosts32 = [g for g in p.gpus if any(a.rank == 32 for a, _ in g.adapters)]
    assert len(hosts32) == budgets[32]
    small = solve(inst, "loraserve", options=MethodOptions(n_gpus=1))
    assert small.status == "failed" and not small.gpus and "not enough GPUs" in small.notes[0]
    split = make([("big", 8, 30.0), ("s", 8, 1.0)])               # ~12.6k tok/s on 1-2 GPUs
    q = solve(split, "loraserve", options=MethodOptions(n_gpus=2))
    assert sum(1 for g in q.gpus for a, _ in g.adapters if a.id == "big") == 2


@pytest.mark.parametrize("method", ["maxbase", "maxbase-half", "random", "dlora", "loraserve"])
def test_determinism_and_json_round_trip(method):
    inst = mixed(30)
    a, b = solve(inst, method), solve(inst, method)
    strip = lambda p: {**p.to_dict(), "wall_time_s": 0}
    assert strip(a) == strip(b)
    again = Placement.from_dict(a.to_dict())
    assert strip(again) == strip(a)


def test_vllm_args():
    inst = make([("x", 8, 0.5), ("y", 16, 0.5), ("z", 32, 0.5)])
    p = solve(inst, "maxbase-half")
    (g,) = p.vllm_args(adapter_dir="/models/loras")
    args = g["args"]
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"
    assert args[args.index("--max-cpu-loras") + 1] == "3"
    assert args[args.index("--max-lora-rank") + 1] == "32"
    mods = args[args.index("--lora-modules") + 1:]
    assert mods == ["x=/models/loras/x", "y=/models/loras/y", "z=/models/loras/z"]
    assert " vllm serve meta-llama/Llama-3.1-8B-Instruct " in f" {g['command']} "
    assert g["command"].endswith(" ".join(args)) and g["command"] == g["serve_command"]
    assert g["routing"] == {"x": 1.0, "y": 1.0, "z": 1.0}


def test_objectives_values():
    from optim.objectives import make_objective
    d = {"name": "c", "adapters": [{"id": f"a{i}", "rank": 8, "rate": 10.0} for i in range(6)],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": 1, "price_per_hour": 3.0},
                  {"name": "spot", "profile": LLAMA, "count": 4, "price_per_hour": 1.0}],
         "objective": "cost"}
    inst = instance_from_dict(d)
    p = solve(inst, "maxbase")
    assert all(g.gpu_type == "spot" for g in p.gpus)        # cheaper per capacity first
    assert p.objective == "cost" and p.objective_value == sum(1.0 for _ in p.gpus)
    assert make_objective(inst, "gpus").value(p) == p.n_gpus
