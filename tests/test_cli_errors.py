"""Every command line on broken inputs: a non-zero exit, no traceback, and a message that names
the option, file or field and the bad value; and the same commands still work on valid inputs.

Each case is a valid command or file with one thing broken. Commands run in-process through
``main(argv)`` (an uncaught exception would fail the test, i.e. a traceback), a few as real
processes (binary input, Ctrl-C, ``python -m`` entry points).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from optim.cli import main as optim_main
from surrogates.cli import main as surrogates_main
from twin.cli import main as twin_main

REPO = Path(__file__).resolve().parents[1]
LLAMA = "llama-3.1-8b-instruct"
MODEL = REPO / "surrogates" / "trained" / LLAMA


def run(main, argv, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``main(argv)``; argparse's exit counts as a return."""
    try:
        rc = main([str(x) for x in argv])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def refused(main, argv, capsys, *needles: str) -> str:
    """The command fails with exit 2, no traceback, and stderr names every needle."""
    rc, out, err = run(main, argv, capsys)
    assert rc == 2, f"exit {rc} for {argv}\nstdout: {out[-800:]}\nstderr: {err[-800:]}"
    assert "Traceback" not in err
    for n in needles:
        assert n in err, f"{n!r} not in the message for {argv}: {err!r}"
    return err


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


JUNK = bytes(range(256)) * 4


# ============================================================================ twin run / maxpack
@pytest.mark.parametrize("argv, needles", [
    (["--max-lora-rank", "24"], ["--max-lora-rank", "rank 24 not supported", "supported: 8, 16, 32"]),
    (["--ranks", "8,24"], ["--ranks", "rank 24 not supported"]),
    (["--ranks", "8,x"], ["--ranks", "'8,x'"]),
    (["--ranks", "0"], ["--ranks", "0"]),
    (["--amax", "0"], ["--amax", "'0'"]),
    (["--adapters", "0"], ["--adapters", "'0'"]),
    (["--adapters", "-3"], ["--adapters", "'-3'"]),
    (["--duration", "nan"], ["--duration", "'nan'"]),
    (["--duration", "0"], ["--duration", "'0'"]),
    (["--duration", "-60"], ["--duration", "'-60'"]),
    (["--duration", "inf"], ["--duration", "'inf'"]),
    (["--seed", "-1"], ["--seed", "'-1'"]),
    (["--seed", str(2**32)], ["--seed", str(2**32)]),
    (["--rates", "0.1,nan"], ["--rates", "nan"]),
    (["--rates", "0.1,-2"], ["--rates", "-2"]),
    (["--rates", "abc"], ["--rates", "'abc'"]),
    (["--rates", ""], ["--rates", "empty"]),
    (["--lengths", "sharegpt:5000,100"], ["--lengths", "mean_input", "5000"]),
    (["--lengths", "fixed:0,5"], ["--lengths", "0"]),
    (["--lengths", "weird"], ["--lengths", "'weird'"]),
    (["--arrivals", "gamma:x"], ["--arrivals", "'gamma:x'"]),
    (["--arrivals", "gamma:-1"], ["--arrivals", "'gamma:-1'"]),
    (["--arrivals", "lognormal:nan"], ["--arrivals", "nan"]),
    (["--arrivals", "bursty"], ["--arrivals", "'bursty'"]),
    # unbounded sizes: refused at once, with the limit and the reason
    (["--adapters", "10000000"], ["10,000,000 adapters", "limit of 100,000"]),
    (["--adapters", "1000", "--rates", "5", "--duration", "600000"],
     ["3,000,000,000 requests", "limit of 10,000,000"]),
    (["--duration", "1e9"], ["window 1e+09 s", "limit"]),
    (["--profile", "no-such-gpu"], ["--profile", "no-such-gpu", "available"]),
    (["--profile", "missing.json"], ["--profile", "missing.json", "not found"]),
])
def test_twin_run_refuses_bad_options(argv, needles, capsys):
    refused(twin_main, ["run", *argv], capsys, *needles)


def test_twin_run_refuses_bad_profile_files(tmp_path, capsys):
    refused(twin_main, ["run", "--profile", tmp_path], capsys, "--profile", str(tmp_path),
            "directory")
    refused(twin_main, ["run", "--profile", write(tmp_path / "junk.json", JUNK)], capsys,
            "junk.json", "not a text")
    refused(twin_main, ["run", "--profile", write(tmp_path / "bad.json", '{"name": ')], capsys,
            "bad.json", "invalid JSON")
    prof = json.loads((REPO / "twin" / "profiles" / f"{LLAMA}.json").read_text())
    prof["supported_ranks"] = [16, 8]
    refused(twin_main, ["run", "--profile", write(tmp_path / "p.json", json.dumps(prof))],
            capsys, "p.json", "supported_ranks", "increasing")


def test_twin_run_checks_outputs_before_the_work(tmp_path, capsys):
    refused(twin_main, ["run", "--json", tmp_path], capsys, "--json", "is a directory")
    existing = write(tmp_path / "out.json", "{}")
    err = refused(twin_main, ["run", "--json", existing], capsys, "--json", "--force")
    assert existing.read_text() == "{}"
    assert "out.json" in err
    blocker = write(tmp_path / "file", "x")
    refused(twin_main, ["run", "--json", blocker / "out.json"], capsys, "--json",
            "not a directory")


ADAPTER_CSVS = {
    "rank24.csv": ("id,rank,rate\na,8,0.1\nb,24,0.1\n", ["rank 24 not supported"]),
    "negrate.csv": ("id,rank,rate\na,8,-0.1\n", ["negrate.csv row 1, column 'rate'", "'-0.1'"]),
    "nanrate.csv": ("id,rank,rate\na,8,nan\n", ["nanrate.csv row 1, column 'rate'", "nan"]),
    "nocol.csv": ("id,rank\na,8\n", ["nocol.csv", "missing column", "rate"]),
    "empty.csv": ("", ["empty.csv", "empty"]),
    "header.csv": ("id,rank,rate\n", ["header.csv", "no rows"]),
    "dup.csv": ("id,rank,rate\na,8,0.1\na,8,0.2\n", ["dup.csv row 2", "duplicate adapter id 'a'"]),
    "frac.csv": ("id,rank,rate\na,8.5,0.1\n", ["frac.csv row 1, column 'rank'", "8.5"]),
}


@pytest.mark.parametrize("name", sorted(ADAPTER_CSVS))
def test_twin_run_refuses_bad_adapter_files(name, tmp_path, capsys):
    text, needles = ADAPTER_CSVS[name]
    refused(twin_main, ["run", "--adapters-file", write(tmp_path / name, text)], capsys, *needles)


def test_twin_run_refuses_missing_or_binary_adapter_files(tmp_path, capsys):
    refused(twin_main, ["run", "--adapters-file", tmp_path / "none.csv"], capsys,
            "--adapters-file", "none.csv", "does not exist")
    refused(twin_main, ["run", "--adapters-file", tmp_path], capsys, "--adapters-file",
            "is a directory")
    refused(twin_main, ["run", "--adapters-file", write(tmp_path / "bin.csv", JUNK)], capsys,
            "bin.csv")


HEADER = "arrival_s,adapter_id,input_tokens,output_tokens,rank\n"
TRACES = {
    "neg.csv": (HEADER + "-1,a,10,10,8\n", [], ["neg.csv row 1, column 'arrival_s'", "'-1'"]),
    "norank.csv": ("arrival_s,adapter_id,input_tokens,output_tokens\n1,a,10,10\n", [],
                   ["norank.csv", "'rank' is required"]),
    "rank24.csv": (HEADER + "1,a,10,10,24\n", [], ["rank 24 not supported"]),
    "tokens.csv": (HEADER + "1,a,ten,10,8\n", [], ["tokens.csv row 1, column 'input_tokens'",
                                                    "'ten'"]),
    "late.csv": (HEADER + "".join(f"{4000 + i},a,10,10,8\n" for i in range(5)),
                 ["--duration", "3600"], ["--duration 3600", "late.csv", "first arrival at 4000 s"]),
    "mixed.csv": (HEADER + "1,a,10,10,8\n2,a,10,10,16\n", [],
                  ["mixed.csv row", "column 'rank'", "adapter 'a'"]),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_twin_run_refuses_bad_traces(name, tmp_path, capsys):
    text, extra, needles = TRACES[name]
    refused(twin_main, ["run", "--trace", write(tmp_path / name, text), *extra], capsys, *needles)


def test_twin_run_trace_cannot_be_combined_with_adapters(tmp_path, capsys):
    trace = write(tmp_path / "t.csv", HEADER + "1,a,10,10,8\n")
    refused(twin_main, ["run", "--trace", trace, "--adapters", "8"], capsys, "--trace",
            "--adapters")


def test_twin_run_valid_prints_configuration_units_and_verdict(tmp_path, capsys):
    out_json = tmp_path / "run.json"
    rc, out, err = run(twin_main, ["run", "--adapters", "8", "--amax", "8", "--rates", "0.5",
                                   "--duration", "60", "--json", out_json], capsys)
    assert rc == 0, err
    assert "configuration: profile llama-3.1-8b-instruct" in out and "--max-loras (Amax) 8" in out
    assert "window 60 s" in out and "8 adapters" in out
    assert "tok/s" in out and "verdict: not starved" in out
    rec = json.loads(out_json.read_text())
    assert rec["configuration"]["max_loras"] == 8 and rec["finished_requests"] > 0


def test_twin_run_overload_says_requests_are_unfinished(capsys):
    rc, out, _ = run(twin_main, ["run", "--adapters", "64", "--rates", "3.2", "--amax", "16",
                                 "--duration", "60"], capsys)
    assert rc == 0
    assert "verdict: STARVED" in out and "were unfinished when the window closed" in out


def test_twin_run_without_arrivals_says_so(capsys):
    rc, out, _ = run(twin_main, ["run", "--adapters", "1", "--rates", "0.0001", "--duration", "1"],
                     capsys)
    assert rc == 0 and "verdict: NO REQUEST arrived" in out and "not starved" not in out


def test_twin_run_trace_window_defaults_to_the_trace_span(tmp_path, capsys):
    rng = np.random.default_rng(0)
    t = np.sort(rng.random(300) * 600.0)
    rows = "".join(f"{x:.3f},a{i % 3},100,100,8\n" for i, x in enumerate(t))
    trace = write(tmp_path / "t.csv", HEADER + rows)
    rc, out, err = run(twin_main, ["run", "--trace", trace, "--amax", "8"], capsys)
    assert rc == 0, err
    span = int(np.floor(t.max())) + 1
    assert f"window {span} s (the trace's span)" in out
    offered = float(next(line.split()[1].replace(",", "") for line in out.splitlines()
                         if line.startswith("offered_realised_tps")))
    assert offered == pytest.approx(300 * 200 / span, rel=1e-3)   # not diluted over 3600 s


@pytest.mark.parametrize("argv, needles", [
    (["--rates", "0.1", "--ranks", "24"], ["--ranks", "rank 24 not supported"]),
    (["--rates", "0", "--ranks", "8"], ["--rates", "0"]),
    (["--rates", "0.1", "--ranks", "8", "--duration", "nan"], ["--duration", "'nan'"]),
    (["--rates", "0.1", "--ranks", "8", "--seed", "-1"], ["--seed", "'-1'"]),
    (["--rates", "0.1", "--ranks", "8", "--duration", "1e8"], ["--rates/--duration", "limit"]),
    (["--rates", "0.1", "--ranks", "8", "--profile", "nope"], ["--profile", "nope"]),
])
def test_twin_maxpack_refuses_bad_options(argv, needles, capsys):
    refused(twin_main, ["maxpack", *argv], capsys, *needles)


def test_twin_maxpack_without_a_passing_point_exits_1(capsys):
    rc, out, err = run(twin_main, ["maxpack", "--rates", "3.2", "--ranks", "32", "--duration",
                                   "20", "--quiet"], capsys)
    assert rc == 1 and "served_adapters=0" in out and "no configuration serves" in out
    assert err == ""                                            # --quiet: no progress bar


@pytest.mark.parametrize("argv, needles", [
    (["--data", "nowhere", "--model", LLAMA, "--out", "x.json"], ["--data", "nowhere"]),
    (["--data", "README.md", "--model", LLAMA, "--out", "x.json"], ["--data", "not a directory"]),
    (["--data", ".", "--model", LLAMA, "--out", "README.md"], ["--out", "README.md", "--force"]),
    (["--data", ".", "--model", LLAMA, "--out", "twin"], ["--out", "is a directory"]),
])
def test_twin_calibrate_refuses_bad_paths(argv, needles, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    refused(twin_main, ["calibrate", *argv], capsys, *needles)


# ============================================================================ optim
def tiny_instance(tmp_path: Path, rate: float = 3.0, n: int = 4, **extra) -> Path:
    d = {"name": "tiny", "adapters": [{"id": f"a{i}", "rank": 8, "rate": rate} for i in range(n)],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": 2}], "duration_s": 60, "seed": 1,
         **extra}
    return write(tmp_path / "inst.json", json.dumps(d))


@pytest.mark.parametrize("broken, needles", [
    ({"duration_s": 1e12}, ["duration_s", "1e+12 s", "limit of 604800 s"]),
    ({"duration_s": 500000, "adapters": [{"id": "a", "rank": 8, "rate": 500.0}]},
     ["duration_s", "requests", "limit of 10,000,000 per GPU"]),
    ({"duration_s": -1}, ["duration_s", "-1"]),
    ({"duration_s": "long"}, ["duration_s", "'long'"]),
    ({"seed": -1}, ["seed", "-1"]),
    ({"seed": 2**40}, ["seed", str(2**40)]),
    ({"starvation_threshold": 1.5}, ["starvation_threshold", "1.5"]),
    ({"gpus": [{"name": "h", "profile": "nope", "count": 1}]}, ["gpus[0].profile", "nope"]),
    ({"gpus": [{"name": "h", "profile": LLAMA, "count": 0}]}, ["gpus[0].count", "0"]),
    ({"adapters": [{"id": "a", "rank": 8, "rate": "fast"}]}, ["adapters[0].rate", "'fast'"]),
    ({"adapters": "missing.csv"}, ["adapters", "missing.csv", "not found"]),
    ({"objective": "speed"}, ["objective", "speed"]),
    ({"solver": {"time_limit_s": 0}}, ["solver.time_limit_s", "0"]),
])
def test_optim_solve_refuses_broken_instances(broken, needles, tmp_path, capsys):
    d = {"name": "tiny", "adapters": [{"id": "a0", "rank": 8, "rate": 1.0}],
         "gpus": [{"name": "h100", "profile": LLAMA, "count": 1}], **broken}
    inst = write(tmp_path / "inst.json", json.dumps(d))
    refused(optim_main, ["solve", inst, "--method", "greedy"], capsys, "inst.json", *needles)


def test_optim_solve_refuses_unreadable_instance_files(tmp_path, capsys):
    refused(optim_main, ["solve", write(tmp_path / "junk.json", JUNK), "--method", "greedy"],
            capsys, "junk.json", "not a text")
    refused(optim_main, ["solve", tmp_path, "--method", "greedy"], capsys, str(tmp_path),
            "directory")
    refused(optim_main, ["solve", tmp_path / "none.json", "--method", "greedy"], capsys,
            "none.json", "cannot read")
    refused(optim_main, ["solve", write(tmp_path / "bad.json", "{"), "--method", "greedy"],
            capsys, "bad.json", "invalid JSON")
    refused(optim_main, ["solve", write(tmp_path / "list.json", "[1]"), "--method", "greedy"],
            capsys, "list.json", "JSON object")


def test_optim_solve_refuses_a_broken_adapters_csv(tmp_path, capsys):
    write(tmp_path / "ad.csv", "id,rank,rate\na,8,0.1\nb,8,zero\n")
    d = {"name": "csv", "adapters": "ad.csv", "gpus": [{"name": "h", "profile": LLAMA, "count": 1}]}
    inst = write(tmp_path / "inst.json", json.dumps(d))
    refused(optim_main, ["solve", inst, "--method", "greedy"], capsys, "adapters",
            "ad.csv row 2, column 'rate'", "'zero'")


@pytest.mark.parametrize("argv, needles", [
    (["--time-limit", "nan"], ["--time-limit", "'nan'"]),
    (["--time-limit", "0"], ["--time-limit", "'0'"]),
    (["--time-limit", "-5"], ["--time-limit", "'-5'"]),
    (["--workers", "0"], ["--workers", "'0'"]),
    (["--workers", "x"], ["--workers", "'x'"]),
    (["--show-ids", "-1"], ["--show-ids", "'-1'"]),
    (["--gpus", "0"], ["--gpus", "'0'"]),
    (["--gpus", "2"], ["--gpus 2", "method 'greedy' chooses the fleet size", "random"]),
    (["--seed", "-1"], ["--seed", "'-1'"]),
    (["--duration", "nan"], ["--duration", "'nan'"]),
    (["--duration", "1e7"], ["--duration", "'1e7'"]),
    (["--method", "bogus"], ["--method", "unknown method 'bogus'"]),
    (["--adapter-dir", " "], ["--adapter-dir", "empty"]),
])
def test_optim_solve_refuses_bad_options(argv, needles, tmp_path, capsys):
    inst = tiny_instance(tmp_path)
    args = ["solve", inst, *argv] + ([] if "--method" in argv else ["--method", "greedy"])
    refused(optim_main, args, capsys, *needles)


def test_optim_solve_checks_outputs_before_solving(tmp_path, capsys):
    inst = tiny_instance(tmp_path)
    for opt in ("--json", "--vllm-args"):
        err = refused(optim_main, ["solve", inst, "--method", "maxbase", opt, tmp_path], capsys,
                      opt, "is a directory")
        existing = write(tmp_path / "old.json", "keep")
        t0 = time.perf_counter()
        rc, out, err = run(optim_main, ["solve", inst, "--method", "maxbase", opt, existing], capsys)
        assert rc == 2 and "--force" in err and existing.read_text() == "keep"
        assert "verdict" not in out and time.perf_counter() - t0 < 5   # refused before the work
    same = tmp_path / "same.json"
    refused(optim_main, ["solve", inst, "--method", "maxbase", "--json", same, "--vllm-args", same],
            capsys, "same file")


def test_optim_vllm_args_refused_for_a_rejected_placement(tmp_path, capsys):
    inst = tiny_instance(tmp_path, rate=3.0, n=16)           # ~20k tok/s: one GPU starves
    va = tmp_path / "va.json"
    rc, out, err = run(optim_main, ["solve", inst, "--method", "random", "--gpus", "1",
                                    "--workers", "1", "--vllm-args", va, "--quiet"], capsys)
    assert rc == 1 and "verdict=rejected" in out
    assert not va.exists() and "--allow-rejected" in err
    rc, out, err = run(optim_main, ["solve", inst, "--method", "random", "--gpus", "1",
                                    "--workers", "1", "--vllm-args", va, "--allow-rejected",
                                    "--quiet"], capsys)
    assert rc == 1 and json.loads(va.read_text())["twin_verdict"] == "rejected"
    assert "twin_verdict=rejected" in out


def test_optim_solve_valid_instance_accepted_with_units(tmp_path, capsys):
    inst = tiny_instance(tmp_path)
    va = tmp_path / "va.json"
    rc, out, err = run(optim_main, ["solve", inst, "--method", "maxbase", "--workers", "1",
                                    "--vllm-args", va], capsys)
    assert rc == 0 and "verdict=accepted" in out and "units:" in out and "tok/s" in out
    assert json.loads(va.read_text())["twin_verdict"] == "accepted"
    assert "twin replay" in err                                  # progress bar on stderr
    rc, out, err = run(optim_main, ["solve", inst, "--method", "maxbase", "--workers", "1",
                                    "--quiet", "--vllm-args", va, "--force"], capsys)
    assert rc == 0 and "twin replay" not in err


def test_optim_generate_refuses_bad_options(tmp_path, capsys):
    refused(optim_main, ["generate", "--set", "small", "--out", tmp_path, "--seed", "-1"],
            capsys, "--seed", "'-1'")
    f = write(tmp_path / "f", "x")
    refused(optim_main, ["generate", "--set", "small", "--out", f], capsys, "--out", "is a file")
    refused(optim_main, ["generate", "--set", "tiny", "--out", tmp_path], capsys, "--set", "tiny")


# ============================================================================ surrogates
def damaged_model(tmp_path: Path, kind: str) -> Path:
    d = tmp_path / f"model-{kind}"
    shutil.copytree(MODEL, d)
    if kind == "missing_npz":
        (d / "fast.npz").unlink()
    elif kind == "truncated_npz":
        data = (d / "throughput.npz").read_bytes()
        (d / "throughput.npz").write_bytes(data[: len(data) // 3])
    elif kind == "empty_manifest":
        (d / "manifest.json").write_text("")
    elif kind == "invalid_manifest":
        (d / "manifest.json").write_text('{"profile": ')
    elif kind == "missing_manifest":
        (d / "manifest.json").unlink()
    elif kind == "capacity_invalid_json":
        (d / "capacity.json").write_text("garbage")
    elif kind == "capacity_missing_field":
        (d / "capacity.json").write_text('{"kind": "capacity"}')
    elif kind == "capacity_bad_pieces":
        c = json.loads((d / "capacity.json").read_text())
        c["pieces"] = [{"nonsense": 1}]
        (d / "capacity.json").write_text(json.dumps(c))
    elif kind == "model_json_binary":
        (d / "itl.json").write_bytes(JUNK)
    elif kind == "tree_out_of_range":
        z = dict(np.load(MODEL / "starvation.npz"))
        z["left"] = np.zeros_like(z["left"])
        np.savez(d / "starvation.npz", **z)
    elif kind == "fast_missing_array":
        z = dict(np.load(MODEL / "fast.npz"))
        del z["thr_leaf"]
        np.savez(d / "fast.npz", **z)
    return d


DAMAGE = {
    "missing_npz": ["fast.npz", "not found"],
    "truncated_npz": ["throughput.npz", "damaged or truncated"],
    "empty_manifest": ["manifest.json", "empty file"],
    "invalid_manifest": ["manifest.json", "invalid JSON"],
    "missing_manifest": ["manifest.json", "not found"],
    "capacity_invalid_json": ["capacity.json", "invalid JSON"],
    "capacity_missing_field": ["capacity.json", "missing field"],
    "capacity_bad_pieces": ["capacity.json", "invalid content"],
    "model_json_binary": ["itl.json", "not a text"],
    "tree_out_of_range": ["starvation.npz", "child index out of range"],
    "fast_missing_array": ["fast.npz", "thr_leaf"],
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_surrogates_evaluate_names_the_damaged_model_file(kind, tmp_path, capsys):
    d = damaged_model(tmp_path, kind)
    real = write(tmp_path / "real.csv", "status\n")
    refused(surrogates_main, ["evaluate", "--model", d, "--real", real], capsys, *DAMAGE[kind])


def test_surrogates_evaluate_refuses_bad_paths(tmp_path, capsys):
    refused(surrogates_main, ["evaluate", "--model", tmp_path / "none", "--real", "x.csv"], capsys,
            "--model", "not a directory")
    refused(surrogates_main, ["evaluate", "--model", MODEL, "--data", tmp_path / "d.parquet"],
            capsys, "--data", "d.parquet", "does not exist")
    junk = write(tmp_path / "junk.parquet", JUNK)
    refused(surrogates_main, ["evaluate", "--model", MODEL, "--data", junk], capsys,
            "junk.parquet", "not a readable Parquet")
    refused(surrogates_main, ["evaluate", "--model", MODEL], capsys, "--data", "--real")
    prose = write(tmp_path / "prose.csv", "a\nb\nc\nd,e,f,g\n")
    refused(surrogates_main, ["evaluate", "--model", MODEL, "--real", prose], capsys, "--real",
            "prose.csv", "not a readable CSV")
    refused(surrogates_main, ["evaluate", "--model", MODEL, "--real", write(tmp_path / "b.csv", JUNK)],
            capsys, "--real", "b.csv")


@pytest.mark.parametrize("argv, needles", [
    (["--flush-every", "0"], ["--flush-every", "'0'"]),
    (["--flush-seconds", "nan"], ["--flush-seconds", "'nan'"]),
    (["--workers", "0"], ["--workers", "'0'"]),
    (["--samples", "0"], ["--samples", "'0'"]),
    (["--seed", "-1"], ["--seed", "'-1'"]),
    (["--duration", "nan"], ["--duration", "'nan'"]),
    (["--client-max-waiting", "-1"], ["--client-max-waiting", "'-1'"]),
])
def test_surrogates_build_refuses_bad_options(argv, needles, tmp_path, capsys):
    base = {"--profile": LLAMA, "--samples": "2", "--out": str(tmp_path / "d.parquet")}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    refused(surrogates_main, ["build", *[x for kv in base.items() for x in kv]], capsys, *needles)


def test_surrogates_build_and_train_check_outputs(tmp_path, capsys):
    refused(surrogates_main, ["build", "--profile", LLAMA, "--samples", "1", "--out", tmp_path],
            capsys, "--out", "is a directory")
    refused(surrogates_main, ["build", "--profile", "nope", "--samples", "1", "--out",
                              tmp_path / "d.parquet"], capsys, "profile", "nope")
    data = write(tmp_path / "d.parquet", b"")
    f = write(tmp_path / "f", "x")
    refused(surrogates_main, ["train", "--data", data, "--out", f], capsys, "--out", "is a file")
    refused(surrogates_main, ["train", "--data", data, "--out", MODEL], capsys, "--out",
            "manifest.json", "--force")
    refused(surrogates_main, ["train", "--data", tmp_path / "none.parquet", "--out", tmp_path / "m"],
            capsys, "--data", "none.parquet")
    refused(surrogates_main, ["train", "--data", data, "--out", tmp_path / "m", "--test-frac", "1.5"],
            capsys, "--test-frac", "'1.5'")


def test_surrogates_build_ctrl_c_saves_finished_scenarios_and_resumes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops the build with a
    one-line message and exit 130; every scenario reported finished is saved; the same command
    resumes."""
    from tests.test_signals import sigint_default
    out = tmp_path / "d.parquet"
    cmd = [sys.executable, "-m", "surrogates", "build", "--profile", LLAMA, "--samples", "40",
           "--out", str(out), "--duration", "120", "--workers", "2", "--flush-seconds", "0.5",
           "--flush-every", "1000", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=sigint_default)
    parts = Path(str(out) + ".parts")
    deadline = time.time() + 120
    while time.time() < deadline and not (parts.exists() and any(parts.iterdir())):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "SystemError" not in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted; resume with the same command"
    from surrogates.dataset import load_dataset
    n_saved = load_dataset(out)["scenario_id"].nunique()
    stopped = [line for line in stdout.splitlines() if "stopped by signal" in line]
    assert stopped and f"after {n_saved} scenarios" in stopped[0]      # nothing finished is lost
    assert 0 < n_saved < 40


def test_optim_solve_ctrl_c_during_the_twin_replay_is_one_line(tmp_path):
    from tests.test_signals import sigint_default
    inst = tiny_instance(tmp_path, rate=1.5, n=32)
    err_file = tmp_path / "err.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "optim", "solve", str(inst), "--method",
                                 "random", "--gpus", "4", "--duration", "7200", "--workers", "2"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, preexec_fn=sigint_default)
        deadline = time.time() + 120
        while time.time() < deadline and "twin replay" not in err_file.read_text():
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    text = err_file.read_text()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and text.strip().endswith("interrupted")


def test_entry_points_print_no_traceback_on_binary_input(tmp_path):
    junk = write(tmp_path / "junk.json", JUNK)
    for cmd in (["optim", "solve", str(junk), "--method", "greedy"],
                ["twin", "run", "--profile", str(junk)],
                ["twin", "run", "--trace", str(junk)]):
        p = subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, capture_output=True, text=True)
        assert p.returncode == 2 and "Traceback" not in p.stderr and "junk.json" in p.stderr, cmd


# ============================================================================ help and hashing
@pytest.mark.parametrize("build", ["twin", "optim", "surrogates"])
def test_every_option_has_help_and_exit_codes_are_documented(build):
    import argparse
    if build == "twin":
        from twin.cli import build_parser
        parser = build_parser()
    elif build == "optim":
        from optim.cli import build_parser
        parser = build_parser()
    else:
        from surrogates.cli import parser as build_parser
        parser = build_parser()
    assert "exit codes" in (parser.epilog or "")
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]
    for name, sub in subs.choices.items():
        assert "exit codes" in (sub.epilog or ""), name
        for act in sub._actions:
            if isinstance(act, argparse._HelpAction):
                continue
            assert act.help and act.help != argparse.SUPPRESS, f"{build} {name} {act.dest}"


def test_profile_hash_ignores_where_and_when_a_profile_was_calibrated(tmp_path):
    from surrogates.dataset import profile_hash
    d = json.loads((REPO / "twin" / "profiles" / f"{LLAMA}.json").read_text())
    d["source"] = {**d["source"], "data_dir": "/elsewhere/data", "calibrated_on": "2030-01-01"}
    d["fit_report"] = {}
    moved = write(tmp_path / "moved.json", json.dumps(d))
    assert profile_hash(str(moved)) == profile_hash(LLAMA)
    d["step_coef"][0] += 1.0
    changed = write(tmp_path / "changed.json", json.dumps(d))
    assert profile_hash(str(changed)) != profile_hash(LLAMA)



# ============================================================================ issue 29
# Each case: exit 2, stderr exactly the one line `error: <option, file or field>: <reason and
# the bad value>`, and no output file left behind.
def one_line(main, argv, capsys, out: Path | None = None) -> str:
    rc, _, err = run(main, argv, capsys)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), (rc, err)
    if out is not None:
        assert not out.exists(), f"{out} left behind"
    return lines[0]


# ---------------------------------------------------------------- unbounded numbers, strict CSV
STRICT_CSVS = {
    "float_rank.csv": ("id,rank,rate\na,8.0,0.1\n",
                       "error: float_rank.csv row 1, column 'rank': not an integer ('8.0'): write "
                       "whole numbers without a decimal point or exponent"),
    "exp_rank.csv": ("id,rank,rate\na,8,0.1\nb,1e1,0.1\n",
                     "error: exp_rank.csv row 2, column 'rank': not an integer ('1e1'): write "
                     "whole numbers without a decimal point or exponent"),
    "extra.csv": ("id,rank,rate\na,8,0.1\nb,8,0.1,x\n",
                  "error: extra.csv row 2: 4 fields, the header has 3 (id,rank,rate): 'b,8,0.1,x'"),
    "extra_all.csv": ("id,rank,rate\na,8,0.1,x\nb,8,0.2,y\n",
                      "error: extra_all.csv row 1: 4 fields, the header has 3 (id,rank,rate): "
                      "'a,8,0.1,x'"),
    "short.csv": ("id,rank,rate\na,8,0.1\n\nb,8\n",
                  "error: short.csv row 2: 2 fields, the header has 3 (id,rank,rate): 'b,8'"),
}


@pytest.mark.parametrize("name", sorted(STRICT_CSVS))
def test_adapter_csv_rows_are_parsed_strictly(name, tmp_path, capsys):
    text, line = STRICT_CSVS[name]
    out = tmp_path / "run.json"
    assert one_line(twin_main, ["run", "--adapters-file", write(tmp_path / name, text),
                                "--json", out], capsys, out) == line


def test_trace_row_with_a_billion_tokens_is_refused(tmp_path, capsys):
    trace = write(tmp_path / "t.csv", HEADER + "1,a,200,10,8\n2,a,1000000000,10,8\n")
    out = tmp_path / "run.json"
    assert one_line(twin_main, ["run", "--trace", trace, "--json", out], capsys, out) == (
        "error: t.csv row 2: 1,000,000,000 input + 10 output tokens exceed the profile's "
        "max_model_len 131,072 (columns 'input_tokens', 'output_tokens')")
    # above the profile's context, below the generic per-request limit: refused too
    trace = write(tmp_path / "t2.csv", HEADER + "1,a,200,10,8\n2,a,200000,10,8\n")
    assert one_line(twin_main, ["run", "--trace", trace, "--json", out], capsys, out) == (
        "error: t2.csv row 2: 200,000 input + 10 output tokens exceed the profile's "
        "max_model_len 131,072 (columns 'input_tokens', 'output_tokens')")


def test_trace_tokens_are_checked_against_the_profile_context(tmp_path):
    from twin.workload import load_trace_csv
    trace = write(tmp_path / "t.csv", HEADER + "1,a,131000,100,8\n")
    with pytest.raises(ValueError, match=r"t.csv row 1: 131,000 input \+ 100 output tokens "
                                         r"exceed the profile's max_model_len 131,072"):
        load_trace_csv(trace, duration_s=10, max_model_len=131072)


def test_a_trace_or_adapter_file_over_the_row_limit_is_refused_before_parsing(tmp_path,
                                                                               monkeypatch):
    import twin.workload as w
    monkeypatch.setattr(w, "MAX_ADAPTERS_PER_INSTANCE", 3)
    csv = write(tmp_path / "many.csv", "id,rank,rate\n" + "".join(f"a{i},8,0.1\n"
                                                                  for i in range(5)))
    with pytest.raises(ValueError, match="many.csv: more than 3 rows, the limit of one adapters "
                                         "file"):
        w.load_adapters_csv(csv)


def _plan_file(tmp_path: Path, rate: float = 0.1, **gpu) -> Path:
    d = {"instance": "tiny", "method": "greedy", "status": "solved", "wall_time_s": 0.1,
         "objective": "gpus",
         "gpus": [{"gpu_type": "h100", "profile": LLAMA, "max_loras": 8, "max_lora_rank": 8,
                   "offered_tps": 10.0, **gpu,
                   "adapters": [{"id": "a0", "rank": 8, "rate": rate, "share": 1.0}]}]}
    return write(tmp_path / "plan.json", json.dumps(d))


def test_a_workload_of_1e15_requests_per_second_is_refused_before_drawing(tmp_path, capsys):
    from twin.harness.cli import main as harness_main
    plan = _plan_file(tmp_path, rate=1e15)
    out = tmp_path / "v"
    assert one_line(harness_main, ["verify", plan, "--duration", "60", "--endpoints",
                                   "http://127.0.0.1:9", "--out", out], capsys) == (
        f"error: plan {plan}: GPU 0: workload: about 60,000,000,000,000,000 requests expected "
        "(1e+15 req/s x 60 s) exceed the limit of 10,000,000 per server (~100 bytes each in "
        "memory); shorten the window or lower the rates")
    assert not (tmp_path / "v.json").exists()


# ---------------------------------------------------------------- left from the first set
@pytest.mark.parametrize("text, field", [("{}", "missing field 'profile'"),
                                         ('{"profile": "", "split": {}}', "field 'profile'"),
                                         (json.dumps({"profile": LLAMA}), "field 'split'")])
def test_surrogates_model_with_an_empty_manifest_names_the_field(text, field, tmp_path, capsys):
    d = tmp_path / "model"
    shutil.copytree(MODEL, d)
    (d / "manifest.json").write_text(text)
    real = write(tmp_path / "real.csv", "status\n")
    line = one_line(surrogates_main, ["evaluate", "--model", d, "--real", real], capsys)
    assert line.startswith(f"error: model manifest {d / 'manifest.json'}: {field}"), line
    assert "python -m surrogates train" in line


def test_an_instance_of_millions_of_adapters_is_refused_at_once(tmp_path, capsys):
    """Counted in the text before the JSON is parsed (10 million ran past a minute; 2 million
    keep the test file at 60 MB)."""
    n = 2_000_000
    inst = tmp_path / "huge.json"
    with open(inst, "w") as fh:
        fh.write('{"name": "huge", "gpus": [{"name": "h100", "profile": "%s", "count": 4}], '
                 '"adapters": [' % LLAMA)
        row = '{"id":"a","rank":8,"rate":1},'
        for _ in range(n // 100_000):
            fh.write(row * 100_000)
        fh.write('{"id":"b","rank":8,"rate":1}]}')
    out = tmp_path / "out.json"
    t0 = time.monotonic()
    line = one_line(optim_main, ["solve", inst, "--method", "greedy", "--json", out], capsys,
                    out)
    assert time.monotonic() - t0 < 10
    assert line == (f"error: {inst}: field 'adapters': about 2,000,001 adapters (\"id\" fields) "
                    "exceed the limit of 1,000,000 per instance; not parsed")


def test_an_instance_adapter_list_or_csv_over_the_limit_is_refused_by_count(tmp_path, capsys,
                                                                            monkeypatch):
    import optim.instance as oi
    import twin.limits as lim
    import twin.workload as w
    monkeypatch.setattr(lim, "MAX_ADAPTERS_PER_INSTANCE", 3)
    monkeypatch.setattr(oi, "MAX_ADAPTERS_PER_INSTANCE", 10)     # let the text pre-scan pass
    monkeypatch.setattr(w, "MAX_ADAPTERS_PER_INSTANCE", 3)
    inst = tiny_instance(tmp_path, n=5)
    assert one_line(optim_main, ["solve", inst, "--method", "greedy"], capsys) == (
        f"error: {inst}: field 'adapters': list: 5 adapters exceed the limit of 3 per "
        "instance (each becomes an object and a model column; the largest shipped instance "
        "has 10,000)")
    write(tmp_path / "ad.csv", "id,rank,rate\n" + "".join(f"a{i},8,0.1\n" for i in range(5)))
    d = {"name": "csv", "adapters": "ad.csv", "gpus": [{"name": "h", "profile": LLAMA,
                                                        "count": 1}]}
    inst = write(tmp_path / "csv.json", json.dumps(d))
    assert one_line(optim_main, ["solve", inst, "--method", "greedy"], capsys) == (
        f"error: {inst}: field 'adapters': ad.csv: more than 3 rows, the limit of one adapters "
        "file (every row is held in memory); split the file")


# ---------------------------------------------------------------- model parameters, derive
@pytest.mark.parametrize("alpha", [-1.0, 0.0, float("nan"), float("inf")])
def test_learned_router_refuses_a_ridge_alpha_that_is_not_positive(alpha):
    from twin.routing import make_router
    with pytest.raises(ValueError) as e:
        make_router("learned", 0, alpha=alpha)
    assert str(e.value) == f"learned router alpha: must be a finite number > 0, got {alpha!r}"


@pytest.mark.parametrize("field, value", [("max_loras", 0), ("max_lora_rank", 0),
                                          ("max_loras", -2), ("max_loras", 1.5)])
def test_routing_plan_refuses_a_gpu_that_can_hold_no_adapter(field, value):
    from twin.profile import load_profile
    from twin.routing import RoutedGpu, RoutingPlan
    from twin.workload import Adapter
    kw = {"max_loras": 8, "max_lora_rank": 16, field: value}
    gpus = (RoutedGpu(load_profile(LLAMA), 8, 16), RoutedGpu(load_profile(LLAMA), **kw))
    with pytest.raises(ValueError) as e:
        RoutingPlan(gpus, ((0,),), ((1.0,),)).check([Adapter("a", 8, 1.0)])
    assert str(e.value) == f"routing plan: GPU 1: {field} must be an integer >= 1, got {value!r}"


GPU_SPEC = {"name": "test GPU", "memory_gib": 80, "hbm_bandwidth_gbs": 3350,
            "bf16_dense_tflops": 989, "host_link_gbs": 64, "tdp_w": 700, "idle_w": 100}


@pytest.mark.parametrize("field, value, unit, lo, hi", [
    ("bf16_dense_tflops", 1e-12, "TFLOPS", "10", "20,000"),
    ("bf16_dense_tflops", 1e9, "TFLOPS", "10", "20,000"),
    ("memory_gib", 0.5, "GiB", "4", "1,024"),
    ("hbm_bandwidth_gbs", 3.35e12, "GB/s", "100", "50,000"),
    ("host_link_gbs", 0.001, "GB/s", "1", "2,000"),
])
def test_twin_derive_refuses_an_implausible_gpu_spec(field, value, unit, lo, hi, tmp_path,
                                                     capsys):
    spec = write(tmp_path / "mygpu.json", json.dumps({**GPU_SPEC, field: value}))
    out = tmp_path / "derived.json"
    line = one_line(twin_main, ["derive", "--gpu", spec, "--model", LLAMA, "--out", out],
                    capsys, out)
    assert line == (f"error: --gpu mygpu: {field} {float(value)!r} {unit} is outside the "
                    f"plausible range [{lo}, {hi}] {unit}")


def test_twin_derive_refuses_an_empty_name(tmp_path, capsys):
    out = tmp_path / "derived.json"
    line = one_line(twin_main, ["derive", "--gpu", "H200", "--model", LLAMA, "--name", "",
                                "--out", out], capsys, out)
    assert line == "error: --name: profile name must be a non-empty string, got ''"
    line = one_line(twin_main, ["derive", "--gpu", "H200", "--model", LLAMA, "--name",
                                "x\u202ey", "--out", out], capsys, out)
    assert line.startswith("error: --name: profile name 'x\\u202ey' contains the "
                           "control/format character U+202E")


def test_derive_ranges_hold_for_the_catalog_and_are_stated():
    from twin.derive import (GPU_SPEC_HELP, GPU_SPEC_RANGES, MODEL_CONFIG_HELP,
                             MODEL_CONFIG_RANGES, check_ranges)
    from twin.gpu_catalog import load_catalog
    from twin.model_configs import model_config
    for g in load_catalog().values():
        check_ranges(g, GPU_SPEC_RANGES, "--gpu")
    for m in (LLAMA, "qwen-2.5-7b-instruct"):
        check_ranges(model_config(m), MODEL_CONFIG_RANGES, "--model")
    assert "bf16_dense_tflops in [10, 20,000] TFLOPS" in GPU_SPEC_HELP
    assert "max_position_embeddings in [512, 10,485,760] tokens" in MODEL_CONFIG_HELP


# ---------------------------------------------------------------- cross-file mismatches
def test_replan_refuses_a_previous_plan_for_another_base_model(tmp_path, capsys):
    plan = _plan_file(tmp_path, profile="qwen-2.5-7b-instruct")
    inst = tiny_instance(tmp_path)
    out = tmp_path / "new.json"
    assert one_line(optim_main, ["replan", inst, "--previous", plan, "--json", out], capsys,
                    out) == (
        f"error: --previous {plan}: GPU 0 runs profile 'qwen-2.5-7b-instruct' (base model "
        f"qwen-2.5-7b-instruct), but the instance {inst} serves base model "
        f"llama-3.1-8b-instruct (profile '{LLAMA}'); a plan can only be re-planned for the "
        "same base model")


def test_harness_verify_names_a_gpu_count_mismatch_before_looking_for_binaries(tmp_path,
                                                                                capsys):
    from twin.harness.cli import main as harness_main
    plan = _plan_file(tmp_path)
    out = tmp_path / "v"
    assert one_line(harness_main, ["verify", plan, "--duration", "60", "--endpoints",
                                   "http://127.0.0.1:9", "http://127.0.0.1:10", "--out", out],
                    capsys) == (f"error: --endpoints: the plan has 1 GPUs, 2 endpoints given "
                                f"({plan}: one endpoint per GPU, in plan order)")
    assert one_line(harness_main, ["verify", plan, "--duration", "60", "--launch", "--server",
                                   "vllm", "--model", "m", "--gpu-ids", "0,1", "--out", out],
                    capsys) == (f"error: --gpu-ids 0,1: the plan has 1 GPUs, 2 GPU ids given "
                                f"({plan}: one CUDA device per server, in plan order)")
    assert not (tmp_path / "v.json").exists() and not (tmp_path / "v.md").exists()


def test_harness_verify_names_an_endpoint_that_is_not_a_vllm_server(tmp_path, capsys):
    import http.server
    import threading

    from twin.harness.cli import main as harness_main

    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        plan = _plan_file(tmp_path)
        out = tmp_path / "v"
        line = one_line(harness_main, ["verify", plan, "--duration", "60", "--endpoints", url,
                                       "--out", out, "--quiet"], capsys)
    finally:
        srv.shutdown()
    assert line == (f"error: --endpoints {url} (GPU 0): {url}/v1/models: not a vLLM server: the "
                    "answer is not JSON (text/html, 18 characters: '<html>hello</html>')")
    assert not (tmp_path / "v.json").exists()
