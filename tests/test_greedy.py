"""Greedy Maxpack: ordering, testing points, pool exhaustion, errors (with a stand-in surrogate
whose capacity is a known constant, so the expected packing is exact)."""

from __future__ import annotations

import numpy as np
import pytest

import optim.greedy as G
from optim.instance import instance_from_dict
from surrogates.features import IDX
from twin.workload import Adapter

MEAN_IN, MEAN_OUT = 200.0, 200.0


class CapModel:
    """Feasible iff the summed offered load is <= cap (any Amax); throughput = min(load, cap)."""

    def __init__(self, cap: float):
        self.cap = cap
        self.calls = 0

    def predict_unchecked(self, M):
        self.calls += 1
        load = M[:, IDX["load"]]
        return np.minimum(load, self.cap), load > self.cap + 1e-9


def make_inst(loads, gpus=8, ranks=None):
    ranks = ranks or [16] * len(loads)
    d = {
        "schema_version": 1, "name": "t",
        "adapters": [{"id": f"a{i}", "rank": r, "rate": L / (MEAN_IN + MEAN_OUT)}
                     for i, (L, r) in enumerate(zip(loads, ranks))],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": gpus,
                  "price_per_hour": 1.0}],
        "lengths": {"mean_input": MEAN_IN, "mean_output": MEAN_OUT},
        "duration_s": 60.0,
    }
    return instance_from_dict(d)


@pytest.fixture
def cap(monkeypatch):
    def install(c):
        m = CapModel(c)
        monkeypatch.setattr(G, "load_fast_model", lambda profile: m)
        return m
    return install


def test_order_groups_ranks_largest_first_and_zigzags_rates():
    ads = [Adapter(f"x{i}", r, q) for i, (r, q) in
           enumerate([(8, 1.0), (32, 0.1), (8, 3.0), (32, 0.3), (8, 2.0), (32, 0.2), (8, 0.5)])]
    order = G.maxpack_order(ads)
    assert [ads[i].rank for i in order] == [32, 32, 32, 8, 8, 8, 8]
    assert [ads[i].rate for i in order] == [0.3, 0.1, 0.2, 3.0, 0.5, 2.0, 1.0]


def test_fill_finds_exact_boundary_and_last_gpu_takes_the_rest(cap):
    cap(1234.0)                      # 12 adapters of load 100 fit, 13 do not
    inst = make_inst([100.0] * 30)
    plans, over, _ = G.greedy_plans(inst, inst.adapters, "gpus")
    assert [p.n_adapters for p in plans] == [12, 12, 6]
    assert not over
    assert sum(p.n_adapters for p in plans) == 30


def test_pool_exhausted_spreads_instead_of_failing(cap):
    cap(100.0)
    # next-fit along the zigzag order needs 3 GPUs; a balanced spread fits in 2
    inst = make_inst([50, 50, 30, 30, 20, 20], gpus=2)
    plans, over, notes = G.greedy_plans(inst, inst.adapters, "gpus")
    assert not over and len(plans) == 2
    assert all(p.offered_tps <= 100.0 + 1e-6 for p in plans)
    assert notes and "spread" in notes[0]


def test_pool_exhausted_and_spread_infeasible_is_over_pool(cap):
    cap(100.0)
    inst = make_inst([90, 90, 90], gpus=2)
    plans, over, _ = G.greedy_plans(inst, inst.adapters, "gpus")
    assert over and len(plans) == 3


def test_adapter_too_big_for_any_gpu_is_a_clear_error(cap):
    cap(100.0)
    inst = make_inst([50, 150])
    with pytest.raises(ValueError, match="cannot be served by any GPU type"):
        G.greedy_plans(inst, inst.adapters, "gpus")


def test_max_rank_set_by_first_adapter_of_each_gpu(cap):
    cap(1000.0)
    inst = make_inst([100] * 20, ranks=[8] * 10 + [32] * 10)
    plans, _, _ = G.greedy_plans(inst, inst.adapters, "gpus")
    assert plans[0].max_lora_rank == 32
    assert all(p.max_lora_rank >= max(a.rank for a, _ in p.adapters) for p in plans)


def test_deterministic(cap):
    cap(777.0)
    rng = np.random.default_rng(3)
    inst = make_inst(list(rng.uniform(10, 200, 60)))
    a = G.greedy_plans(inst, inst.adapters, "gpus")[0]
    b = G.greedy_plans(inst, inst.adapters, "gpus")[0]
    assert [[x.id for x, _ in p.adapters] for p in a] == [[x.id for x, _ in p.adapters] for p in b]


def test_shrink_takes_a_balanced_spread_over_fewer_gpus(cap):
    cap(100.0)
    # next-fit along the zigzag order opens 3 GPUs in a pool of 8; balanced, 2 suffice
    inst = make_inst([50, 50, 30, 30, 20, 20], gpus=8)
    plans, over, _ = G.greedy_plans(inst, inst.adapters, "gpus")
    assert len(plans) == 3 and not over
    from optim.methods import solve
    p = solve(inst, "greedy", verify=False)
    assert p.n_gpus == 2 and any("spread over 2 GPUs" in n for n in p.notes)
    assert all(g.offered_tps <= 100.0 + 1e-6 for g in p.gpus)


class NonMonotone:
    """A hot adapter fails alone (too few adapters for the Amax values it may use) but passes
    among others: feasible iff load <= 100 and (n >= 4 or load <= 40)."""

    def predict_unchecked(self, M):
        load, n = M[:, IDX["load"]], M[:, IDX["n"]]
        ok = (load <= 100.0 + 1e-9) & ((n >= 4) | (load <= 40.0 + 1e-9))
        return np.minimum(load, 100.0), ~ok


def test_fill_takes_the_largest_passing_testing_point(monkeypatch):
    monkeypatch.setattr(G, "load_fast_model", lambda profile: NonMonotone())
    inst = make_inst([60, 10, 10, 10, 10, 10, 10])
    plans, over, _ = G.greedy_plans(inst, inst.adapters, "gpus")
    # prefixes of 1-3 adapters fail (the hot one with fewer than 4), 4 and 5 pass (load 90,
    # 100), 6 fails (110): the GPU takes 5 adapters instead of giving up at the first point
    assert plans[0].n_adapters == 5 and len(plans) == 2 and not over
