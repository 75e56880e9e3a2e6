"""twin.harness: the verify client and the profiling studies, end to end against `twin serve`.

The end-to-end tests launch `python -m twin serve` subprocesses on loopback (port 0); every run
is bounded in requests and time. The real-GPU test needs vLLM and a GPU and is skipped without.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from optim.placement import Placement, plan_gpu
from twin.harness.cli import main as harness_main
from twin.harness.report import LAG_WARN_MS
from twin.workload import Adapter, generate_requests

PROFILE = "llama-3.1-8b-instruct"
# the plan of the README's "Verify on real GPUs" example (= two_gpu_plan(), checked below)
PLAN_FIXTURE = Path(__file__).parent / "data" / "harness_two_gpu_plan.json"
HAVE_SERVE = importlib.util.find_spec("twin.serve") is not None
needs_serve = pytest.mark.skipif(not HAVE_SERVE, reason="twin/serve (python -m twin serve) is "
                                                         "not in this checkout")


def two_gpu_plan(path: Path, rate: float = 0.15) -> Path:
    """A 2-GPU plan in `optim solve --json` form: GPU 0 has more adapters than slots (requests
    wait for a slot: queueing), GPU 1 serves ranks 8 and 16 with a slot each."""
    g0 = plan_gpu("H100-64GB", PROFILE, 4, [(Adapter(f"a{i}", 8, rate), 1.0) for i in range(8)],
                  419.0)
    g1 = plan_gpu("H100-64GB", PROFILE, 8, [(Adapter(f"b{i}", 16 if i % 2 else 8, rate), 1.0)
                                            for i in range(8)], 419.0)
    path.write_text(Placement("two-gpu", "manual", "solved", (g0, g1)).to_json())
    return path


# ------------------------------------------------------------------------------ end to end
@needs_serve
def test_verify_against_twin_serve_matches_the_twin(tmp_path):
    """A 2-GPU plan for 120 s (twin time) on twin serve stand-ins: the client's measurement
    agrees with the twin's replay of the same requests (issue 16 targets)."""
    plan = PLAN_FIXTURE
    rc = harness_main(["verify", str(plan), "--launch", "--profile", PROFILE, "--time-scale", "3",
                       "--duration", "120", "--seed", "1", "--out", str(tmp_path / "v"),
                       "--work-dir", str(tmp_path / "work"), "--quiet"])
    assert rc == 0
    rep = json.loads((tmp_path / "v.json").read_text())
    assert (tmp_path / "v.md").read_text().startswith("# Plan verification")
    rel = rep["relative_difference"]
    for part in ("total", "gpu0", "gpu1"):
        assert abs(rel[part]["throughput_tps"]) <= 0.03, (part, rel[part])
        assert abs(rel[part]["mean_itl_ms"]) <= 0.10, (part, rel[part])
    assert rep["verdict"]["agree"]
    for g in rep["gpus"]:
        assert g["measured"]["starved"] == g["twin"]["starved"]
        assert g["measured"]["completed"] > 80
        assert g["server_kv_tokens"] == g["twin_kv_tokens"]
        assert g["twin_arrivals_from"].startswith("server-reported")
    assert rep["total"]["measured"]["sent"] == rep["total"]["twin"]["sent"] > 200
    # TTFT is the one metric a CPU-starved stand-in distorts: when its engine fell behind its
    # clock, first tokens reach the client late (the report warns); then it is not comparable
    lag_ms = 1000.0 * max(g["server_clock_lag_s"] for g in rep["gpus"])
    if lag_ms > LAG_WARN_MS:
        pytest.skip(f"TTFT not compared: the machine was too busy, the twin serve stand-ins fell "
                    f"{lag_ms:.0f} ms behind their clocks (throughput, ITL, verdicts passed)")
    # the client's TTFT holds the loopback transport at its wall value (the twin has none; the
    # report states it per GPU): served time must match the twin's replay within 10 %
    for g in rep["gpus"]:
        served = g["measured"]["mean_ttft_ms"] - g["transit_ms_wall"]
        assert 0.0 < g["transit_ms_wall"] < g["measured"]["mean_ttft_ms"], g
        assert abs(served / g["twin"]["mean_ttft_ms"] - 1.0) <= 0.10, (g["gpu"], served, g)
    assert abs(rel["total"]["mean_ttft_ms"]) <= 0.25, rel["total"]


@needs_serve
def test_profile_round_trip_recovers_the_served_profile(tmp_path):
    """Profile twin serve (a compact subset of the quick study), calibrate: step-time
    coefficients within 5 %, zero coefficients negligible, KV table and load times exact."""
    from twin.calibrate import calibrate
    from twin.harness.profile_runs import Profiler, StudyPlan, write_tables
    from twin.harness.round_trip import (ZERO_COEF_SHARE, coefficient_checks, kv_mismatches,
                                         load_errors, slot_cost_error)
    from twin.profile import load_profile

    plan = StudyPlan(no_lora_seqs=(16, 192), decode_lengths=((1, 64), (1, 256)),
                     prefill_inputs=(1000, 3000),
                     lora_configs=((8, 64), (8, 160), (64, 64), (64, 160)),
                     lora_adapter_factors=(0.125, 1.0), rank_runs=(8, 32), queue_lengths=(0, 2000),
                     kv_grid=((8, 8), (64, 32), (384, 32)), load_ranks=(8, 16),
                     steady_steps=400, load_requests=3)
    a = Namespace(server="twin", profile=PROFILE, time_scale=20.0, seed=0, model=None,
                  gpu_ids=None, max_num_batched_tokens=2048, window_s=1.0, model_name=PROFILE,
                  model_config=None, max_model_len=None)
    prof = Profiler(a, PROFILE, tmp_path / "work", quiet=True)
    prof.run_all(plan)
    write_tables(prof.tables, tmp_path / "data", PROFILE)
    ref = load_profile(PROFILE)
    fitted, rep = calibrate(tmp_path / "data", PROFILE)
    checks = {c.name: c for c in coefficient_checks(ref, fitted)}
    # identified by this subset (the knee term needs more batch sizes: `--study quick`,
    # experiments/profile_round_trip.py, README): the per-slot-and-token term c6 is pinned by
    # the LoRA prefill windows at 8 and 64 slots, the per-adapter term c7 by the windows with an
    # eighth of and all the slots' adapters, the rank term c10 by those at max_lora_rank
    # 32 against 8, the waiting-queue term c9 by the full-adapter decode windows (8 and 64
    # slots, at least 2 requests per slot) with and without 2000 skipped requests queued
    # behind them
    # (6 runs at load average 2-4: every one of these within 2.2 %; before windows waited for
    # the whole run to arrive and for every adapter, c3 was off by up to 50 % and c9 by 67 %)
    for name in ("base_ms", "per_token_ms", "per_kctx_ms", "lora_base_ms", "per_token_kslot_ms",
                 "per_adapter_ms", "per_lora_tile_ms", "per_kwaiting_ms", "rank_scale"):
        assert abs(checks[name].relative_error) <= 0.05, checks[name]
    assert abs(slot_cost_error(ref, fitted)) <= 0.05
    assert rep["rank_term"]["window_ranks"] == [8, 32]
    assert "not found" in rep["slot_terms"]["note"]       # no max-search runs in this data
    for name in ("per_seq_ms",):
        assert checks[name].contribution <= ZERO_COEF_SHARE, checks[name]
    assert kv_mismatches(ref, fitted) == []
    assert set(fitted.kv_capacity) == {(8, 8), (64, 32)}      # (384, 32) does not start
    assert fitted.max_model_len == ref.max_model_len
    errs = load_errors(ref, fitted)
    assert set(errs) == {(8, 8), (8, 16), (16, 16)}
    assert max(abs(v) for v in errs.values()) < 1e-6


# ------------------------------------------------------------------------------ pieces
def test_plan_fixture_is_the_two_gpu_plan(tmp_path):
    from twin.harness.plan_workload import load_plan
    assert load_plan(PLAN_FIXTURE).to_dict() == load_plan(
        two_gpu_plan(tmp_path / "p.json")).to_dict()


def test_plan_workload_is_the_fleet_twins_workload(tmp_path):
    """Each GPU's requests are the ones twin.fleet draws (rate x share, seed + GPU index)."""
    from twin.harness.plan_workload import plan_workload
    from twin.sharegpt import default_lengths

    wl = plan_workload(two_gpu_plan(tmp_path / "p.json"), duration_s=300.0, seed=7)
    assert [len(g.adapters) for g in wl.gpus] == [8, 8]
    for g in wl.gpus:
        ref = generate_requests(list(g.adapters), 300.0, default_lengths(), seed=7 + g.gpu)
        assert np.array_equal(ref.arrival_s, g.requests.arrival_s)
        assert np.array_equal(ref.output_len, g.requests.output_len)
    with pytest.raises(ValueError, match="--max-requests"):
        plan_workload(tmp_path / "p.json", duration_s=300.0, max_requests=10)


def test_trace_rows_follow_the_routing_shares(tmp_path):
    from twin.harness.plan_workload import plan_workload

    a = Adapter("x", 8, 1.0)
    g0 = plan_gpu("H100-64GB", PROFILE, 1, [(a, 0.25)], 419.0)
    g1 = plan_gpu("H100-64GB", PROFILE, 1, [(a, 0.75)], 419.0)
    (tmp_path / "p.json").write_text(Placement("t", "m", "solved", (g0, g1)).to_json())
    rows = "\n".join(f"{i * 0.1:.1f},x,10,5" for i in range(2000))
    (tmp_path / "t.csv").write_text("arrival_s,adapter_id,input_tokens,output_tokens\n" + rows)
    wl = plan_workload(tmp_path / "p.json", trace=str(tmp_path / "t.csv"), seed=3)
    n0, n1 = len(wl.gpus[0].requests), len(wl.gpus[1].requests)
    assert n0 + n1 == 2000 and abs(n0 / 2000 - 0.25) < 0.04
    assert wl.duration_s == pytest.approx(199.9)


def test_dummy_adapters_are_peft_dirs_of_the_right_rank(tmp_path):
    from safetensors.numpy import load_file

    from twin.harness.dummy_adapters import KNOWN_MODELS, write_rank_adapters

    dirs = write_rank_adapters(tmp_path, [16, 8, 16], PROFILE)
    assert sorted(dirs) == [8, 16]
    dims = KNOWN_MODELS[PROFILE][1]
    cfg = json.loads((dirs[16] / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and cfg["peft_type"] == "LORA"
    t = load_file(str(dirs[16] / "adapter_model.safetensors"))
    k = "base_model.model.model.layers.0.self_attn.k_proj"
    assert t[f"{k}.lora_A.weight"].shape == (16, dims.hidden_size)
    assert t[f"{k}.lora_B.weight"].shape == (dims.num_key_value_heads * dims.head_dim, 16)
    assert not t[f"{k}.lora_B.weight"].any()      # B = 0: the adapter changes no output
    assert len(t) == 2 * 4 * dims.num_hidden_layers
    assert write_rank_adapters(tmp_path, [8], PROFILE)[8] == dirs[8]   # reused
    with pytest.raises(ValueError, match="--model-config"):
        write_rank_adapters(tmp_path / "x", [8], "unknown-model")


def test_serving_metrics_follow_the_twin_definitions():
    from twin.harness.measurement import relative_differences, serving_metrics

    arrival = np.array([0.0, 1.0, 2.0, 9.5])
    first = np.array([0.1, 1.2, 2.1, np.nan])
    finish = np.array([1.1, 3.2, 11.0, np.nan])        # the third finishes after the window
    m = serving_metrics(arrival, [10, 20, 30, 40], [11, 21, 31, 41], first, finish, 10.0,
                        itl_gaps_ms=np.array([100.0, 100.0]))
    assert m.sent == 4 and m.completed == 2
    assert m.throughput_tps == pytest.approx((10 + 11 + 20 + 21) / 10.0)
    assert m.offered_tps == pytest.approx((10 + 20 + 30 + 40 + 11 + 21 + 31 + 41) / 10.0)
    assert m.starved
    assert m.mean_ttft_ms == pytest.approx(150.0)
    assert m.mean_itl_ms == pytest.approx(1000.0 * (1.0 + 2.0) / (10 + 20))
    d = relative_differences(m, m)
    assert all(v == 0.0 for v in d.values() if v is not None)


def test_prometheus_parsing_reads_vllm_names():
    from twin.harness.client import metric_labels, metric_value, parse_prometheus

    text = ('# HELP x\nvllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
            'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5\n')
    s = parse_prometheus(text)
    assert metric_value(s, "vllm:num_requests_running") == 3.0
    assert metric_labels(s, "vllm:cache_config_info") == {"block_size": "16",
                                                          "num_gpu_blocks": "100"}
    assert metric_value(s, "vllm:absent", -1.0) == -1.0


def test_kv_capacity_falls_back_to_the_vllm_085_start_up_log():
    """vLLM 0.8.5 (V1) reports num_gpu_blocks="None" in cache_config_info (its stat loggers
    are built before the KV cache is sized); the capacity is then read from its log line."""
    from twin.harness.client import kv_cache_tokens, parse_prometheus

    ok = parse_prometheus('vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n')
    none = parse_prometheus('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n')
    log = ("INFO [kv_cache_utils.py:634] GPU KV cache size: 1,000 tokens\n"
           "INFO [kv_cache_utils.py:634] GPU KV cache size: 324,832 tokens\n")
    assert kv_cache_tokens(ok) == 1600
    assert kv_cache_tokens(ok, log) == 1600            # the metric wins when it has a number
    assert kv_cache_tokens(none) is None
    assert kv_cache_tokens(none, log) == 324832       # the last start-up line
    assert kv_cache_tokens([], "no such line") is None


def _scrape(t, running, waiting, gaps):
    from twin.harness.profile_runs import Scrape
    return Scrape(t, running, waiting, 0.0, gaps, 0.0, 0.0, 0.0, 0)


def test_lockstep_windows_span_whole_periods_of_a_saturated_server():
    """Windows are cut at scrapes whose recorded-gap counts differ by 1..MAX_PERIODS whole
    periods (within the tolerance), only where requests wait at every scrape, after ``after``;
    the waiting gauge is averaged over the window with the gaps as weights."""
    from twin.harness.profile_runs import PERIOD_TOLERANCE, _intervals, _mean_waiting

    P = 100.0
    sc = [_scrape(0, 10, 500, 0), _scrape(1, 10, 480, 55), _scrape(2, 10, 460, 101),
          _scrape(3, 10, 440, 160), _scrape(4, 10, 0, 230), _scrape(5, 10, 400, 330),
          _scrape(6, 10, 380, 532), _scrape(7, 10, 360, 560)]
    # 0 -> 2 is one period (101 gaps); 2 -> 5 crosses a scrape with nothing waiting; 5 -> 7 is
    # 2.3 periods (no whole number within the tolerance), 5 -> 6 is 2.02 periods
    assert 0.02 <= PERIOD_TOLERANCE < 0.3
    assert _intervals(sc, P) == [(0, 2), (5, 6)]
    assert _intervals(sc, P, after=3) == [(5, 6)]
    assert _intervals(sc, None) == [(i, i + 1) for i in range(7)]
    assert _intervals(sc, None, after=5) == [(5, 6), (6, 7)]
    # gap-weighted trapezoid: (55 * 490 + 46 * 470) / 101
    assert _mean_waiting(sc, 0, 2) == pytest.approx((55 * 490 + 46 * 470) / 101)


def test_windows_start_when_the_server_holds_the_run_and_every_adapter():
    """Prompt-only windows start once the server holds every request (before, a server faster
    than the client empties the queue between scrapes: part-full steps, whatever the gauge says
    at the ends); LoRA windows need every adapter of the run in the batch at both ends."""
    from twin.harness.profile_runs import RunResult, Scrape, _windows

    def sc(t, waiting, gaps, adapters):
        return Scrape(t, 3, waiting, 0.055 * gaps, gaps, 0.0, 0.0, 0.0, adapters)

    scrapes = (sc(0.0, 0, 0, 4), sc(1.0, 14, 20, 4), sc(2.0, 600, 40, 4), sc(3.0, 560, 60, 3),
               sc(4.0, 520, 80, 4), sc(5.0, 480, 100, 4), sc(6.0, 440, 120, 4))
    base = {"input_len_set": 1000, "output_len_set": 2}
    run = RunResult(scrapes, (), 0, 0, 6.0, arrived_wall=2.0)
    starts = [w["window_start_s"] for w in _windows(run, base, 0, prefill_budget=2048)]
    assert starts == [2.0, 3.0, 4.0, 5.0]
    # with 4 adapters in the run, the windows that end or start at the 3-adapter scrape go
    starts = [w["window_start_s"] for w in _windows(run, base, 4, prefill_budget=2048)]
    assert starts == [4.0, 5.0]
    # released from blockers: the first interval after the queue starts to shrink is skipped
    blocked = RunResult(scrapes, (), 0, 0, 6.0, arrived_wall=2.0, blockers=8)
    starts = [w["window_start_s"] for w in _windows(blocked, base, 0, prefill_budget=2048)]
    assert starts == [4.0, 5.0]


def test_a_run_without_a_saturated_window_is_repeated(tmp_path, capsys):
    """A run that yields no window is run again (at most RUN_ATTEMPTS times, said on stderr);
    the last attempt's run row and windows are kept, with its attempt count."""
    from twin.harness.profile_runs import RUN_ATTEMPTS, Profiler, RunResult

    prof = Profiler(Namespace(time_scale=20.0), PROFILE, tmp_path, quiet=False)
    wins = iter([[], [], [{"w": 1}]])
    assert RUN_ATTEMPTS == 3

    def once():
        return {"row": {"run_name": "r"}}, RunResult((), (), 10, 20, 1.5), next(wins)
    assert prof._attempts("decode r", once) == [{"w": 1}]
    assert prof.tables.runs[-1]["attempts"] == 3 and prof.tables.windows == [{"w": 1}]
    assert prof.tables.runs[-1]["duration_s"] == 30.0 and prof.repeated_runs() == 1
    err = capsys.readouterr().err
    assert "decode r: no saturated window in attempt 1 of 3; running it again" in err
    prof._attempts("decode s", lambda: ({"row": {"run_name": "s"}},
                                        RunResult((), (), 1, 1, 1.0), []))
    assert prof.tables.runs[-1]["attempts"] == 3 and prof.tables.windows == [{"w": 1}]
    assert "attempt 3 of 3; left out" in capsys.readouterr().err


def _cli(args, tmp_path):
    r = subprocess.run([sys.executable, "-m", "twin.harness", *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr.strip()


def test_cli_errors_name_the_option(tmp_path):
    plan = two_gpu_plan(tmp_path / "plan.json")
    rc, err = _cli(["verify", "missing.json", "--launch", "--duration", "10", "--out", "o"],
                   tmp_path)
    assert rc == 2 and err == "error: plan: missing.json does not exist"
    rc, err = _cli(["verify", str(plan), "--duration", "10", "--out", "o"], tmp_path)
    assert rc == 2 and "--endpoints URL ... (running servers) or --launch" in err
    (tmp_path / "o.json").write_text("{}")
    rc, err = _cli(["verify", str(plan), "--launch", "--duration", "10", "--out", "o"], tmp_path)
    assert rc == 2 and "--out: o.json exists; pass --force" in err
    (tmp_path / "bad.json").write_text('{"gpus": [{"gpu_type": "x"}]}')
    rc, err = _cli(["verify", "bad.json", "--launch", "--duration", "10", "--out", "p"], tmp_path)
    assert rc == 2 and err.startswith("error: plan bad.json: field") and "missing" in err
    rc, err = _cli(["verify", str(plan), "--endpoints", "http://127.0.0.1:9",
                    "--duration", "10", "--out", "q"], tmp_path)
    assert rc == 2 and "--endpoints: the plan has 2 GPUs, 1 endpoints given" in err
    rc, err = _cli(["profile", "--out", "d"], tmp_path)
    assert rc == 2 and "--launch" in err
    rc, err = _cli(["verify", str(plan), "--launch", "--time-scale", "0", "--out", "r"],
                   tmp_path)
    assert rc == 2 and "--time-scale" in err


def test_help_documents_the_gpu_run():
    for cmd, words in (("verify", ("vllm==0.8.5", "--server vllm", "--gpu-ids", "--endpoints")),
                       ("profile", ("twin calibrate --data", "--server vllm", "--study full"))):
        r = subprocess.run([sys.executable, "-m", "twin.harness", cmd, "--help"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0
        for w in words:
            assert w in r.stdout, (cmd, w)


def test_cpu_path_imports_neither_vllm_nor_torch():
    code = ("import sys, twin.harness.cli, twin.harness.verify, twin.harness.profile_runs, "
            "twin.harness.dummy_adapters; print(any(m in sys.modules for m in "
            "('vllm', 'torch')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


GPU_MODEL = os.environ.get("LORA_VLLM_MODEL")


@pytest.mark.skipif(shutil.which("nvidia-smi") is None or importlib.util.find_spec("vllm") is None
                    or not GPU_MODEL,
                    reason="needs a GPU (nvidia-smi), vllm (pip install -e '.[gpu]') and "
                           "LORA_VLLM_MODEL=<HF id or path of the profiled base model>")
def test_verify_on_a_real_gpu(tmp_path):
    """One GPU of a plan on a real `vllm serve`: the run completes and the server's KV capacity
    is reported (how close it is to the twin is the point of running it, not asserted)."""
    g0 = plan_gpu("H100-64GB", PROFILE, 4, [(Adapter(f"a{i}", 8, 0.2), 1.0) for i in range(8)],
                  419.0)
    (tmp_path / "p.json").write_text(Placement("gpu", "m", "solved", (g0,)).to_json())
    rc = harness_main(["verify", str(tmp_path / "p.json"), "--launch", "--server", "vllm",
                       "--model", GPU_MODEL, "--gpu-ids", "0", "--duration", "120",
                       "--out", str(tmp_path / "v"), "--work-dir", str(tmp_path / "w"),
                       "--quiet"])
    assert rc in (0, 1)
    rep = json.loads((tmp_path / "v.json").read_text())
    assert rep["gpus"][0]["server_kv_tokens"] > 0
    assert rep["total"]["measured"]["completed"] > 0


# ------------------------------------------------------------------------------ prompt file
def _prompt_file(path: Path) -> Path:
    rows = [{"prompt": "Summarise the following support ticket in two sentences: " + "x" * k}
            for k in (40, 400, 1200)]
    rows += [{"prompt": "Translate to German: good morning", "prompt_tokens": 9},
             {"prompt_token_ids": list(range(1000, 1300))}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_prompt_file_sets_the_input_lengths_seeded(tmp_path):
    from twin.harness.plan_workload import plan_workload, with_prompt_file
    from twin.harness.prompt_file import load_prompts
    from twin.serve.app import estimate_text_tokens

    pool = load_prompts(_prompt_file(tmp_path / "p.jsonl"))
    assert len(pool) == 5 and pool.estimated == 3
    assert list(pool.tokens[3:]) == [9, 300]
    assert pool.tokens[0] == estimate_text_tokens(pool.prompts[0])
    wl = plan_workload(two_gpu_plan(tmp_path / "plan.json"), duration_s=300.0, seed=3)
    a = with_prompt_file(wl, tmp_path / "p.jsonl")
    b = with_prompt_file(wl, tmp_path / "p.jsonl")
    for g0, ga, gb in zip(wl.gpus, a.gpus, b.gpus):
        assert ga.prompts == gb.prompts and len(ga.prompts) == len(g0.requests)
        assert np.array_equal(ga.requests.arrival_s, g0.requests.arrival_s)
        assert np.array_equal(ga.requests.output_len, g0.requests.output_len)
        lengths = {p if isinstance(p, str) else tuple(p): n
                   for p, n in zip(pool.prompts, pool.tokens)}
        assert all(lengths[p] == n for p, n in zip(ga.prompts, ga.requests.input_len))
        assert len(set(ga.requests.input_len)) > 2          # draws spread over the file
    assert "estimated" in a.prompt_source


@pytest.mark.parametrize("line, msg", [
    ("not json", "p.jsonl:2: invalid JSON"),
    ('["a"]', "p.jsonl:2: expected a JSON object"),
    ('{"prompt": ""}', "p.jsonl:2.prompt: must be a non-empty string"),
    ('{"prompt": "a", "prompt_token_ids": [1]}', "exactly one of"),
    ('{"prompt_token_ids": [1, -2]}', "prompt_token_ids: must be a non-empty list"),
    ('{"prompt": "a", "prompt_tokens": 0}', "prompt_tokens: must be an integer >= 1"),
])
def test_prompt_file_errors_name_line_and_field(tmp_path, line, msg):
    from twin.harness.prompt_file import load_prompts
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=re.escape(msg)):
        load_prompts(p)


def test_prompt_file_refuses_empty_and_oversized(tmp_path):
    from twin.harness.plan_workload import plan_workload, with_prompt_file
    from twin.harness.prompt_file import load_prompts
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no prompt in the file"):
        load_prompts(tmp_path / "e.jsonl")
    (tmp_path / "big.jsonl").write_text(json.dumps({"prompt": "a", "prompt_tokens": 10**7}))
    wl = plan_workload(two_gpu_plan(tmp_path / "plan.json"), duration_s=60.0)
    with pytest.raises(ValueError, match="more than the .* a server of the plan holds"):
        with_prompt_file(wl, tmp_path / "big.jsonl")


@needs_serve
def test_verify_with_a_prompt_file_matches_the_twin(tmp_path):
    """Text prompts (lengths estimated as twin serve does) and token-id prompts: the stand-ins'
    measurement agrees with the twin's replay of the same prompts."""
    rc = harness_main(["verify", str(PLAN_FIXTURE), "--launch", "--profile", PROFILE,
                       "--time-scale", "3", "--duration", "60", "--seed", "2",
                       "--prompts", str(_prompt_file(tmp_path / "p.jsonl")),
                       "--out", str(tmp_path / "v"), "--work-dir", str(tmp_path / "work"),
                       "--quiet"])
    rep = json.loads((tmp_path / "v.json").read_text())
    lag_ms = 1000.0 * max(g["server_clock_lag_s"] for g in rep["gpus"])
    if rc != 0 and lag_ms > LAG_WARN_MS:   # a stand-in behind its clock starves: not comparable
        pytest.skip(f"verdicts not compared: the machine was too busy, the twin serve stand-ins "
                    f"fell {lag_ms:.0f} ms behind their clocks")
    assert rc == 0
    assert "5 prompts of" in rep["prompts"] and "estimated" in rep["prompts"]
    assert abs(rep["relative_difference"]["total"]["throughput_tps"]) <= 0.03
    assert rep["verdict"]["agree"]
