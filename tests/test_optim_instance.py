"""Instance schema validation, CSV adapters, and infeasibility pre-checks."""

from __future__ import annotations

import copy
import json

import pytest

from optim.feasibility import precheck
from optim.instance import InstanceError, instance_from_dict, load_instance, write_instance

LLAMA = "llama-3.1-8b-instruct"


def base() -> dict:
    return {"name": "t", "adapters": [{"id": "a", "rank": 8, "rate": 0.5},
                                      {"id": "b", "rank": 16, "rate": 0.2}],
            "gpus": [{"name": "h100", "profile": LLAMA, "count": 2, "price_per_hour": 2.5}],
            "lengths": {"mean_input": 223.0, "mean_output": 196.3}}


def test_valid_instance_defaults():
    inst = instance_from_dict(base())
    assert inst.starvation_threshold == 0.9 and inst.objective.kind == "gpus"
    assert inst.duration_s == 3600 and inst.seed == 0
    assert abs(inst.mean_tokens - 419.3) < 1e-6
    assert len(inst.adapters) == 2 and inst.total_gpus_available == 2
    assert inst.headroom is False and "headroom" not in inst.to_dict()
    judged = instance_from_dict({**base(), "headroom": True})
    assert judged.headroom and instance_from_dict(judged.to_dict()).headroom


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("name"), "name"),
    (lambda d: d.update(adapters=[]), "adapters"),
    (lambda d: d["adapters"][1].update(rate=-1), "adapters[1].rate"),
    (lambda d: d["adapters"][0].update(rank="x"), "adapters[0].rank"),
    (lambda d: d["adapters"][1].update(id="a"), "adapters[1].id"),
    (lambda d: d["adapters"][0].pop("rate"), "adapters[0].rate"),
    (lambda d: d["gpus"][0].update(count=0), "gpus[0].count"),
    (lambda d: d["gpus"][0].update(profile="nope"), "gpus[0].profile"),
    (lambda d: d["gpus"][0].update(price_per_hour=-2), "gpus[0].price_per_hour"),
    (lambda d: d["gpus"][0].update(colour="red"), "gpus[0].colour"),
    (lambda d: d["gpus"].append({"name": "q", "profile": "qwen-2.5-7b-instruct", "count": 1}),
     "gpus"),
    (lambda d: d.update(lengths={"mean_input": 223.0}), "lengths.mean_output"),
    (lambda d: d.update(starvation_threshold=1.5), "starvation_threshold"),
    (lambda d: d.update(objective="speed"), "objective.kind"),
    (lambda d: d.update(objective={"kind": "latency"}), "objective.gpu_budget"),
    (lambda d: d.update(objective={"kind": "latency", "gpu_budget": 9}), "objective.gpu_budget"),
    (lambda d: d.update(solver={"time_limit_s": 0}), "solver.time_limit_s"),
    (lambda d: d.update(solver={"timelimit": 5}), "solver.timelimit"),
    (lambda d: d.update(duration_s="long"), "duration_s"),
    (lambda d: d.update(seed=-1), "seed"),
    (lambda d: d.update(headroom="yes"), "headroom"),
    (lambda d: d.update(headroom=1), "headroom"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.update(schema_version=2), "schema_version"),
])
def test_schema_errors_name_the_field(mutate, field):
    d = copy.deepcopy(base())
    mutate(d)
    with pytest.raises(InstanceError) as e:
        instance_from_dict(d, source="x.json")
    assert e.value.field == field
    assert f"field '{field}'" in str(e.value) and "x.json" in str(e.value)


def test_csv_adapters_relative_to_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ads.csv").write_text("id,rank,rate\nx,8,0.1\ny,32,0.2\n")
    d = base()
    d["adapters"] = "ads.csv"
    (tmp_path / "sub" / "i.json").write_text(json.dumps(d))
    inst = load_instance(tmp_path / "sub" / "i.json")
    assert [a.id for a in inst.adapters] == ["x", "y"]
    d["adapters"] = "missing.csv"
    (tmp_path / "sub" / "j.json").write_text(json.dumps(d))
    with pytest.raises(InstanceError, match="adapters.*not found"):
        load_instance(tmp_path / "sub" / "j.json")


def test_invalid_json_and_round_trip(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{nope")
    with pytest.raises(InstanceError, match="invalid JSON"):
        load_instance(p)
    inst = instance_from_dict(base())
    files = write_instance(inst, tmp_path / "rt.json", adapters_csv=True)
    assert len(files) == 2
    again = load_instance(tmp_path / "rt.json")
    assert again.adapters == inst.adapters and again.gpu_types == inst.gpu_types


def test_precheck_feasible_and_reasons():
    assert precheck(instance_from_dict(base())).feasible
    d = base()
    d["adapters"] = [{"id": "hot", "rank": 8, "rate": 200.0},      # ~84k tok/s: no GPU can
                     {"id": "odd", "rank": 64, "rate": 0.1}]       # rank 64 unsupported
    rep = precheck(instance_from_dict(d))
    codes = {r.code for r in rep.reasons}
    assert codes == {"adapter_overload", "rank_unsupported", "pool_capacity"}
    assert not rep.feasible and "hot" in next(r for r in rep.reasons
                                              if r.code == "adapter_overload").items
    assert rep.to_dict()["feasible"] is False
    # splitting methods are bounded by the pool total only
    assert "adapter_overload" not in {r.code for r in precheck(instance_from_dict(d),
                                                                allow_split=True).reasons}


def test_precheck_too_few_gpus_and_budget():
    d = base()
    d["adapters"] = [{"id": f"a{i}", "rank": 8, "rate": 20.0} for i in range(8)]  # ~67k tok/s
    d["gpus"][0]["count"] = 2
    rep = precheck(instance_from_dict(d))
    assert [r.code for r in rep.reasons] == ["pool_capacity"] and rep.gpu_lower_bound >= 3
    d["gpus"][0]["count"] = 8
    d["objective"] = {"kind": "latency", "gpu_budget": 2}
    assert [r.code for r in precheck(instance_from_dict(d)).reasons] == ["gpu_budget"]


def test_solve_reports_infeasible_without_exception():
    from optim.methods import solve
    d = base()
    d["adapters"] = [{"id": "hot", "rank": 8, "rate": 200.0}]
    p = solve(instance_from_dict(d), "maxbase")
    assert p.status == "infeasible" and not p.gpus and not p.feasible
    assert "adapter_overload" in p.to_json()
