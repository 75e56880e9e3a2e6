"""A count one GPU above a bound of two is certified by the canonical two-GPU exclusion
(``feasibility.two_gpus_excluded``) where the split replays do not reach
(``raise_bound_to``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from optim import feasibility as F
from optim.instance import instance_from_dict, load_instance
from twin.slo import Slo

REPO = Path(__file__).resolve().parents[1]
LLAMA = "llama-3.1-8b-instruct"


def _inst(n: int) -> object:
    return instance_from_dict({
        "name": "pair-cert", "adapters": [{"id": f"a{i:03d}", "rank": 8, "rate": 0.5}
                                          for i in range(n)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 4}], "duration_s": 120.0})


def _spy(monkeypatch, splits):
    calls = []
    monkeypatch.setattr(F, "fullest_gpu_excluded", lambda *a, **k: False)
    monkeypatch.setattr(F, "busiest_gpu_excluded", lambda *a, **k: False)
    monkeypatch.setattr(F, "two_gpu_splits_excluded", lambda *a, **k: splits)

    def pair(inst, duration_s, workers=None, max_checks=64):
        calls.append((len(inst.adapters), max_checks))
        return True
    monkeypatch.setattr(F, "two_gpus_excluded", pair)
    return calls


def test_the_pair_exclusion_runs_when_the_splits_do_not_reach(monkeypatch):
    calls = _spy(monkeypatch, None)
    assert F.raise_bound_to(_inst(30), 2, 3, 120.0) == 3
    assert calls == [(30, F.CERT_PAIR_CHECKS)]
    assert F.raise_bound_to(_inst(30), 3, 4, 120.0) == 3          # only for a bound of two
    assert F.raise_bound_to(_inst(30), 2, 4, 120.0) == 2          # only one step up
    assert len(calls) == 1


def test_the_pair_exclusion_is_skipped_on_many_adapters_and_after_the_splits(monkeypatch):
    calls = _spy(monkeypatch, None)
    assert F.raise_bound_to(_inst(F.CERT_PAIR_MAX_ADAPTERS + 1), 2, 3, 120.0) == 2
    calls = _spy(monkeypatch, True)
    assert F.raise_bound_to(_inst(30), 2, 3, 120.0) == 3 and calls == []


def test_sixty_four_adapters_under_a_loose_slo_need_three_gpus():
    """``paper-llama-rmixed-qhigh-n64`` at p99 TTFT 10 s / p99 ITL 200 ms (600 s window): the
    bound is 2 (3 with the count-partition bound's limits cached), the split replays do not
    reach 64 adapters, and the exclusions show that no two GPUs serve it. Sampled two-GPU placements inside the load window (random
    halves) are all rejected by the twin at every Amax and rank, either way round."""
    path = REPO / "instances" / "paper" / "paper-llama-rmixed-qhigh-n64.json"
    inst = replace(load_instance(path), slo=Slo(ttft_p99_ms=10_000.0, itl_p99_ms=200.0))
    dur = 600.0
    # 2, or 3 where the count limits of the count-partition bound are cached already
    assert F.lora_gpu_lower_bound(inst, dur, 2) in (2, 3)
    assert F.two_gpu_splits_excluded(inst, dur, 2) is None
    assert F.raise_bound_to(inst, 2, 3, dur, 2) == 3
    cap = max(F.one_adapter_caps(inst, dur, 2).values())
    loads = np.array([inst.load_tps(a) for a in inst.adapters])
    rng = np.random.default_rng(0)
    tried = 0
    while tried < 4:
        first = [int(i) for i in np.flatnonzero(rng.random(len(loads)) < 0.5)]
        if not first or max(loads[first].sum(), loads.sum() - loads[first].sum()) > cap:
            continue
        tried += 1
        a, b = F._split_groups(inst, first)
        for x, y in ((a, b), (b, a)):
            assert not (F._gpu_accepted(inst, x, inst.seed, dur, 2)
                        and F._gpu_accepted(inst, y, inst.seed + 1, dur, 2))
