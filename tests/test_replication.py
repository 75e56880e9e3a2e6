"""Replication with routing weights (issue 15): an adapter split over up to ``max_homes`` GPUs by
greedy and by the exact models, verified by the twin; infeasibility named; k = 1 unchanged;
exact split models against brute force."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import optim.greedy as G
from optim.exact.bounds import infeasible_adapters, lower_bounds
from optim.exact.brute import brute_force, brute_force_split
from optim.exact.common import SolveResult
from optim.exact.cpsat import solve_cpsat
from optim.exact.milp import solve_milp
from optim.exact.problem import Config, PackingProblem, TypeSpec
from optim.exact.split import balance_shares
from optim.instance import InstanceError, instance_from_dict, load_instance
from optim.methods import MethodOptions, adapter_homes, solve
from optim.placement import shares_consistent
from surrogates.features import IDX
from tests.exact_helpers import random_problem

REPO = Path(__file__).resolve().parent.parent
HOT = REPO / "instances" / "replication" / "replication-hot-n9.json"
SMALL = REPO / "instances" / "small" / "small-04-llama-n8-g3-lognormal.json"


def _check_homes(p, inst, k):
    """Twin-accepted, every adapter routed with shares summing to 1, at most k homes each."""
    assert p.verdict == "accepted", p.summary()
    assert shares_consistent(p.gpus, inst.adapters) == []
    homes = adapter_homes(p)
    assert all(len(h) <= k for h in homes.values())
    assert all(len({g for g, _ in h}) == len(h) for h in homes.values())   # distinct GPUs
    return homes


# --------------------------------------------------------------------------- instance field
def _doc(**extra):
    d = {"name": "t", "adapters": [{"id": "a", "rank": 8, "rate": 1.0}],
         "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": 4}]}
    return {**d, **extra}


def test_max_homes_field_default_validation_and_round_trip():
    assert instance_from_dict(_doc()).max_homes == 1
    inst = instance_from_dict(_doc(max_homes=3))
    assert inst.max_homes == 3 and inst.to_dict()["max_homes"] == 3
    assert "max_homes" not in instance_from_dict(_doc()).to_dict()
    with pytest.raises(InstanceError, match="field 'max_homes': must be >= 1"):
        instance_from_dict(_doc(max_homes=0))
    with pytest.raises(InstanceError, match="field 'max_homes': 5 exceeds the 4 GPU"):
        instance_from_dict(_doc(max_homes=5))
    with pytest.raises(InstanceError, match="field 'max_homes': must be an integer"):
        instance_from_dict(_doc(max_homes=2.5))


# --------------------------------------------------------------------------- greedy, stand-in
class CapModel:
    """Feasible iff the summed offered load is <= cap (any Amax)."""

    def __init__(self, cap: float):
        self.cap = cap

    def predict_unchecked(self, M):
        load = M[:, IDX["load"]]
        return np.minimum(load, self.cap), load > self.cap + 1e-9


def _cap_inst(loads, k, gpus=8):
    return instance_from_dict({
        "name": "t", "max_homes": k,
        "adapters": [{"id": f"a{i}", "rank": 16, "rate": L / 400.0} for i, L in enumerate(loads)],
        "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct", "count": gpus}],
        "lengths": {"mean_input": 200.0, "mean_output": 200.0}, "duration_s": 60.0})


def test_replicate_splits_only_what_one_gpu_cannot_serve(monkeypatch):
    monkeypatch.setattr(G, "load_fast_model", lambda profile: CapModel(100.0))
    inst = _cap_inst([250.0, 40.0, 30.0, 20.0], k=3)
    ads, shares, notes = G.replicate(inst)
    assert [a.id for a in ads] == ["a0", "a0", "a0", "a1", "a2", "a3"]
    assert shares[:3] == [1 / 3] * 3 and shares[3:] == [1.0] * 3
    assert "a0 over 3 GPUs" in notes[0]
    plans, over, _ = G.greedy_plans(inst, ads, "gpus", shares=shares)
    assert not over
    holders = [g for g, p in enumerate(plans) for a, _ in p.adapters if a.id == "a0"]
    assert len(holders) == len(set(holders)) == 3          # three shares, three GPUs
    assert all(p.offered_tps <= 100.0 + 1e-6 for p in plans)
    # k = 3 on an instance without such adapters: nothing is split, same plans as k = 1
    cold = _cap_inst([60.0, 40.0, 30.0, 20.0, 50.0], k=3)
    assert G.replicate(cold)[1] == [1.0] * 5
    a = G.greedy(cold, _obj(cold), MethodOptions())
    b = G.greedy(replace(cold, max_homes=1), _obj(cold), MethodOptions())
    assert [[(x.id, s) for x, s in g.adapters] for g in a.gpus] == \
        [[(x.id, s) for x, s in g.adapters] for g in b.gpus]


def _obj(inst):
    from optim.objectives import make_objective
    return make_objective(inst, None)


def test_spread_keeps_shares_of_one_adapter_on_distinct_gpus(monkeypatch):
    from optim.balance import balanced_members
    monkeypatch.setattr(G, "load_fast_model", lambda profile: CapModel(100.0))
    inst = _cap_inst([180.0, 10.0, 10.0], k=2)
    ads, shares, _ = G.replicate(inst)
    members = balanced_members(inst, ads, 2, shares)
    for mem in members:
        assert len({ads[i].id for i in mem}) == len(mem)
    assert balanced_members(inst, ads, 1, shares) is None        # two shares, one GPU: impossible


def test_greedy_names_an_adapter_beyond_k_gpus(monkeypatch):
    monkeypatch.setattr(G, "load_fast_model", lambda profile: CapModel(100.0))
    inst = _cap_inst([350.0, 40.0], k=3)
    p = G.greedy(inst, _obj(inst), MethodOptions())
    assert p.status == "failed"
    assert "adapter 'a0'" in p.notes[0] and "max_homes=3" in p.notes[0]


# --------------------------------------------------------------------------- the hot instance
def test_greedy_serves_the_hot_adapter_split_over_three_gpus():
    inst = load_instance(HOT)
    assert inst.max_homes == 3
    p = solve(inst, "greedy", verify=True, workers=1)
    homes = _check_homes(p, inst, 3)
    assert len(homes["hot"]) >= 2
    assert any(n.startswith("homes of 1 split adapter(s): hot -> gpu") for n in p.notes)
    # without replication the same instance is infeasible: 'hot' exceeds one GPU
    q = solve(replace(inst, max_homes=1), "greedy", verify=False)
    assert q.status == "infeasible"
    assert any("'hot'" in r.message for r in q.feasibility.reasons)


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_exact_split_model_serves_the_hot_adapter(solver):
    inst = load_instance(HOT)
    # no warm start: the placement is the model's own, not greedy's incumbent
    p = solve(inst, solver, options=MethodOptions(time_limit_s=60,
                                                  extra={"warm_start": False, "threads": 1}),
              verify=True, workers=1)
    homes = _check_homes(p, inst, 3)
    assert len(homes["hot"]) >= 2
    assert p.n_gpus == 3 and p.params["max_homes"] == 3
    assert p.params["bounds"]["l2"] == p.params["bounds"]["l1"]       # L2 not used
    assert any("split problem" in n for n in p.notes)
    assert p.params["iterations"][-1]["verdict"] == "accepted"


def test_over_k_gpus_is_infeasible_naming_the_adapter():
    d = json.loads(HOT.read_text())
    d["adapters"][0]["rate"] = 90.0
    # 'hot' at 90 req/s (about 37.7k tok/s) passes the backbone pre-check with 2 homes (2 x 25k),
    # but the capacity model's largest rank-16 cap for it (about 15.3k) times 2 cannot carry it
    two = instance_from_dict({**d, "max_homes": 2})
    for solver in ("cpsat", "milp"):
        p = solve(two, solver, verify=False)
        assert p.status == "infeasible", p.summary()
        assert any(n.endswith(": hot") and "max_homes=2" in n for n in p.notes), p.notes
    g = solve(two, "greedy", verify=False)
    assert g.status == "failed" and "adapter 'hot'" in g.notes[0] and "max_homes=2" in g.notes[0]
    # beyond k x the backbone limit the pre-check refuses it before any method runs
    d["adapters"][0]["rate"] = 200.0
    heavy = instance_from_dict(d)
    p = solve(heavy, "greedy", verify=False)
    assert p.status == "infeasible"
    msg = " ".join(r.message for r in p.feasibility.reasons)
    assert "max_homes=3" in msg and "'hot'" in msg


# greedy (--no-verify) on SMALL before replication existed (commit 834a4e2's code, run with the
# committed surrogates of cefcf03): (Amax, max rank, adapters) per GPU
BEFORE = [(8, 32, ["s4a3", "s4a5", "s4a4", "s4a1"]), (16, 16, ["s4a7", "s4a2", "s4a0"]),
          (8, 16, ["s4a6"])]


def test_k1_and_unneeded_k_reproduce_the_unsplit_placements():
    """max_homes 1 gives the placement greedy gave before replication existed; on an instance
    whose adapters each fit one GPU, greedy with k = 3 returns exactly the k = 1 placement, and
    the split model is a relaxation (never more GPUs) whose k = 1 answer splits nothing."""
    inst = load_instance(SMALL)
    assert inst.max_homes == 1
    a = solve(inst, "greedy", verify=False)
    assert [(g.max_loras, g.max_lora_rank, [x.id for x, _ in g.adapters]) for g in a.gpus] \
        == BEFORE
    b = solve(replace(inst, max_homes=3), "greedy", verify=False)
    assert [[(x.id, s) for x, s in g.adapters] for g in a.gpus] == \
        [[(x.id, s) for x, s in g.adapters] for g in b.gpus]
    assert [g.max_loras for g in a.gpus] == [g.max_loras for g in b.gpus]
    opts = MethodOptions(time_limit_s=30, extra={"threads": 1})
    c1 = solve(inst, "cpsat", options=opts, verify=False)
    c3 = solve(replace(inst, max_homes=3), "cpsat", options=opts, verify=False)
    assert all(s == 1.0 for g in c1.gpus for _, s in g.adapters)
    assert c3.n_gpus <= c1.n_gpus


# --------------------------------------------------------------------------- exact vs brute
def _split_problem(seed: int, k: int, objective: str) -> PackingProblem:
    """A tiny random problem (<= 5 adapters) with one adapter heavier than some caps."""
    P = random_problem(seed, objective)
    n = min(P.n, 5)
    rng = random.Random(seed)
    loads = list(P.loads[:n])
    loads[0] = rng.randint(90, 200)
    return PackingProblem(P.name, P.ids[:n], P.ranks[:n], tuple(loads), P.xs[:n], P.types,
                          objective, None, max_homes=k)


@pytest.mark.parametrize("objective", ["gpus", "cost"])
@pytest.mark.parametrize("seed", range(6))
def test_split_models_agree_with_brute_force(seed, objective):
    P = _split_problem(seed, 2, objective)
    bf = brute_force_split(P)
    one = brute_force(replace(P, max_homes=1))
    for fn in (solve_milp, solve_cpsat):
        r = fn(P, time_limit_s=20, threads=1)
        if bf is None:
            assert r.status == "infeasible", (fn.__name__, r)
            continue
        assert r.status == "optimal", (fn.__name__, r)
        assert r.objective == pytest.approx(bf[0], abs=1e-6), fn.__name__
        assert P.check_split_solution(r.gpus, [r.gpu_shares(k) for k in range(len(r.gpus))]) \
            == [], fn.__name__
    if bf is not None:
        assert lower_bounds(P, lp=True).best <= bf[0] + 1e-6
        if one is not None:                      # splitting relaxes: never worse
            assert bf[0] <= one[0] + 1e-9


def test_split_needed_and_limited_by_k():
    """Loads 150 and 30 with one configuration of cap 100 (3 GPUs): unsplit infeasible, two
    homes serve it on 2 GPUs; loads 250 need three homes (k = 2 infeasible, named)."""
    t = TypeSpec("g", "none", 3, 1.0, (Config(16, 8, 0, 10, 100, 0, None, "c"),))

    def prob(loads, k):
        return PackingProblem("p", ("hot", "b"), (16, 8), loads, (1, 1), (t,), max_homes=k)

    assert infeasible_adapters(prob((150, 30), 1)) == [0]
    P = prob((150, 30), 2)
    assert infeasible_adapters(P) == []
    assert brute_force_split(P)[0] == 2
    for fn in (solve_milp, solve_cpsat):
        r = fn(P, time_limit_s=20, threads=1)
        assert (r.status, r.objective) == ("optimal", 2)
        homes = [k for k, (_, _, items) in enumerate(r.gpus) if 0 in items]
        assert len(homes) == 2
    assert infeasible_adapters(prob((250, 30), 2)) == [0]
    assert brute_force_split(prob((250, 30), 2)) is None
    assert solve_cpsat(prob((250, 30), 3), time_limit_s=20, threads=1).objective == 3


def test_balance_shares_evens_utilisation_for_the_same_homes():
    t = TypeSpec("g", "none", 3, 1.0, (Config(16, 8, 0, 10, 100, 0, None, "c"),))
    P = PackingProblem("p", ("hot", "b"), (16, 8), (150, 30), (1, 1), (t,), max_homes=2)
    # loads 99 and 81: feasible, one GPU at 99 % of its cap
    lopsided = SolveResult("x", "optimal", 2.0, 2.0, 0.0, ((0, 0, (0,)), (0, 0, (0, 1))),
                           shares=((0.66,), (0.34, 1.0)))
    assert P.check_split_solution(lopsided.gpus, lopsided.shares) == []
    r = balance_shares(P, lopsided)
    assert [g[2] for g in r.gpus] == [(0,), (0, 1)]                  # same homes
    assert P.check_split_solution(r.gpus, r.shares) == []
    assert r.shares[0][0] == pytest.approx(0.6) and r.shares[1][0] == pytest.approx(0.4)
    assert r.details["balanced_peak_utilisation"] == pytest.approx(0.9)
    unsplit = replace(P, max_homes=1)
    assert balance_shares(unsplit, lopsided) is lopsided


def test_cli_max_homes_flag(tmp_path, capsys):
    from optim.cli import main
    out = tmp_path / "p.json"
    d = json.loads(HOT.read_text())
    del d["max_homes"]
    src = tmp_path / "hot.json"
    src.write_text(json.dumps(d))
    assert main(["solve", str(src), "--method", "greedy", "--no-verify", "--quiet",
                 "--max-homes", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "homes of 1 split adapter(s): hot -> gpu0" in text
    rec = json.loads(out.read_text())
    hot = [x["share"] for g in rec["gpus"] for x in g["adapters"] if x["id"] == "hot"]
    assert 2 <= len(hot) <= 3 and sum(hot) == pytest.approx(1.0)     # at most --max-homes
    assert main(["solve", str(src), "--method", "maxbase", "--no-verify", "--quiet",
                 "--max-homes", "3"]) == 2
    assert "--max-homes 3: method 'maxbase'" in capsys.readouterr().err
    assert main(["solve", str(src), "--method", "greedy", "--no-verify", "--quiet",
                 "--max-homes", "7"]) == 2
    assert "exceeds the 6 GPU(s)" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(4))
def test_split_latency_models_agree(seed):
    """Latency objective with replication: HiGHS (continuous shares) and CP-SAT (integer flows)
    reach the same optimum (flow integrality), and the split optimum is no worse than k = 1."""
    P = random_problem(seed, "latency")
    P = replace(P, max_homes=2)
    rm = solve_milp(P, time_limit_s=20, threads=1)
    rc = solve_cpsat(P, time_limit_s=20, threads=1)
    assert rm.status == rc.status
    if rm.status == "optimal":
        assert rm.objective == pytest.approx(rc.objective, rel=1e-4, abs=1e-3)
        for r in (rm, rc):
            assert P.check_split_solution(r.gpus, [r.gpu_shares(k) for k in range(len(r.gpus))]) \
                == []
        one = solve_cpsat(replace(P, max_homes=1), time_limit_s=20, threads=1)
        if one.status == "optimal":
            assert rc.objective <= one.objective + 1e-6


@pytest.mark.parametrize("seed", range(8))
def test_greedy_split_placements_are_consistent(monkeypatch, seed):
    """Random loads with some adapters above one GPU (stand-in capacity 100): every adapter
    routed in full, shares of one adapter on distinct GPUs, at most k homes, no GPU above the
    capacity; the fleet never beats the capacity bound."""
    monkeypatch.setattr(G, "load_fast_model", lambda profile: CapModel(100.0))
    rng = np.random.default_rng(seed)
    loads = list(rng.uniform(5, 60, 12)) + list(rng.uniform(110, 280, 2))
    inst = _cap_inst(loads, k=3, gpus=20)
    p = G.greedy(inst, _obj(inst), MethodOptions())
    assert p.status == "solved", p.notes
    assert shares_consistent(p.gpus, inst.adapters) == []
    for hs in adapter_homes(p).values():
        assert len(hs) <= 3 and len({g for g, _ in hs}) == len(hs)
    assert all(g.offered_tps <= 100.0 + 1e-6 for g in p.gpus)
    assert p.n_gpus >= int(np.ceil(sum(loads) / 100.0 - 1e-9))


@pytest.mark.parametrize("seed", range(6))
def test_split_fit_start_is_admitted_and_no_better_than_optimal(seed):
    from optim.exact.split import as_split_start, split_fit
    P = _split_problem(seed, 2, "gpus")
    st = split_fit(P)
    bf = brute_force_split(P)
    if st is None:
        return
    assert P.check_split_solution(st.gpus, st.shares) == []
    assert bf is not None and st.objective >= bf[0] - 1e-9
    again = as_split_start(P, [(t, items, st.gpu_shares(k))
                               for k, (t, _, items) in enumerate(st.gpus)])
    assert again is not None and again.objective == st.objective
    for fn in (solve_milp, solve_cpsat):            # the hinted solve still proves the optimum
        r = fn(P, time_limit_s=20, threads=1, split_hint=st)
        assert (r.status, r.objective) == ("optimal", bf[0])


def test_split_start_for_the_hot_adapter():
    from optim.exact.capacity import build_problem
    from optim.exact.split import as_split_start, split_fit
    inst = load_instance(HOT)
    P = build_problem(inst)
    st = split_fit(P)
    assert st is not None and P.check_split_solution(st.gpus, st.shares) == []
    hot = [k for k, (_, _, items) in enumerate(st.gpus) if 0 in items]
    assert 2 <= len(hot) <= 3
    # a placement with 'hot' twice on one GPU is not admitted
    bad = [(0, [0, 0], [0.5, 0.5])] + [(0, list(range(1, 9)), [1.0] * 8)]
    assert as_split_start(P, bad) is None
