"""The exact methods' twin loop replays a GPU the twin rejects at the capacity model's (grid)
Amax at every integer Amax before it cuts the model (optim.exact.loop.integer_amax_rescue)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from optim.exact.loop import integer_amax_rescue
from optim.instance import load_instance
from optim.placement import Placement, plan_gpu
from optim.verify import verify
from twin.workload import Adapter

REPO = Path(__file__).resolve().parent.parent
LLAMA = "llama-3.1-8b-instruct"


def test_a_gpu_rejected_at_grid_amax_is_accepted_between_grid_values():
    """paper-llama-rlow-qmixed-n64 on one GPU (3600 s, seed 0) is rejected at the grid's 8, 16
    and 64 (scores 0.62, 0.92, 0.96) and accepted at Amax 20-40 (best about 30)."""
    inst = load_instance(REPO / "instances" / "paper" / "paper-llama-rlow-qmixed-n64.json")
    one = Placement(inst.name, "cpsat", "solved",
                    (plan_gpu("h100", LLAMA, 16, [(a, 1.0) for a in inst.adapters],
                              inst.mean_tokens, 8),))
    checked = verify(one, inst, duration_s=inst.duration_s, workers=2)
    assert checked.verdict == "rejected"
    out, n = integer_amax_rescue(inst, checked, inst.duration_s, 2, time.perf_counter() + 600)
    assert n == 1 and out.verdict == "accepted"
    assert 20 <= out.gpus[0].max_loras <= 40 and out.gpus[0].verified.ok
    assert any("another integer Amax" in x for x in out.notes)
    # past the deadline nothing is searched and the placement comes back as it was
    same, n = integer_amax_rescue(inst, checked, inst.duration_s, 2, time.perf_counter())
    assert n == 0 and same is checked
    # nor when the search's replays, at the loop's measured replay time, would pass it
    same, n = integer_amax_rescue(inst, checked, inst.duration_s, 2, time.perf_counter() + 600,
                                  replay_s=100.0)
    assert n == 0 and same is checked


def test_gpus_no_integer_amax_serves_are_left_for_the_cuts():
    """Two adapters carrying about 40,000 tok/s (more than twice what one GPU serves): rejected
    at every Amax, so the placement comes back unchanged for the model's cuts."""
    base = load_instance(REPO / "instances" / "paper" / "paper-llama-rlow-qmixed-n64.json")
    per_req = base.mean_tokens
    ads = (Adapter("hot0", 8, 20_000.0 / per_req), Adapter("hot1", 8, 20_000.0 / per_req))
    inst = replace(base, adapters=ads)
    one = Placement(inst.name, "cpsat", "solved",
                    (plan_gpu("h100", LLAMA, 2, [(a, 1.0) for a in ads], per_req, 8),))
    checked = verify(one, inst, duration_s=300.0, workers=2)
    assert checked.verdict == "rejected"
    out, n = integer_amax_rescue(inst, checked, 300.0, 2, time.perf_counter() + 600)
    assert n == 0 and out is checked
