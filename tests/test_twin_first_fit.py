"""The twin's first-fit packing (optim.twin_first_fit) and greedy's use of it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from optim.greedy import _twin_first_fit
from optim.instance import load_instance
from optim.objectives import make_objective
from optim.placement import Placement, plan_gpu
from optim.registry import MethodOptions
from optim.twin_first_fit import twin_first_fit
from optim.verify import verify
from twin.slo import Slo

REPO = Path(__file__).resolve().parent.parent
LOOSE = Slo(ttft_p99_ms=10_000.0, itl_p99_ms=200.0)     # experiments.slo_placement's loose level


@pytest.fixture(scope="module")
def loose_n64():
    """paper-llama-rhigh-qhigh-n64 under the loose SLO: greedy's packing, repaired and
    compacted, takes 4 GPUs; the twin lower bound is 3."""
    inst = load_instance(REPO / "instances" / "paper" / "paper-llama-rhigh-qhigh-n64.json")
    return replace(inst, slo=LOOSE, duration_s=600.0)


@pytest.fixture(scope="module")
def packed(loose_n64):
    return twin_first_fit(loose_n64, 600.0, 2)


def test_the_first_fit_places_every_adapter_once_on_gpus_the_twin_accepts(loose_n64, packed):
    assert packed is not None and packed.method == "greedy"
    ids = sorted(a.id for g in packed.gpus for a, s in g.adapters)
    assert ids == sorted(a.id for a in loose_n64.adapters)
    assert all(s == 1.0 for g in packed.gpus for _, s in g.adapters)
    assert packed.n_gpus == 3
    checked = verify(packed, loose_n64, 600.0, workers=2)
    assert checked.verdict == "accepted"
    assert all(g.verified.ok for g in checked.gpus)
    # heaviest first: no GPU holds an adapter lighter than one a later GPU holds first
    first = [max(loose_n64.load_tps(a) for a, _ in g.adapters) for g in packed.gpus]
    assert first == sorted(first, reverse=True)


def test_the_same_instance_packs_the_same_way(loose_n64, packed):
    again = twin_first_fit(loose_n64, 600.0, 1)
    assert [[a.id for a, _ in g.adapters] for g in again.gpus] == \
        [[a.id for a, _ in g.adapters] for g in packed.gpus]
    assert [g.max_loras for g in again.gpus] == [g.max_loras for g in packed.gpus]


def test_a_spent_budget_or_a_split_instance_gives_none(loose_n64):
    assert twin_first_fit(loose_n64, 600.0, 1, max_requests=1.0) is None
    assert twin_first_fit(loose_n64, 600.0, 1, max_gpus=2) is None     # it needs 3
    assert twin_first_fit(replace(loose_n64, max_homes=2), 600.0, 1) is None


def test_greedy_keeps_the_first_fit_only_when_it_uses_fewer_gpus(loose_n64, packed):
    """A four-GPU placement (greedy's count) gives way to the first fit's three; a
    placement already on three GPUs stays as it was (the first fit stops at three), with a
    note."""
    obj = make_objective(loose_n64, "gpus")
    opts = MethodOptions(extra={"compact": False, "workers": 2})
    ads = sorted(loose_n64.adapters, key=lambda a: a.id)
    gt = loose_n64.gpu_types[0]
    four = Placement(loose_n64.name, "greedy", "solved", tuple(
        plan_gpu(gt.name, gt.profile, 16, [(a, 1.0) for a in ads[i::4]], loose_n64.mean_tokens)
        for i in range(4)))
    four = verify(four, loose_n64, 600.0, workers=2)
    out = _twin_first_fit(loose_n64, four, obj, 600.0, "fast", {}, opts)
    assert out.n_gpus == 3 and out.verdict == "accepted"
    assert any("twin's first-fit packing took 3" in n for n in out.notes)
    three = verify(packed, loose_n64, 600.0, workers=2)
    same = _twin_first_fit(loose_n64, three, obj, 600.0, "fast", {}, opts)
    assert same.gpus == three.gpus and same.verdict == "accepted"
    assert any("no placement on fewer than 3" in n for n in same.notes)


def test_a_rejected_placement_gives_way_to_the_first_fit_on_any_count(loose_n64):
    """One GPU holding all 64 adapters is rejected under the SLO: the first fit is not stopped
    at its count and its accepted three GPUs are kept."""
    obj = make_objective(loose_n64, "gpus")
    opts = MethodOptions(extra={"compact": False, "workers": 2})
    gt = loose_n64.gpu_types[0]
    one = Placement(loose_n64.name, "greedy", "solved", (
        plan_gpu(gt.name, gt.profile, 32, [(a, 1.0) for a in loose_n64.adapters],
                 loose_n64.mean_tokens),))
    one = verify(one, loose_n64, 600.0, workers=2)
    assert one.verdict == "rejected"
    out = _twin_first_fit(loose_n64, one, obj, 600.0, "fast", {}, opts)
    assert out.verdict == "accepted" and out.n_gpus == 3
