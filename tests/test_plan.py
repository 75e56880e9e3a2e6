"""The operator's path: ``optim plan`` from an adapters CSV to a plan folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from optim.plan import (PlanError, PlanInputs, PoolEntry, amax_points, make_plan, parse_pool,
                        plan_instance, resolve_gpu)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "instances" / "examples" / "adapters.csv"


def _csv(tmp_path: Path, rows: list[tuple[str, int, float]], name: str = "ads.csv") -> Path:
    p = tmp_path / name
    p.write_text("id,rank,rate\n" + "".join(f"{i},{r},{x}\n" for i, r, x in rows))
    return p


def test_parse_pool():
    assert parse_pool("H100=8@2.49") == PoolEntry("H100", 8, 2.49)
    assert parse_pool("A100-80GB=3") == PoolEntry("A100-80GB", 3, None)
    for bad, why in [("H100", "expected TYPE=COUNT"), ("H100=x", "COUNT must be an integer"),
                     ("H100=0", "COUNT must be in"), ("H100=2@-1", "PRICE must be in"),
                     ("H100=2@nan", "PRICE must be in"), ("H100=2@cheap", "PRICE must be a"),
                     ("H\u202e100=2", "control/format character")]:
        with pytest.raises(PlanError, match=why):
            parse_pool(bad)


def test_resolve_gpu_prefers_the_measured_profile():
    assert resolve_gpu("H100", "llama-3.1-8b-instruct") == "H100-64GB"
    assert resolve_gpu("h100-80gb", "llama-3.1-8b-instruct") == "H100-80GB"
    assert resolve_gpu("a100", "llama-3.1-8b-instruct") == "A100-80GB"
    with pytest.raises(PlanError, match="--gpu 'H'.*not in the catalog"):
        resolve_gpu("H", "llama-3.1-8b-instruct")
    with pytest.raises(PlanError, match="--gpu 'B200'"):
        resolve_gpu("B200", "llama-3.1-8b-instruct")
    with pytest.raises(PlanError, match="--gpu: .*control/format character"):
        resolve_gpu("H100\x00", "llama-3.1-8b-instruct")


def test_plan_instance_from_csv(tmp_path):
    p = _csv(tmp_path, [("a", 8, 1.0), ("b", 16, 2.0), ("c", 32, 0.5)])
    inst = plan_instance(p)
    assert [a.id for a in inst.adapters] == ["a", "b", "c"]
    assert inst.gpu_types[0].profile == "llama-3.1-8b-instruct"   # measured profile, not derived
    assert not inst.uses_configurations
    assert 1 <= inst.total_gpus_available <= 3                      # at most one GPU per adapter
    pooled = plan_instance(p, pool=[PoolEntry("H100", 4, 2.5), PoolEntry("A100", 2, 1.3)],
                           objective="cost")
    assert [(t.count, t.price_per_hour) for t in pooled.gpu_types] == [(4, 2.5), (2, 1.3)]
    with pytest.raises(PlanError, match="given twice"):
        plan_instance(p, pool=[PoolEntry("H100", 1), PoolEntry("H100-64GB", 1)])
    with pytest.raises(PlanError, match="no such file"):
        plan_instance(tmp_path / "missing.csv")
    with pytest.raises(PlanError, match="--model 'gpt-9'"):
        plan_instance(p, model="gpt-9")
    bad = _csv(tmp_path, [("a", 8, -1.0)], "bad.csv")
    with pytest.raises(PlanError, match="bad.csv.*rate"):
        plan_instance(bad)
    # a rank no GPU type of the plan starts: refused with the column, before any twin work
    odd = _csv(tmp_path, [("a", 8, 1.0), ("b", 7, 1.0)], "odd.csv")
    with pytest.raises(PlanError, match=r"odd.csv: column 'rank': .*\[7\].*supported: \[8, 16, 32\].*: b"):
        plan_instance(odd)


def test_amax_points():
    assert amax_points(5, 128, 4) == [1, 2, 3, 4, 5, 6]
    pts = amax_points(300, 192, 40)
    assert pts[:12] == list(range(1, 13)) and pts[-1] == 192 and 40 in pts
    assert amax_points(20, 128, 32)[-1] == 32                 # the chosen value is always drawn
    assert all(a <= 8 for a in amax_points(100, 8, 8))


@pytest.fixture
def small_plan(tmp_path_factory):
    """A plan of four light adapters on a 300 s window (its limits measured in a fresh cache)."""
    tmp = tmp_path_factory.mktemp("plan")
    mp = pytest.MonkeyPatch()
    mp.setenv("LORA_PLACEMENT_CACHE", str(tmp / "cache"))
    try:
        csv = _csv(tmp, [("a", 8, 2.0), ("b", 16, 1.0), ("c", 8, 0.5), ("d", 32, 0.25)])
        inputs = PlanInputs(duration_s=300.0, headroom=False)
        inst = inputs.instance(csv)
        res = make_plan(inst, tmp / "out", workers=2, quiet=True, inputs=inputs)
    finally:
        mp.undo()
    return inst, res, tmp / "out"


def test_plan_folder_holds_every_file(small_plan):
    inst, res, out = small_plan
    p = res.placement
    assert p.verdict == "accepted" and p.n_gpus == 1
    for f in ("placement.json", "report.md", "report.png", "routing.csv", "routing.json",
              "deployment.json", "servers/gpu-0.sh", "servers/gpu-0.json"):
        assert (out / f).is_file(), f
    rec = json.loads((out / "placement.json").read_text())
    assert rec["twin_lower_bound"]["best"] == 1
    assert rec["claim_text"].startswith("optimal in the twin")
    md = (out / "report.md").read_text()
    assert "optimal in the twin" in md and "report.png" in md and "vllm serve" in md
    assert "- max_loras: each GPU's best integer in the twin" in md     # optim.amax_tuning
    assert p.gpus[0].max_loras <= p.gpus[0].n_adapters + 1
    assert rec["params"]["amax_tuning"]["gpus"][0]["after"] == p.gpus[0].max_loras
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    c = res.curves[0]
    assert p.gpus[0].max_loras in c.amaxes and len(c.amaxes) == len(c.served_share)
    assert c.capacity_tps > p.gpus[0].offered_tps          # a light GPU has headroom


def test_routing_table_replayed_in_the_fleet_twin_gives_the_plans_verdict(small_plan):
    """The plan folder alone (routing.json + each server's flags) rebuilds the fleet the twin
    verified: the same per-GPU throughput and the same verdict."""
    from twin.fleet import GpuAssignment, simulate_fleet
    from twin.server import ServerConfig
    from twin.workload import Adapter
    inst, res, out = small_plan
    routing = json.loads((out / "routing.json").read_text())
    per_gpu: dict[int, list] = {}
    for row in routing["adapters"]:
        for h in row["homes"]:
            per_gpu.setdefault(h["gpu"], []).append(
                (Adapter(row["adapter"], row["rank"], row["rate"]), h["share"]))
    jobs = []
    for g in sorted(per_gpu):
        srv = json.loads((out / "servers" / f"gpu-{g}.json").read_text())
        argv = srv["argv"]
        flag = {k: int(argv[argv.index(k) + 1]) for k in ("--max-loras", "--max-lora-rank")}
        jobs.append(GpuAssignment(srv["profile"], ServerConfig(
            max_loras=flag["--max-loras"], max_lora_rank=flag["--max-lora-rank"],
            starvation_threshold=inst.starvation_threshold),
            tuple(sorted(per_gpu[g], key=lambda x: x[0].id))))
    rec = json.loads((out / "placement.json").read_text())
    fleet = simulate_fleet(jobs, duration_s=rec["verify_duration_s"], lengths=inst.lengths,
                           seed=inst.seed, workers=1)
    assert ("accepted" if fleet.feasible else "rejected") == rec["verdict"]
    for m, g in zip(fleet.per_gpu, rec["gpus"]):
        assert m.throughput_tps == pytest.approx(g["verified"]["throughput_tps"], rel=1e-9)


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optim", "plan", *args], capture_output=True,
                          text=True, cwd=cwd or REPO, timeout=300)


def test_cli_refuses_bad_input_in_one_line(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [
        ([str(EXAMPLE), "--pool", "H100=zero", "--out", str(tmp_path / "o1")],
         "error: --pool 'H100=zero': COUNT must be an integer"),
        ([str(EXAMPLE), "--gpu", "TPU", "--out", str(tmp_path / "o2")], "error: --gpu 'TPU'"),
        ([str(EXAMPLE), "--out", str(full)], "folder exists and is not empty"),
        ([str(tmp_path / "none.csv"), "--out", str(tmp_path / "o3")], "no such file"),
        ([str(EXAMPLE), "--method", "random", "--out", str(tmp_path / "o4")],
         "plan needs a method that sizes the fleet"),
    ]
    for args, msg in cases:
        r = _cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.stderr
    assert (full / "keep.txt").read_text() == "mine"          # nothing the user had is touched
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


def test_console_script_dispatches(capsys):
    from optim.console import main
    assert main(["methods"]) == 0
    assert "greedy" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert main([]) == 2


def test_shipped_limits_match_the_current_twin(tmp_path, monkeypatch):
    """The limits shipped in optim/data/carry_limits.json were measured on this twin: a twin
    change (step time, scheduler, profile values) changes the fingerprints and fails this test
    until `python -m optim.shipped_limits` regenerates the file."""
    from optim.plan import stale_shipped_limits
    from optim.shipped_limits import read_meta, shipped_fingerprints
    meta = read_meta()
    assert meta.get("twin_fingerprints") == shipped_fingerprints(), stale_shipped_limits()
    # every one-adapter limit a first solve on a shipped profile needs, for the windows of the
    # shipped instances and plans (600 s, 3600 s), is in the file
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(tmp_path))     # the shipped file alone
    from optim import capacity
    from optim.shipped_limits import LENGTHS, SHIPPED_PROFILES, _lengths
    from twin.profile import load_profile
    capacity._cache.clear()
    for name in SHIPPED_PROFILES:
        prof = load_profile(name)
        for spec in LENGTHS:
            for w in (600.0, 3600.0):
                for r in prof.supported_ranks:
                    assert capacity._disk_get(capacity._limit_key(
                        prof, r, 1, _lengths(spec), w, tuple(range(capacity.BOUND_SEEDS)),
                        0.9)) is not None, (name, spec, w, r)


def test_status_printed_claim_and_json_agree(small_plan):
    """A twin-accepted count that meets the twin lower bound is status optimal, prints the claim
    and carries it in the JSON (greedy printed status=solved beside the claim, JSON null)."""
    _, res, out = small_plan
    p = res.placement
    rec = json.loads((out / "placement.json").read_text())
    assert p.status == "optimal" and rec["status"] == "optimal"
    assert rec["params"]["claim"] == "optimal in the twin"
    assert "claim: optimal in the twin" in p.summary()


def test_report_uses_the_bound_the_certificate_raised():
    """When the solve's certificate raised the twin bound (params.lower_bound above the bound
    computed first), the claim, the bound lines and the figure use the raised one."""
    from optim.feasibility import TwinBound
    from optim.placement import GpuPlan, Placement
    from optim.plan import bound_basis, claim_text, final_bound
    from twin.workload import Adapter
    b = TwinBound("x", 600.0, 20000.0, 3000.0, 17000.0, 17000.0, 1, 1)
    g = [GpuPlan("h100", "llama-3.1-8b-instruct", 8, 8, ((Adapter(f"a{i}", 8, 1.0), 1.0),), 419.3)
         for i in range(2)]
    p = Placement("x", "greedy", "solved", tuple(g), objective="gpus", verdict="accepted",
                  params={"lower_bound": 2})
    assert final_bound(p, b) == 2
    assert claim_text(p, b).startswith("optimal in the twin")
    lines = bound_basis(b, final_bound(p, b))
    assert lines[-1].startswith("bound: 2 GPU(s)") and "no placement with 1 GPU(s)" in lines[-2]
    assert bound_basis(b)[-1].startswith("bound: 1 GPU(s)")
    q = p.with_(params={"lower_bound": 1})
    assert final_bound(q, b) == 1 and claim_text(q, b).startswith("within 1 GPU(s)")


EVERY_METHOD = ["auto", "cpsat", "dlora", "greedy", "loraserve", "maxbase", "maxbase-half", "milp",
                "random"]


def test_the_agreement_test_covers_every_registered_method():
    from optim.methods import method_names
    assert sorted(method_names()) == sorted(EVERY_METHOD)


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_every_method_agrees_on_status_claim_and_json(method, tmp_path, capsys):
    """For each registered method through ``optim solve``: status ``optimal`` exactly when the
    JSON carries a claim, and the printed claim line is that claim."""
    from optim.cli import main
    from tests.test_cli_errors import tiny_instance
    inst = tiny_instance(tmp_path, rate=1.0, n=6)
    out = tmp_path / "p.json"
    args = ["solve", str(inst), "--method", method, "--json", str(out), "--workers", "1",
            "--time-limit", "20"]
    if method in ("dlora", "loraserve", "random"):          # fixed-fleet methods
        args += ["--gpus", "2"]
    rc = main(args)
    text = capsys.readouterr().out
    assert out.exists(), text
    rec = json.loads(out.read_text())
    claim = rec["params"].get("claim")
    assert rc in (0, 1), text
    assert (rec["status"] == "optimal") == bool(claim), (rec["status"], claim)
    if claim:
        assert f"claim: {claim}" in text
    else:
        assert "claim: optimal" not in text


def test_plan_inputs_round_trip_and_refuse_a_malformed_record(tmp_path):
    """``PlanInputs``: its JSON form gives it back; a missing field, a wrong type or an unknown
    field is a ``PlanError`` naming it; and it builds the instance ``plan_instance`` builds
    from the same options (headroom on when it says so)."""
    from twin.slo import Slo
    csv = _csv(tmp_path, [("a", 8, 2.0), ("b", 16, 1.0)])
    slo = Slo(ttft_p99_ms=2000.0, itl_p99_ms=100.0)
    x = PlanInputs("H100", "llama-3.1-8b-instruct", (PoolEntry("H100", 4, 2.5),), "cost", 600.0,
                   3, 1, slo.to_dict(), (), True)
    assert PlanInputs.from_dict(json.loads(json.dumps(x.to_dict()))) == x
    inst = x.instance(csv)
    want = plan_instance(csv, pool=[PoolEntry("H100", 4, 2.5)], objective="cost",
                         duration_s=600.0, seed=3, slo=slo)
    assert inst.adapters == want.adapters and inst.gpu_types == want.gpu_types
    assert (inst.slo, inst.duration_s, inst.seed, inst.objective.kind) == (slo, 600.0, 3, "cost")
    assert inst.headroom and not PlanInputs(headroom=False).instance(csv).headroom
    d = x.to_dict()
    for bad, msg in [({k: v for k, v in d.items() if k != "seed"}, "plan_inputs.seed: missing"),
                     ({**d, "seed": "3"}, "plan_inputs.seed: wrong type str"),
                     ({**d, "headroom": 1}, "plan_inputs.headroom: wrong type int"),
                     ({**d, "extra": 1}, "unknown field(s) ['extra']"),
                     ({**d, "slo": {"ttft_p99_ms": -1}}, "plan_inputs.slo")]:
        with pytest.raises(PlanError, match=re.escape(msg)):
            PlanInputs.from_dict(bad).instance(csv)


def test_replan_takes_an_adapters_csv_with_the_plans_recorded_inputs(small_plan, tmp_path,
                                                                   monkeypatch, capsys):
    """``optim replan NEW.csv --previous plan/placement.json`` builds the new instance from the
    inputs ``optim plan`` recorded (``params.plan_inputs``) and carries them into its own plan,
    so the next re-plan of a CSV can start from it; a previous plan without them is refused,
    naming the reason."""
    from optim.cli import main
    inst, res, out = small_plan
    monkeypatch.setenv("LORA_PLACEMENT_CACHE", str(out.parent / "cache"))
    prev = out / "placement.json"
    rec = json.loads(prev.read_text())
    assert rec["params"]["plan_inputs"] == PlanInputs(duration_s=300.0, headroom=False).to_dict()
    new = _csv(tmp_path, [("a", 8, 2.0), ("b", 16, 1.0), ("c", 8, 0.5), ("e", 8, 0.4)], "new.csv")
    got = tmp_path / "replan.json"
    args = ["--no-resolve", "--workers", "1", "--quiet"]
    assert main(["replan", str(new), "--previous", str(prev), "--json", str(got), *args]) == 0
    plan = json.loads(got.read_text())
    assert sorted(a["id"] for g in plan["gpus"] for a in g["adapters"]) == ["a", "b", "c", "e"]
    assert plan["verify_duration_s"] == 300.0
    assert plan["params"]["plan_inputs"] == rec["params"]["plan_inputs"]
    assert main(["replan", str(new), "--previous", str(got), *args]) == 0   # and again
    del rec["params"]["plan_inputs"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(rec))
    capsys.readouterr()
    assert main(["replan", str(new), "--previous", str(bare), *args]) == 2
    assert "an adapters CSV needs a previous plan written by `optim plan`" in (
        capsys.readouterr().err)
