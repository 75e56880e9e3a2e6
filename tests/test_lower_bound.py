"""The twin lower bound on GPU counts (``optim.feasibility.lora_gpu_lower_bound``) and the
gpu_savings figures built on it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.gpu_savings import above_bound, reduction, reduction_ceiling
from optim.capacity import lora_max_throughput, lora_peak_throughput
from optim.feasibility import gpu_lower_bound, lora_gpu_lower_bound
from optim.instance import instance_from_dict
from optim.methods import solve
from twin.lengths import default_lengths
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_requests
from twin.workload import Adapter, generate_requests

LLAMA = "llama-3.1-8b-instruct"


@pytest.mark.parametrize("n,amax,rank", [(4, 4, 8), (16, 8, 8), (8, 8, 16), (24, 24, 32)])
def test_peak_bounds_multi_adapter_servers(n, amax, rank):
    """More adapters, slots or rank only cost throughput: a saturated multi-adapter server
    stays below the one-adapter peak of the smallest rank, at every load tried."""
    lengths = default_lengths()
    peak = lora_peak_throughput(LLAMA, 8, lengths)
    prof = load_profile(LLAMA)
    per = lengths.mean_input + lengths.mean_output
    for load in (0.8 * peak, 1.0 * peak, 1.5 * peak):
        ads = [Adapter(f"a{i}", rank, load / per / n) for i in range(n)]
        reqs = generate_requests(ads, 300.0, lengths, seed=3)
        m = simulate_requests(prof, ads, reqs, ServerConfig(max_loras=amax, max_lora_rank=rank),
                              300.0)
        assert m.throughput_tps <= peak


def test_peak_is_at_least_the_saturated_throughput_and_monotone_in_rank():
    lengths = default_lengths()
    p8 = lora_peak_throughput(LLAMA, 8, lengths)
    assert p8 >= lora_max_throughput(LLAMA, 8, lengths, n_adapters=1)
    assert lora_peak_throughput(LLAMA, 9, lengths) == lora_peak_throughput(LLAMA, 16, lengths)
    assert lora_peak_throughput(LLAMA, 64, lengths) == 0.0          # no such rank starts


def _inst(adapters, count=8):
    return instance_from_dict({
        "name": "lb", "adapters": [{"id": f"a{i}", "rank": r, "rate": q}
                                   for i, (r, q) in enumerate(adapters)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": count}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}, "duration_s": 600.0})


def test_lower_bound_formula_and_it_is_tighter_than_the_backbone_bound():
    inst = _inst([(8, 2.4)] * 40)
    peak = lora_peak_throughput(LLAMA, 8, inst.lengths)
    lb = lora_gpu_lower_bound(inst)
    assert lb == math.ceil(0.9 * inst.total_load_tps / peak)
    assert lb >= gpu_lower_bound(inst) and lb > gpu_lower_bound(inst)   # 40 x 1006 tok/s


def test_no_accepted_placement_uses_fewer_gpus_than_the_bound():
    inst = _inst([((8, 16, 32)[i % 3], (2.4, 1.2, 0.6)[i % 3]) for i in range(36)])
    lb = lora_gpu_lower_bound(inst)
    for method in ("greedy", "maxbase"):
        p = solve(inst, method, verify=True, duration_s=600.0)
        if p.verdict == "accepted":
            assert p.n_gpus >= lb


def _rows():
    # instance x: maxbase 4 (lb 1), greedy 1; instance y: maxbase 2 (lb 2), greedy 2
    return pd.DataFrame([
        {"instance": "x", "lb": 1, "method": "maxbase", "gpus": 4, "failed": False},
        {"instance": "x", "lb": 1, "method": "greedy", "gpus": 1, "failed": False},
        {"instance": "y", "lb": 2, "method": "maxbase", "gpus": 2, "failed": True},
        {"instance": "y", "lb": 2, "method": "greedy", "gpus": 3, "failed": False},
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
