"""The verdict with measured headroom (twin.headroom): the committed table is the fit on the
shared max-search runs (and on nothing else), headroom is >= 0, a profile without constants
keeps the plain verdict, and the rule throughput / (1 + h) >= threshold x offered."""

from __future__ import annotations

import builtins
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from twin import headroom as HR
from twin import headroom_fit as HRF
from twin.metrics import memory_error_metrics

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "vllm_h100"
LLAMA = "llama-3.1-8b-instruct"
QWEN = "qwen-2.5-7b-instruct"


def _metrics(throughput: float, offered: float, slo_ok: bool | None = None, **kw):
    """Synthetic RunMetrics of a started run: throughput vs realised offered load."""
    m = memory_error_metrics(3600.0, offered)
    return dataclasses.replace(
        m, throughput_tps=throughput, offered_realised_tps=offered, memory_error=False,
        starved=throughput < 0.9 * offered, arrived_requests=100, finished_requests=100,
        slo=None if slo_ok is None else {"ok": slo_ok}, **kw)


@pytest.mark.skipif(not (SHARED / HR.MAXSEARCH_CSV).exists(),
                    reason=f"the shared max-search runs are absent ({SHARED / HR.MAXSEARCH_CSV}):"
                           " the committed headroom table cannot be refitted here")
def test_committed_table_is_the_fit_on_the_max_search_runs():
    """Replays every max-search run on 2 processes (about 2 minutes) and refits."""
    committed = HR.headroom_table_for(LLAMA)
    assert committed is not None, "no headroom committed for the Llama profile"
    df = HRF.replay_csv(SHARED / HR.MAXSEARCH_CSV, workers=2, progress=False)
    assert len(df) > 300
    table = HRF.fit_headroom(df, LLAMA)
    fitted = table.to_dict()["regimes"]
    have = committed.to_dict()["regimes"]
    assert set(fitted) == set(have)
    for k in fitted:
        assert fitted[k]["runs"] == have[k]["runs"], k
        assert fitted[k]["headroom"] == pytest.approx(have[k]["headroom"], abs=1e-4), k
    assert (committed.quantile, committed.min_runs) == (HR.QUANTILE, HR.MIN_RUNS)


def test_the_derivation_reads_only_the_max_search_file(tmp_path, monkeypatch):
    """``python -m twin.headroom_fit --fit`` opens the max-search CSV and never the validation runs
    (the evaluation set): every file the fit opens is recorded (replays are stubbed)."""
    data = tmp_path / "vllm_h100"
    (data / "validation_llama").mkdir(parents=True)
    cols = ["run_id", "model", "max_loras", "served_adapters", "max_lora_rank",
            "adapter_rank_counts", "rate_counts", "total_time_s", "pool_mean_input_len",
            "pool_mean_output_len", "max_num_batched_tokens", "max_num_seqs", "status",
            "total_throughput_tps", "offered_throughput_est_tps", "starved_90"]
    rows = [[f"r{i}", LLAMA, a, n, 16, f"16:{n}", f"0.1:{n}", 3600, 200, 200, 2048, 2048, "ok",
             1000.0 + i, 1000.0, False] for i, (a, n) in enumerate([(8, 16), (32, 64), (96, 96),
                                                                    (192, 256)] * 4)]
    pd.DataFrame(rows, columns=cols).to_csv(data / HR.MAXSEARCH_CSV, index=False)
    pd.DataFrame(rows, columns=cols).to_csv(data / HR.VALIDATION_CSV, index=False)

    def fake_replay(cfg, seed=0, io_correlation=None, client_latency=True):
        return {"throughput_tps": 1010.0, "offered_realised_tps": 1000.0, "starved": False,
                "memory_error": False}
    monkeypatch.setattr(HRF, "replay_run", fake_replay)
    opened: list[str] = []
    real_open, real_read_csv = builtins.open, pd.read_csv

    def spy_open(file, *a, **kw):
        opened.append(str(file))
        return real_open(file, *a, **kw)

    def spy_read_csv(path, *a, **kw):
        opened.append(str(path))
        return real_read_csv(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(pd, "read_csv", spy_read_csv)
    out = tmp_path / "headroom.json"
    assert HRF.main(["--fit", str(data), "--out", str(out), "--quiet"]) == 0
    assert any(p.endswith("maxsearch_llama.csv") for p in opened)
    assert not any("validation_llama.csv" in Path(p).name for p in opened), opened
    doc = json.loads(out.read_text())["profiles"][LLAMA]
    assert doc["fit"]["data"].endswith("maxsearch_llama.csv")
    assert all(v["headroom"] >= 0 for v in doc["regimes"].values())


def test_regimes_come_from_the_configuration_and_the_twins_run_only():
    """The fit's regimes and values do not move when the real verdict is shuffled; the load
    regime is the twin's own throughput / offered."""
    rng = np.random.default_rng(0)
    n = 80
    df = pd.DataFrame({"max_loras": rng.choice([8, 32, 96, 192], n),
                       "served_adapters": rng.choice([16, 100, 200], n),
                       "twin_offered_realised_tps": 1000.0,
                       "twin_throughput_tps": rng.uniform(600, 1000, n),
                       "twin_memory_error": False, "real_starved": rng.random(n) < 0.5})
    df["real_tps"] = df["twin_throughput_tps"] * rng.uniform(0.9, 1.1, n)
    a = HRF.fit_headroom(df)
    df["real_starved"] = ~df["real_starved"]
    assert HRF.fit_headroom(df) == a
    assert all(e.headroom >= 0 for _, e in a.entries)
    assert HR.Regime.of(96, 100, 900.0, 1000.0) == HR.Regime("65-128", True, "saturated")
    assert HR.Regime.of(16, 8, 995.0, 1000.0) == HR.Regime("<=16", False, "keeps-up")


def test_committed_headroom_is_nonnegative_and_a_profile_without_it_gets_zero():
    table = HR.headroom_table_for(LLAMA)
    assert table is not None
    assert all(e.headroom >= 0 and e.runs > 0 for _, e in table.entries)
    # a sparse regime falls back to a parent with enough runs
    for slots in ("<=16", "17-64", "65-128", ">128"):
        for sw in (False, True):
            for load in ("keeps-up", "saturated"):
                hr = table.lookup(HR.Regime(slots, sw, load))
                assert hr.key is not None and hr.h >= 0
                assert hr.runs >= table.min_runs or hr.key == "all"
                assert "from" in hr.describe() and "max-search runs" in hr.describe()
    assert HR.headroom_table_for(QWEN) is None
    hr = HR.headroom_for(QWEN, 96, 200, 900.0, 1000.0)
    assert hr == HR.NO_HEADROOM and hr.h == 0.0
    for tps in (850.0, 905.0, 1000.0):
        m = _metrics(tps, 1000.0)
        ok, used = HR.judge(QWEN, 96, 200, m)
        assert used.h == 0.0 and ok == m.accepted


def test_the_rule_on_synthetic_metrics():
    h = 0.05                                     # needs throughput >= 0.945 x offered
    assert HR.accepted_with_headroom(_metrics(950.0, 1000.0), h)
    at_risk = _metrics(930.0, 1000.0)
    assert at_risk.accepted and not HR.accepted_with_headroom(at_risk, h)
    assert not HR.accepted_with_headroom(_metrics(880.0, 1000.0), h)        # starved anyway
    assert HR.accepted_with_headroom(at_risk, 0.0) == at_risk.accepted
    assert not HR.accepted_with_headroom(_metrics(1000.0, 1000.0, slo_ok=False), h)
    assert not HR.accepted_with_headroom(memory_error_metrics(60.0, 1000.0), h)
    assert HR.passes_with_headroom(945.0, 1000.0, 0.05)
    assert not HR.passes_with_headroom(944.0, 1000.0, 0.05)
    assert HR.passes_with_headroom(850.0, 1000.0, 0.0, threshold=0.85)
    with pytest.raises(ValueError):
        HR.passes_with_headroom(900.0, 1000.0, -0.01)
    with pytest.raises(ValueError):
        HR.HeadroomEntry(-0.1, 5)


def _placement(throughput: float, offered: float = 1000.0, profile: str = LLAMA):
    from optim.placement import GpuMetrics, Placement, plan_gpu
    from twin.workload import Adapter
    ads = [Adapter(f"a{i}", 16, 0.1) for i in range(200)]
    g = plan_gpu("h100", profile, 96, ((a, 1.0) for a in ads), 400.0)
    v = GpuMetrics(offered, throughput, throughput < 0.9 * offered, False,
                   offered_realised_tps=offered)
    return Placement("hr", "manual", "solved", (dataclasses.replace(g, verified=v),),
                     0.0, verdict="accepted" if throughput >= 0.9 * offered else "rejected")


def test_summary_and_deployment_flag_gpus_that_pass_only_without_headroom():
    from optim.deploy import DeployOptions, deployment_files
    risky = _placement(920.0)                   # 92 % of offered: saturated, swapping, 65-128
    h = HR.headroom_for(LLAMA, 96, 200, 920.0, 1000.0).h
    assert 0.9 * (1 + h) > 0.92, "the committed headroom no longer puts 92 % at risk"
    assert risky.verdict == "accepted"              # the plain verdict is unchanged
    s = risky.summary()
    assert "verdict=accepted" in s
    assert "with the twin's measured headroom: 1 GPU(s) would be at risk" in s
    assert "headroom:" in s and "max-search runs" in s
    summary = json.loads(deployment_files(risky)["deployment.json"])
    assert summary["twin_verdict"] == "accepted"
    assert summary["twin_headroom"]["applied"] and summary["twin_headroom"]["at_risk_gpus"] == [0]
    off = json.loads(deployment_files(risky, DeployOptions(headroom=False))["deployment.json"])
    assert off["twin_headroom"] == {"applied": False}
    safe = _placement(1000.0)
    assert "0 GPU(s) would be at risk" in safe.summary()
    assert json.loads(deployment_files(safe)["deployment.json"])["twin_headroom"][
        "at_risk_gpus"] == []
    qwen = _placement(920.0, profile=QWEN)      # no constants: nothing at risk, plain verdict
    assert "0 GPU(s) would be at risk" in qwen.summary()


def _boundary_server():
    """A swapping Amax-16 server (regime '<=16, swapping': a headroom above 0 is committed) and
    a rate scale at which the twin's plain verdict accepts it while the verdict with the
    measured headroom does not (bisection on the scale, 600 s windows, seed 0)."""
    from twin.profile import load_profile
    from twin.server import ServerConfig, simulate_server
    from twin.workload import Adapter
    prof = load_profile(LLAMA)

    def run(scale: float, headroom: bool):
        ads = [Adapter(f"a{i}", 16, 0.35 * scale) for i in range(40)]
        return simulate_server(prof, ads, ServerConfig(max_loras=16, headroom=headroom), 600.0,
                               seed=0)
    lo, hi = 0.5, 3.0                 # accepted at lo, starved at hi (checked below)
    assert run(lo, False).accepted and not run(hi, False).accepted
    for _ in range(14):
        mid = (lo + hi) / 2
        m = run(mid, True)
        if m.accepted:
            lo = mid
        elif run(mid, False).accepted:
            return run, mid
        else:
            hi = mid
    pytest.fail("no rate scale where only the plain verdict accepts: is the headroom 0?")


def test_the_twin_judges_with_headroom_when_the_config_asks():
    from twin.server import ServerConfig
    run, scale = _boundary_server()
    plain, judged = run(scale, False), run(scale, True)
    assert plain.headroom is None and plain.accepted
    hr = HR.headroom_for(LLAMA, 16, 40, judged.throughput_tps, judged.offered_realised_tps)
    assert hr.h > 0 and judged.headroom["h"] == hr.h and judged.headroom["regime"]
    assert judged.throughput_tps == plain.throughput_tps          # a verdict, not a new run
    assert not judged.headroom["ok"] and not judged.accepted
    assert HR.accepted_with_headroom(plain, hr.h) is False
    with pytest.raises(ValueError, match="headroom must be True or False"):
        ServerConfig(max_loras=4, headroom="yes")


def test_plan_passes_with_headroom_by_default_and_plain_on_request(tmp_path):
    """The README's default plan: with the headroom (default) every GPU passes with it and
    nothing is at risk; the bound the claim uses is the plain verdict's, which only accepts
    more, so the claim stays sound."""
    from dataclasses import replace

    from optim.deploy import DeployOptions
    from optim.plan import EXAMPLE_CSV, make_plan, plan_instance, summary_lines
    inst = plan_instance(EXAMPLE_CSV)
    assert not inst.headroom and not inst.bound_view().headroom
    res = make_plan(replace(inst, headroom=True), tmp_path / "hr", quiet=True,
                    deploy_opts=DeployOptions())
    p = res.placement
    assert p.verdict == "accepted" and p.params.get("headroom")
    for g in p.gpus:
        assert g.verified.headroom is not None and g.verified.headroom["ok"], g.verified
        ok, hr = g.headroom_verdict()
        assert ok and hr.h == g.verified.headroom["h"]
    dep = json.loads((tmp_path / "hr" / "deployment.json").read_text())
    assert dep["twin_headroom"]["applied"] and dep["twin_headroom"]["at_risk_gpus"] == []
    text = "\n".join(summary_lines(res, tmp_path / "hr"))
    assert "judged with the twin's measured headroom" in text
    assert "with its measured headroom" in res.claim
    assert replace(inst, headroom=True).bound_view().headroom is False
    plain = make_plan(inst, tmp_path / "plain", quiet=True, deploy_opts=DeployOptions())
    assert all(g.verified.headroom is None for g in plain.placement.gpus)
    assert plain.placement.n_gpus <= p.n_gpus
    # a re-plan of the plan keeps judging with the headroom unless told otherwise
    from optim.cli import main
    d = inst.to_dict()
    for a in d["adapters"]:
        a["rate"] *= 1.05
    (tmp_path / "drift.json").write_text(json.dumps(d))
    args = ["replan", str(tmp_path / "drift.json"), "--previous",
            str(tmp_path / "hr" / "placement.json"), "--no-resolve", "--no-transition",
            "--quiet", "--json"]
    assert main(args + [str(tmp_path / "re.json")]) == 0
    re = json.loads((tmp_path / "re.json").read_text())
    assert re["params"].get("headroom") and all(g["verified"]["headroom"] for g in re["gpus"])
    assert main(args + [str(tmp_path / "re_plain.json"), "--no-headroom"]) == 0
    re_plain = json.loads((tmp_path / "re_plain.json").read_text())
    assert not re_plain["params"].get("headroom")
    assert all(g["verified"]["headroom"] is None for g in re_plain["gpus"])


def test_solve_with_headroom_states_it_in_the_verdict_and_the_claim(capsys):
    from optim.cli import main
    inst = Path(__file__).resolve().parents[1] / "instances" / "small" / \
        "small-08-llama-n40-g5-uniform.json"
    assert main(["solve", str(inst), "--method", "greedy", "--headroom", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "headroom verdict: accepted, judged with the twin's measured headroom" in out
    assert "claim: optimal in the twin with its measured headroom" in out
    assert main(["solve", str(inst), "--method", "greedy", "--quiet"]) == 0
    plain = capsys.readouterr().out
    assert "GPU(s) would be at risk" in plain and "with its measured headroom" not in plain
