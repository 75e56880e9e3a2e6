"""Twin verification verdict on tiny placements, and the CLI end to end."""

from __future__ import annotations

import json

from optim.cli import main
from optim.instance import instance_from_dict
from optim.methods import solve
from optim.placement import Placement, plan_gpu
from optim.verify import verify

LLAMA = "llama-3.1-8b-instruct"


def tiny(rate):
    return instance_from_dict({
        "name": "tiny", "adapters": [{"id": f"a{i}", "rank": 8, "rate": rate} for i in range(4)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}], "duration_s": 120, "seed": 1})


def test_verdict_accepts_light_load_and_rejects_overload():
    inst = tiny(3.0)
    p = verify(solve(inst, "maxbase"), inst, workers=1)
    assert p.verdict == "accepted" and p.feasible
    assert all(g.verified and g.verified.ok for g in p.gpus)
    hot = tiny(20.0)                                       # ~33k tok/s on one GPU
    g = plan_gpu("h100", LLAMA, 4, ((a, 1.0) for a in hot.adapters), hot.mean_tokens)
    q = verify(Placement("tiny", "manual", "solved", (g,)), hot, workers=1)
    assert q.verdict == "rejected" and not q.feasible and q.gpus[0].verified.starved


def test_memory_error_rejects():
    inst = instance_from_dict({
        "name": "mem", "adapters": [{"id": f"a{i}", "rank": 32, "rate": 0.01} for i in range(100)],
        "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}], "duration_s": 30})
    g = plan_gpu("h100", LLAMA, 100, ((a, 1.0) for a in inst.adapters), inst.mean_tokens)
    q = verify(Placement("mem", "manual", "solved", (g,)), inst, workers=1)
    assert q.verdict == "rejected" and q.gpus[0].verified.memory_error


def test_cli_solve_writes_json_and_vllm_args(tmp_path, capsys):
    inst_path = tmp_path / "i.json"
    inst_path.write_text(json.dumps(tiny(3.0).to_dict()))
    out, va = tmp_path / "p.json", tmp_path / "v.json"
    rc = main(["solve", str(inst_path), "--method", "maxbase", "--duration", "120",
               "--workers", "1", "--json", str(out), "--vllm-args", str(va)])
    text = capsys.readouterr().out
    assert rc == 0 and "verdict=accepted" in text and "Amax" in text
    rec = json.loads(out.read_text())
    assert rec["gpus_used"] == 1 and rec["gpus"][0]["verified"]["starved"] is False
    assert json.loads(va.read_text())["gpus"][0]["args"][0] == "--enable-lora"
    # refuses to overwrite without --force, before solving
    assert main(["solve", str(inst_path), "--method", "maxbase", "--no-verify",
                 "--json", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_cli_generate_refuses_overwrite(tmp_path, capsys):
    assert main(["generate", "--set", "large", "--out", str(tmp_path), "--seed", "3"]) == 0
    assert main(["generate", "--set", "large", "--out", str(tmp_path), "--seed", "3"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["generate", "--set", "large", "--out", str(tmp_path), "--seed", "3",
                 "--force"]) == 0
