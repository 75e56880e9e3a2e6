"""The exact methods on classical bin packing (constant capacity): public Falkenauer instances
proven optimal through the CLI, honest bounds, warm starts and time limits."""

from __future__ import annotations

import json
import time

import pytest

from tests.exact_helpers import BPP_OPTIMA, bpplib_instance
from optim.cli import main


def _solve(tmp_path, doc: dict, method: str, limit: float, extra=()) -> dict:
    inst = tmp_path / f"{doc['name']}.json"
    inst.write_text(json.dumps(doc))
    out = tmp_path / f"{doc['name']}-{method}.out.json"
    rc = main(["solve", str(inst), "--method", method, "--time-limit", str(limit),
               "--no-verify", "--json", str(out), "--force", "--quiet", *extra])
    d = json.loads(out.read_text())
    d["rc"] = rc
    return d


@pytest.mark.parametrize("name", sorted(BPP_OPTIMA))
@pytest.mark.parametrize("method", ["cpsat", "milp"])
def test_falkenauer_instances_proven_optimal_within_20_s(tmp_path, name, method):
    d = _solve(tmp_path, bpplib_instance(name), method, 20)
    assert d["rc"] == 0
    assert d["status"] == "optimal", d["notes"]
    assert d["gpus_used"] == BPP_OPTIMA[name]
    assert d["best_bound"] == BPP_OPTIMA[name]
    assert d["params"]["claim"] == "optimal for the constant capacities"
    assert d["params"]["warm_start_used"]


def test_reported_bound_is_the_best_of_every_computed_bound(tmp_path):
    d = _solve(tmp_path, bpplib_instance("Falkenauer_u120_08"), "cpsat", 20)
    p = d["params"]
    computed = [p["bounds"][k] for k in ("l1", "l2", "count")]
    computed += [x["bound"] for x in p["iterations"] if x["bound"] is not None]
    computed += [-(-x["lp_bound"] // 1) for x in p["iterations"] if x.get("lp_bound")]
    assert d["best_bound"] >= max(computed)
    # L1 (ceil of the load over the capacity) is 50 here, and so is the optimum
    assert p["bounds"]["l1"] == 50 == d["best_bound"]


def test_time_limit_bounds_the_whole_method_on_a_large_instance(tmp_path):
    """A 5,000-adapter surrogate instance with a 6 s limit: the method (bounds, heuristics,
    model building, search) ends within 10 % or 2 s of it and returns its best placement with
    a bound and a gap."""
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "instances" / "large" / "large-llama-n5000.json"
    doc = json.loads(src.read_text())
    doc["adapters"] = str(src.parent / doc["adapters"])      # the adapters CSV, in place
    t0 = time.perf_counter()
    d = _solve(tmp_path, doc, "milp", 6)
    assert d["wall_time_s"] <= 6 + 2.0
    assert d["gpus_used"] > 0 and d["status"] in ("solved", "optimal")
    assert d["best_bound"] is not None and d["params"]["gap"] is not None
    assert time.perf_counter() - t0 < 60


def test_warm_start_from_first_fit_is_used_in_constant_mode(tmp_path):
    """Greedy (surrogate) ignores the constant capacity; the exact methods start from
    first/best-fit decreasing computed with it, and the start is used."""
    d = _solve(tmp_path, bpplib_instance("Falkenauer_t120_01"), "cpsat", 20)
    it = d["params"]["iterations"][0]
    assert it["warm_start_used"] and it["start"] in ("ffd", "bfd", "lp-dive", "colgen-dive")
    assert set(d["params"]["starts"]) >= {"ffd"}


def test_warm_start_is_used_in_surrogate_mode(tmp_path):
    """On a surrogate instance the first-fit start (and greedy's, when the model admits it) is
    computed with the capacity model's configurations and handed to the solver."""
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "instances" / "small" / \
        "small-02-llama-n32-g2-uniform.json"
    doc = json.loads(src.read_text())
    doc["adapters"] = str(src.parent / doc["adapters"]) if isinstance(doc["adapters"], str) \
        else doc["adapters"]
    for method in ("cpsat", "milp"):
        d = _solve(tmp_path, doc, method, 20)
        assert "ffd" in d["params"]["starts"]
        assert d["params"]["warm_start_used"], method
        assert d["best_bound"] <= d["gpus_used"]


def test_precheck_uses_the_constant_capacity_when_it_exceeds_the_backbone():
    """Items of 60,000 / 50,000 / 30,000 tok/s with capacity_tps 100,000 fit 2 bins: the
    pre-check must judge a constant-capacity type by its capacity, not by the profile's
    backbone throughput (it refused the instance as infeasible)."""
    from optim.feasibility import gpu_lower_bound, precheck
    from optim.instance import instance_from_dict
    from optim.methods import solve
    per = 419.3
    inst = instance_from_dict({
        "name": "big-bins", "adapters": [{"id": k, "rank": 8, "rate": v / per}
                                         for k, v in (("a", 60000), ("b", 50000), ("c", 30000))],
        "gpus": [{"name": "bin", "profile": "llama-3.1-8b-instruct", "count": 3,
                  "capacity_tps": 100000, "capacity_amax": 8}],
        "lengths": {"mean_input": 223.0, "mean_output": 196.3}})
    rep = precheck(inst)
    assert rep.feasible, rep.summary()
    assert gpu_lower_bound(inst) == 2
    p = solve(inst, "cpsat", verify=False)
    assert p.n_gpus == 2 and p.status == "optimal"


def test_classical_study_continues_from_its_stored_runs(tmp_path, monkeypatch, capsys):
    """A stopped study loses nothing: each run is stored as it finishes and a second call with
    the same arguments reuses it instead of solving again (``--fresh`` solves again)."""
    from experiments import classical_bpp
    from tests.exact_helpers import BPP_DIR
    data = str(BPP_DIR / "Falkenauer_t120_00.txt")
    args = ["--data", data, "--methods", "cpsat", "--time-limit", "10",
            "--out-dir", str(tmp_path)]
    assert classical_bpp.main(args) == 0
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert len((tmp_path / "classical_bpp_runs.jsonl").read_text().splitlines()) == 1

    def no_solving(*a, **k):
        raise AssertionError("a stored run was solved again")
    monkeypatch.setattr("optim.methods.solve", no_solving)
    assert classical_bpp.main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == first
    with pytest.raises(AssertionError, match="solved again"):
        classical_bpp.main(args + ["--fresh"])


def test_a_hard28_instance_is_proven_by_column_generation(tmp_path):
    """Hard28's BPP360 (160 items, capacity 1000; the tabu search alone stalls one bin above
    the bound): the column-generation dive packs it into ceil(LP) = 62 bins, optimal at once."""
    d = _solve(tmp_path, bpplib_instance("Hard28/Hard28_BPP360"), "cpsat", 40)
    assert d["rc"] == 0 and d["status"] == "optimal", d["status"]
    assert d["gpus_used"] == 62 and d["best_bound"] == 62


def test_a_hard28_instance_above_its_lp_bound_is_proven_optimal(tmp_path):
    """Hard28's BPP716 (180 items, capacity 1000): ceil(LP) = 75 bins, optimum 76; branch-and-
    price proves 75 infeasible (about a second after the root here), so first-fit's 76 bins
    are optimal (about 7 s with the first tabu search, of a 60 s limit)."""
    d = _solve(tmp_path, bpplib_instance("Hard28/Hard28_BPP716"), "cpsat", 60)
    assert d["rc"] == 0 and d["status"] == "optimal", d["status"]
    assert d["gpus_used"] == 76 and d["best_bound"] == 76


def test_a_capacity_too_fine_for_the_arc_flow_graph_still_gets_the_exact_bound():
    """Scholl's hard set (capacity 100,000) is above the arc-flow graph's node limit, yet it is
    classical bin packing: ``classical_kind`` finds its one bin without the graph."""
    from optim.exact import arcflow
    from optim.exact.capacity import build_problem
    from optim.exact.loop import classical_kind
    from optim.instance import instance_from_dict
    inst = instance_from_dict(bpplib_instance("Scholl_3/Scholl_3_HARD0"), source="HARD0")
    P = build_problem(inst, "gpus")
    assert arcflow.applicable(P) is None and arcflow.build_graph(P) is None
    kind = classical_kind(P)
    assert kind is not None
    assert kind.cap * kind.divisor == P.types[kind.type_index].configs[kind.config_index].cap
    assert sorted(kind.weights(P)) == sorted(w // kind.divisor for w in P.loads)


def test_a_scholl_hard_instance_is_proven_without_the_graph(tmp_path):
    """Scholl_3 HARD0 (200 items of 20,000-35,000, capacity 100,000): L1 = 55 bins, the
    Gilmore-Gomory LP 55.007, so column generation proves 56, and the tabu search packs 56
    (about 12 s of a 60 s limit here; before, the assignment model ended at 57 with bound 55)."""
    d = _solve(tmp_path, bpplib_instance("Scholl_3/Scholl_3_HARD0"), "cpsat", 60)
    assert d["rc"] == 0 and d["status"] == "optimal", d["status"]
    assert d["gpus_used"] == 56 and d["best_bound"] == 56


def test_graph_free_and_graph_paths_agree_on_a_coarse_instance():
    """The same packings at two scales: weights in 200..449 with capacity 1,000 (the arc-flow
    graph is built), and 100 x each weight plus 0..3 with capacity 100,099 (too fine for it;
    a bin holds at most 5 items, so a set fits there exactly when it fits the coarse bin): both
    reach the same proven optimum."""
    from optim.exact import arcflow
    from optim.exact.capacity import build_problem
    from optim.exact.classical import BinPackingFile, classical_instance
    from optim.instance import instance_from_dict
    from optim.methods import solve
    from optim.registry import MethodOptions
    import numpy as np
    rng = np.random.default_rng(3)
    w = [int(x) for x in rng.integers(200, 450, 40)]
    fine = [100 * x + int(d) for x, d in zip(w, rng.integers(0, 4, len(w)))]
    out = []
    for name, cap, ws in (("coarse", 1000, w), ("fine", 100_099, fine)):
        inst = instance_from_dict(classical_instance(BinPackingFile(name, cap, tuple(ws))),
                                  source=name)
        graph = arcflow.build_graph(build_problem(inst, "gpus"))
        assert (graph is None) == (name == "fine")
        p = solve(inst, "cpsat", objective="gpus", options=MethodOptions(time_limit_s=30))
        out.append((p.status, p.n_gpus, p.best_bound))
    assert out[0] == out[1] and out[0][0] == "optimal", out
