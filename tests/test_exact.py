"""Exact models (MILP / CP-SAT): brute-force agreement, published bin-packing optima, constant
capacity instances, objectives, infeasibility, surrogate pieces, twin-in-the-loop cuts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from optim.exact.brute import brute_force
from optim.exact.cpsat import solve_cpsat
from optim.exact.milp import solve_milp
from optim.exact.problem import CapacityCut, Config, Cut
from tests.exact_helpers import bin_packing, random_problem

SOLVERS = (solve_milp, solve_cpsat)
LLAMA = "llama-3.1-8b-instruct"


def _solve(fn, P, **kw):
    r = fn(P, time_limit_s=20, threads=1, **kw)
    if r.gpus:
        assert P.check_solution(r.gpus) == [], r
    return r


@pytest.mark.parametrize("objective", ["gpus", "cost", "latency"])
@pytest.mark.parametrize("seed", range(8))
def test_agree_with_brute_force(seed, objective):
    P = random_problem(seed, objective)
    bf = brute_force(P)
    for fn in SOLVERS:
        r = _solve(fn, P)
        if bf is None:
            assert r.status == "infeasible", (fn.__name__, r)
        else:
            assert r.status == "optimal", (fn.__name__, r)
            assert r.objective == pytest.approx(bf[0], rel=1e-6, abs=1e-6), fn.__name__


def test_martello_toth_example():
    """Worked example of Martello & Toth (1990), *Knapsack Problems*, ch. 8: n = 10, c = 100,
    w = (49, 41, 34, 33, 29, 26, 26, 22, 20, 19); optimum 3 bins (sum 299 > 200, and
    {49, 29, 22}, {41, 33, 26}, {34, 26, 20, 19} packs them)."""
    P = bin_packing([49, 41, 34, 33, 29, 26, 26, 22, 20, 19], 100, 5)
    for fn in SOLVERS:
        r = _solve(fn, P)
        assert (r.status, r.objective) == ("optimal", 3)


def _triplets(m: int, seed: int):
    """Falkenauer's 'triplet' construction (Falkenauer 1996, J. Heuristics 2:5-30; OR-Library
    binpack5-8): bins of capacity 1000 each filled exactly by three items, one in (380, 490)
    and two splitting the remainder (each in (250, 380)); the optimum is m bins by
    construction (the total is exactly m x capacity)."""
    rng = np.random.default_rng(seed)
    w = []
    for _ in range(m):
        a = int(rng.integers(381, 490))
        b = int(rng.integers(250, 1000 - a - 250 + 1))
        c = 1000 - a - b
        w += [a, b, c]
    rng.shuffle(w)
    return [int(v) for v in w]


@pytest.mark.parametrize("m", [4, 6])
def test_falkenauer_triplets(m):
    P = bin_packing(_triplets(m, m), 1000, m + 2)
    for fn in SOLVERS:
        r = _solve(fn, P)
        assert (r.status, r.objective) == ("optimal", m)


def test_items_above_half_need_one_bin_each():
    """Every item > C/2: the optimum is n (the case where L2 > L1, Martello & Toth 1990)."""
    P = bin_packing([51, 52, 60, 70, 55], 100, 6)
    for fn in SOLVERS:
        assert _solve(fn, P).objective == 5


def test_too_few_bins_is_infeasible():
    P = bin_packing([60, 60, 60], 100, 2)
    for fn in SOLVERS:
        assert _solve(fn, P).status == "infeasible"
    assert brute_force(P) is None


def test_cost_price_one_equals_gpus():
    for seed in range(4):
        P = random_problem(seed, "gpus")
        from dataclasses import replace
        P1 = replace(P, types=tuple(replace(t, price=1.0) for t in P.types), objective="cost")
        for fn in SOLVERS:
            a, b = _solve(fn, P), _solve(fn, P1)
            assert a.status == b.status
            if a.status == "optimal":
                assert a.objective == pytest.approx(b.objective)


def test_warm_start_and_cuts():
    P = bin_packing([40, 40, 30, 30, 20], 100, 4)
    start = [(0, [0, 1]), (0, [2, 3, 4])]
    for fn in SOLVERS:
        r = _solve(fn, P, warm_start=start)
        assert r.warm_start_used and r.objective == 2
    # adapter 0 may share a GPU with no other adapter (superset cuts) -> 3 bins
    Pc = P.with_cuts([Cut(0, 8, 8, frozenset({0, k}), superset=True) for k in (1, 2, 3, 4)])
    bf = brute_force(Pc)
    for fn in SOLVERS:
        assert _solve(fn, Pc).objective == bf[0] == 3


def test_capacity_cut_splits_and_tightens_pieces():
    cfgs = (Config(8, 8, 0, 10, 100), Config(8, 8, 11, 20, 90), Config(8, 16, 0, 20, 100),
            Config(16, 8, 0, 20, 100), Config(8, 8, 21, 30, 40),
            Config(8, 8, 21, 30, 100, load_lo=70))
    out = CapacityCut(0, 8, 8, x=5, load=60).apply(cfgs)
    # the piece holding x=5 and those above lowered, other (rank, Amax) untouched, a cap already
    # below kept, an emptied latency piece (load_lo 70 > new cap 59) dropped
    assert out == (Config(8, 8, 0, 10, 59), Config(8, 8, 11, 20, 59),
                   Config(8, 16, 0, 20, 100), Config(16, 8, 0, 20, 100), Config(8, 8, 21, 30, 40))
    # pieces wholly below x are untouched
    assert CapacityCut(0, 8, 8, x=15, load=60).apply(cfgs)[0] == cfgs[0]
    # a cut above every capacity changes nothing
    assert CapacityCut(0, 8, 8, x=0, load=500).apply(cfgs) == cfgs


@pytest.mark.parametrize("seed", range(6))
def test_capacity_cuts_agree_with_brute_force(seed):
    """After tightening (a cut at the heaviest pair of adapters), both models still agree with
    enumeration, and no solution uses a tightened piece above the cut load."""
    P = random_problem(seed, "gpus")
    top = sorted(range(P.n), key=lambda i: -P.loads[i])[:2]
    c0 = P.types[0].configs[0]
    cut = CapacityCut(0, c0.rank, c0.amax, sum(P.xs[i] for i in top),
                      sum(P.loads[i] for i in top))
    Pc = P.with_capacity_cuts([cut])
    bf = brute_force(Pc)
    for fn in SOLVERS:
        r = _solve(fn, Pc)
        if bf is None:
            assert r.status == "infeasible"
        else:
            assert r.objective == pytest.approx(bf[0])


# ------------------------------------------------------------------ instances
def _const_instance(tmp_path, weights_tps, cap, count, extra=None):
    from optim.instance import load_instance
    # lengths fixed at 100 + 100 tokens: rate = load / 200
    d = {"name": "const", "adapters": [{"id": f"a{i}", "rank": 8, "rate": w / 200.0}
                                        for i, w in enumerate(weights_tps)],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": count, "capacity_tps": cap,
                   "capacity_amax": 32}],
         "lengths": {"kind": "fixed", "input_len": 100, "output_len": 100}, "duration_s": 30}
    d.update(extra or {})
    p = tmp_path / "inst.json"
    p.write_text(json.dumps(d))
    return load_instance(p)


def test_constant_capacity_instance_is_bin_packing(tmp_path):
    from optim.exact.capacity import build_problem
    w = [4900, 4100, 3400, 3300, 2900, 2600, 2600, 2200, 2000, 1900]
    inst = _const_instance(tmp_path, w, 10000, 5)
    P = build_problem(inst, "gpus")
    assert P.types[0].source == "constant"
    for fn in SOLVERS:
        r = _solve(fn, P)
        assert (r.status, r.objective) == ("optimal", 3)


def test_constant_capacity_schema_errors(tmp_path):
    from optim.instance import InstanceError, instance_from_dict
    base = {"name": "x", "adapters": [{"id": "a", "rank": 8, "rate": 1.0}]}
    with pytest.raises(InstanceError, match=r"gpus\[0\]\.capacity_amax"):
        instance_from_dict(base | {"gpus": [{"name": "h", "profile": LLAMA, "count": 1,
                                             "capacity_tps": 1000}]})
    with pytest.raises(InstanceError, match=r"gpus\[0\]\.capacity_tps"):
        instance_from_dict(base | {"gpus": [{"name": "h", "profile": LLAMA, "count": 1,
                                             "capacity_tps": -1, "capacity_amax": 8}]})
    with pytest.raises(InstanceError, match=r"gpus\[0\]\.capacity_amax"):
        instance_from_dict(base | {"gpus": [{"name": "h", "profile": LLAMA, "count": 1,
                                             "capacity_tps": 100, "capacity_amax": 100000}]})


def test_infeasible_adapter_reported(tmp_path):
    from optim.exact.loop import solve_exact
    inst = _const_instance(tmp_path, [12000, 100], 10000, 3)
    p = solve_exact(inst, "gpus", solver="cpsat", verify=False, warm_start=False, bounds=False)
    assert p.status == "infeasible" and "a0" in p.notes[0]


def test_surrogate_capacity_model_pieces(tmp_path):
    """A CapacityModel fitted on a tiny synthetic dataset (feasible iff load <= 9000 - 150 n)
    is encoded exactly: both solvers match brute force, and every chosen GPU is predicted
    feasible by the model itself."""
    from surrogates.encodable import CapacityModel
    from surrogates.features import gpu_features
    from surrogates.memory import KvTable
    from twin.profile import load_profile
    from optim.exact.capacity import build_problem
    from optim.instance import instance_from_dict

    rng = np.random.default_rng(0)
    rows, starved = [], []
    for _ in range(600):
        n = int(rng.integers(1, 9))
        rank = int(rng.choice([8, 16]))
        load = float(rng.uniform(500, 12000))
        rate = load / 419.3 / n
        for A in (8, 16):
            rows.append(gpu_features([rank] * n, [rate] * n, A, (223.0, 196.3)))
            starved.append(load > 9000 - 150 * n - (300 if A == 16 else 0))
    X = np.array(rows)
    kv = KvTable.from_profile(load_profile(LLAMA)).to_json()
    cm = CapacityModel(kv_capacity=kv, breaks=(0, 1, 2, 4, 8, 16)).fit(
        X, np.array(starved), X[:, 2])
    d = {"name": "sur", "adapters": [{"id": f"a{i}", "rank": r, "rate": q} for i, (r, q) in
                                     enumerate([(8, 4.0), (8, 4.0), (16, 3.0), (8, 6.0),
                                                (16, 2.0), (8, 1.0), (8, 5.0)])],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": 3}],
         "lengths": {"mean_input": 223.0, "mean_output": 196.3}}
    inst = instance_from_dict(d)
    P = build_problem(inst, "gpus", models={LLAMA: cm})
    bf = brute_force(P)
    for fn in SOLVERS:
        r = _solve(fn, P)
        assert r.objective == bf[0]
        for t, p, items in r.gpus:
            c = P.types[t].configs[p]
            ads = [inst.adapters[i] for i in items]
            f = gpu_features([a.rank for a in ads], [a.rate for a in ads], c.amax,
                             inst.lengths, max_rank=c.rank)
            assert cm.predict_feasible(f[None, :])[0]


def test_twin_loop_cuts_until_accepted(tmp_path):
    """A constant capacity far above what the twin sustains: the first optimum starves on the
    twin, cuts are added and the final placement is accepted."""
    from optim.exact.loop import solve_exact
    inst = _const_instance(tmp_path, [7000, 7000, 7000, 7000], 40000, 4)
    for mode in ("superset", "capacity"):
        p = solve_exact(inst, "gpus", solver="cpsat", verify=True, duration_s=30, workers=1,
                        warm_start=False, cut_mode=mode, bounds=False, time_limit_s=30)
        its = p.params["iterations"]
        assert its[0]["verdict"] == "rejected" and len(its) >= 2, mode
        assert p.verdict == "accepted" and p.params["n_cuts"] >= 1, mode
    # capacity cuts lowered the constant capacity below the rejected load
    assert all(c["load_tps"] <= 40000 for c in p.params["capacity_cuts"])


def test_cli_solve_registered(tmp_path, capsys):
    from optim.cli import main
    from optim.instance import write_instance
    inst = _const_instance(tmp_path, [3000, 3000, 2000], 10000, 2)
    path = tmp_path / "c.json"
    write_instance(inst, path)
    rc = main(["solve", str(path), "--method", "milp", "--no-verify", "--time-limit", "10", "--json", str(tmp_path / "o.json"),
               "--objective", "cost"])
    out = capsys.readouterr().out
    assert rc == 0 and "status=optimal" in out and "gpus=1" in out, (tmp_path / "o.json").read_text()[:1500]


def test_capacity_cut_loop_probes_other_configs(monkeypatch):
    """The capacity cut loop replays a rejected set under every other admitted (rank, Amax) at
    once (the same adapters on several what-if GPUs) and cuts each configuration the twin
    rejects."""
    from types import SimpleNamespace

    import twin.fleet
    from optim.exact.capacity import build_problem
    from optim.exact.loop import capacity_cuts
    from optim.instance import instance_from_dict
    inst = instance_from_dict({
        "name": "probe", "adapters": [{"id": f"a{i}", "rank": 8, "rate": 0.5} for i in range(24)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}]})
    P = build_problem(inst, "gpus")
    items = list(range(P.n))
    admitted = {(P.types[0].configs[p].rank, P.types[0].configs[p].amax)
                for p in P.configs_admitting(0, items)}
    assert len(admitted) >= 2                  # the first and at least one other to probe
    first = sorted(admitted)[0]
    seen = []

    def fake(jobs, check_routing=True, **kw):
        assert not check_routing            # the same adapters appear on several probes
        seen.extend((j.config.max_lora_rank, j.config.max_loras) for j in jobs)
        starve = [j.config.max_loras % 16 == 0 for j in jobs]   # reject every Amax 16k
        return SimpleNamespace(per_gpu=[SimpleNamespace(starved=s, memory_error=False,
                                                        accepted=not s, throughput_tps=4500.0)
                                        for s in starve])
    monkeypatch.setattr(twin.fleet, "simulate_fleet", fake)
    cuts = capacity_cuts(inst, P, [(0, *first, items, None)], duration_s=30, workers=1)
    assert set(seen) == admitted - {first}
    assert (cuts[0].rank, cuts[0].amax) == first
    assert cuts[0].load == sum(P.loads) and cuts[0].x == sum(P.xs)   # no throughput given
    assert {(c.rank, c.amax) for c in cuts[1:]} == {k for k in seen if k[1] % 16 == 0}
    # probes are cut at the twin's throughput / threshold (4500 / 0.9 tok/s) when below L*
    assert all(c.load == min(sum(P.loads), 5_000_000) for c in cuts[1:])


def test_auto_beyond_the_exact_size_repairs_like_greedy():
    """auto hands large instances to greedy; with verification it must get greedy's twin repair
    (it used to call greedy without it and return a placement the twin rejected)."""
    from pathlib import Path

    from optim.instance import load_instance
    from optim.methods import solve
    path = Path(__file__).resolve().parents[1] / "instances/paper/paper-llama-rhigh-qhigh-n32.json"
    inst = load_instance(path)
    auto = solve(inst, "auto", verify=True, duration_s=600.0)
    greedy = solve(inst, "greedy", verify=True, duration_s=600.0)
    assert auto.verdict == "accepted" and greedy.verdict == "accepted"
    assert auto.n_gpus == greedy.n_gpus
    assert any("heuristic 'greedy'" in n for n in auto.notes)
