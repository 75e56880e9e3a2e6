"""Each GPU's max_loras is its best integer Amax in the twin once a placement is accepted
(optim.amax_tuning), checked against brute force through the operator's path (verify)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import optim.amax_tuning as T
from optim.capacity import max_startable_amax
from optim.instance import load_instance
from optim.methods import MethodOptions, solve
from optim.placement import Placement, plan_gpu
from optim.verify import verify
from twin.workload import Adapter

REPO = Path(__file__).resolve().parent.parent
LLAMA = "llama-3.1-8b-instruct"
WINDOW_S = 300.0


def _base():
    return load_instance(REPO / "instances" / "paper" / "paper-llama-rlow-qmixed-n64.json")


def _score(inst, m) -> float:
    """The twin's score of one verified GPU, computed from what verify reports."""
    if m.memory_error:
        return -np.inf
    s = m.throughput_tps / (inst.starvation_threshold * m.offered_realised_tps)
    return min(s, np.nextafter(1.0, 0.0)) if not m.ok else max(s, 1.0)


def _sampled_gpu(seed: int):
    """A GPU of 2-32 adapters of mixed ranks whose load is near what one GPU carries."""
    rng = np.random.default_rng(seed)
    base = _base()
    n = int(rng.integers(2, 33))
    ranks = rng.choice([8, 16, 32], size=n)
    loads = rng.dirichlet(np.ones(n)) * rng.uniform(6_000, 14_000)
    ads = tuple(Adapter(f"a{seed}_{i}", int(r), float(x) / base.mean_tokens)
                for i, (r, x) in enumerate(zip(ranks, loads)))
    inst = replace(base, adapters=ads, seed=int(seed))
    plan = plan_gpu("h100", LLAMA, 8, [(a, 1.0) for a in ads], inst.mean_tokens)
    return inst, plan


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_the_chosen_amax_is_the_best_integer_one_by_brute_force(seed):
    """Every Amax 1..n + 4 replayed through verify: none scores above the chosen one by more
    than the tie tolerance (so nothing above n + 1 either), and no smaller Amax ties it."""
    inst, plan = _sampled_gpu(seed)
    best, rec = T.best_integer_amax(inst, plan, inst.seed, WINDOW_S, workers=2)
    top = min(plan.n_adapters + 4, max_startable_amax(plan.profile, plan.max_lora_rank))
    scores = {}
    for a in range(1, top + 1):
        p = Placement(inst.name, "test", "solved", (replace(plan, max_loras=a),))
        scores[a] = _score(inst, verify(p, inst, duration_s=WINDOW_S, workers=2).gpus[0].verified)
    hi = max(scores.values())
    assert rec.exhaustive and rec.upper == min(plan.n_adapters + 1, top)
    if hi < 1.0:                      # no Amax serves it: nothing is chosen
        assert best is None
        return
    assert best is not None and best.max_loras == rec.after
    tol = T.TIE_RTOL * abs(hi)
    assert scores[rec.after] >= hi - tol
    assert all(scores[a] < hi - tol or scores[a] < 1.0 for a in range(1, rec.after)), scores
    assert scores[rec.after] == pytest.approx(rec.score)


def test_solve_tunes_every_gpu_and_the_verdict_is_the_tuned_one():
    """Greedy's 2-GPU plan of the shipped example: every GPU at its exhaustive best, accepted,
    and a fresh verify of the tuned placement reproduces its metrics (same draws)."""
    from optim.plan import EXAMPLE_CSV, plan_instance
    inst = plan_instance(EXAMPLE_CSV, duration_s=WINDOW_S)
    plain = solve(inst, "greedy", options=MethodOptions(extra={"tune_amax": False}),
                  verify=True, workers=2)
    tuned = solve(inst, "greedy", verify=True, workers=2)
    assert plain.n_gpus == tuned.n_gpus and tuned.verdict == "accepted"
    rec = tuned.params["amax_tuning"]
    assert rec["done"] and rec["exhaustive"] and len(rec["gpus"]) == tuned.n_gpus
    assert [g["after"] for g in rec["gpus"]] == [g.max_loras for g in tuned.gpus]
    assert [g["before"] for g in rec["gpus"]] == [g.max_loras for g in plain.gpus]
    assert all(g.max_loras <= g.n_adapters + 1 for g in tuned.gpus)
    again = verify(tuned.with_(gpus=tuple(replace(g, verified=None) for g in tuned.gpus)),
                   inst, duration_s=WINDOW_S, workers=2)
    assert [g.verified for g in again.gpus] == [g.verified for g in tuned.gpus]
    assert "amax_tuning" not in plain.params


def test_a_larger_gpu_takes_the_search_and_keeps_the_packings_amax_when_it_is_better(monkeypatch):
    inst, plan = _sampled_gpu(1)
    monkeypatch.setattr(T, "BRUTE_MAX", 2)
    best, rec = T.best_integer_amax(inst, plan, inst.seed, WINDOW_S, workers=2)
    assert not rec.exhaustive and best is not None
    own = Placement(inst.name, "test", "solved", (plan,))
    own_score = _score(inst, verify(own, inst, duration_s=WINDOW_S, workers=2).gpus[0].verified)
    assert rec.score >= own_score or own_score < 1.0


def test_tuning_is_skipped_with_its_reason():
    inst, plan = _sampled_gpu(2)
    p = verify(Placement(inst.name, "test", "solved", (replace(plan, max_loras=plan.n_adapters + 1),)),
               inst, duration_s=WINDOW_S, workers=2)
    assert p.verdict == "accepted"
    cheap = T.tune_amax(inst, p, WINDOW_S, workers=2, max_requests=10.0)
    assert cheap.gpus == p.gpus and not cheap.params["amax_tuning"]["done"]
    assert "exceed the cap" in cheap.params["amax_tuning"]["why"]
    assert any("not tuned" in n for n in cheap.notes)
    a = plan.adapters[0][0]
    halves = (replace(plan, adapters=((a, 0.5),) + plan.adapters[1:]),
              plan_gpu("h100", LLAMA, 2, [(a, 0.5)], inst.mean_tokens))
    split = Placement(inst.name, "test", "solved", halves).with_(verdict="accepted")
    out = T.tune_amax(inst, split, WINDOW_S, workers=2)     # refused before any replay
    assert "split" in out.params["amax_tuning"]["why"] and out.gpus == split.gpus
    full, searched = (T.replays_needed(inst, p.gpus, WINDOW_S),
                      T.replays_needed(inst, p.gpus, WINDOW_S, brute_max=0))
    assert searched < full                  # a GPU of 27 adapters: 16 replays, not 28
    mid = T.tune_amax(inst, p, WINDOW_S, workers=2, max_requests=(full + searched) / 2)
    assert mid.params["amax_tuning"]["done"] and not mid.params["amax_tuning"]["exhaustive"]
    assert mid.verdict == "accepted"
    budget = T.tune_amax(replace(inst, power_budget_w=5_000.0), p, WINDOW_S, workers=2)
    assert budget.gpus == p.gpus and "power" in budget.params["amax_tuning"]["why"]
    rejected = p.with_(verdict="rejected")
    assert T.tune_amax(inst, rejected, WINDOW_S, workers=2) is rejected


def test_an_interrupt_during_tuning_keeps_the_accepted_placement(monkeypatch):
    """Ctrl-C while the twin tunes: solve raises Interrupted carrying the accepted, untuned
    placement, which `optim solve --json` then writes (marked interrupted)."""
    from optim.plan import EXAMPLE_CSV, plan_instance
    from twin.cli_support import Interrupted

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(T, "tune_amax", stop)
    inst = plan_instance(EXAMPLE_CSV, duration_s=WINDOW_S)
    with pytest.raises(Interrupted) as e:
        solve(inst, "greedy", verify=True, workers=2)
    assert e.value.partial is not None and e.value.partial.verdict == "accepted"
    assert "amax_tuning" not in e.value.partial.params
