"""``twin serve``: the online engine against the batch twin, the HTTP API, /metrics, the CLI.

Servers listen on 127.0.0.1 only; every load is bounded in requests and time.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp", reason="twin serve needs aiohttp (pip install -e .)")

from twin.cli import main as twin_main  # noqa: E402
from twin.sharegpt import default_lengths  # noqa: E402
from twin.profile import GpuProfile, load_profile  # noqa: E402
from twin.server import ServerConfig, run_kernel  # noqa: E402
from twin.serve.app import ServeConfig, TwinServer  # noqa: E402
from twin.serve.engine import BASE_MODEL, EngineCore, EngineSettings, replay  # noqa: E402
from twin.workload import Adapter, PoissonArrivals, generate_requests  # noqa: E402

PROFILE = load_profile("llama-3.1-8b-instruct")
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ engine
def _kernel_vs_engine(profile: GpuProfile, adapters: list[Adapter], amax: int, seed: int,
                      duration: float):
    req = generate_requests(adapters, duration, default_lengths(), arrivals=PoissonArrivals(),
                            seed=seed)
    run = run_kernel(profile, adapters, req, ServerConfig(max_loras=amax), 1e7)
    max_rank = max(a.rank for a in adapters)
    settings = EngineSettings.from_profile(profile, amax, max_rank)
    load = [profile.load_time_ms(a.rank, max_rank) for a in adapters]
    first, finish = replay(settings, req.arrival_s, req.adapter, req.input_len, req.output_len,
                           load, names=[a.id for a in adapters])
    return run, first, finish


@pytest.mark.parametrize("amax,n,rate,ranks", [(8, 24, 0.4, (8, 16)), (32, 48, 0.2, (16, 32))])
def test_engine_reproduces_the_kernel_in_virtual_time(amax, n, rate, ranks):
    adapters = [Adapter(f"a{i}", ranks[i % len(ranks)], rate) for i in range(n)]
    run, first, finish = _kernel_vs_engine(PROFILE, adapters, amax, seed=3, duration=40.0)
    assert (run.finish_t > 0).all() and run.stats[2] > amax      # every request done; LRU swaps
    np.testing.assert_allclose(first, run.first_t, rtol=0, atol=1e-9)
    np.testing.assert_allclose(finish, run.finish_t, rtol=0, atol=1e-9)


def test_engine_reproduces_the_kernel_under_preemption():
    d = PROFILE.to_dict()
    d.update(kv_capacity={"8,8": 4096, "8,16": 4096}, max_model_len=2048,
             backbone_kv_tokens=8192)
    small = GpuProfile.from_dict(d)
    adapters = [Adapter(f"a{i}", (8, 16)[i % 2], 0.5) for i in range(20)]
    run, first, finish = _kernel_vs_engine(small, adapters, 8, seed=2, duration=30.0)
    assert run.stats[1] > 50                                      # many preemptions
    np.testing.assert_allclose(first, run.first_t, rtol=0, atol=1e-9)
    np.testing.assert_allclose(finish, run.finish_t, rtol=0, atol=1e-9)


def test_base_model_requests_take_no_adapter_slot():
    core = EngineCore(EngineSettings.from_profile(PROFILE, 1, 16))
    core.register_adapter(0, 5.0)
    core.register_adapter(1, 5.0)
    a0 = core.submit(0, 100, 2, 0.0)
    base = core.submit(BASE_MODEL, 100, 2, 0.0)
    a1 = core.submit(1, 100, 2, 0.0)
    rec = core.step()
    assert set(rec.emitted) == {a0, base}          # a1 skipped: the one slot holds adapter 0
    assert rec.loads == 1
    while core.busy:
        core.step()
    assert a1.first_t > a0.finish_t


def test_kv_capacity_follows_the_profile_and_bad_configs_are_refused():
    s = EngineSettings.from_profile(PROFILE, 32, 16)
    assert s.kv_blocks == PROFILE.kv_tokens(32, 16) // PROFILE.block_size
    with pytest.raises(ValueError, match="--max-loras 384 --max-lora-rank 32"):
        EngineSettings.from_profile(PROFILE, 384, 32)
    with pytest.raises(ValueError, match="--max-lora-rank 12"):
        EngineSettings.from_profile(PROFILE, 8, 12)


# ------------------------------------------------------------------------------ HTTP helpers
def _peft(root: Path, name: str, rank) -> str:
    p = root / name
    p.mkdir(parents=True, exist_ok=True)
    (p / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return str(p)


class ServerThread:
    """A TwinServer on 127.0.0.1:0 in its own event loop thread."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.server = TwinServer(cfg)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        host, port = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _sse(raw: bytes) -> list:
    events = [line[len(b"data: "):] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.fixture(scope="module")
def peft_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("peft")
    return {r: _peft(root, f"r{r}", r) for r in (8, 16, 32)}


@pytest.fixture(scope="module")
def server(peft_dirs):
    cfg = ServeConfig(profile=PROFILE, served_model_name="base", max_loras=2, max_lora_rank=16,
                      lora_modules=(("a8", peft_dirs[8]), ("a16", peft_dirs[16])),
                      time_scale=20.0, port=0)
    s = ServerThread(cfg)
    yield s
    s.close()


# ------------------------------------------------------------------------------ HTTP API
def test_health_and_models(server):
    assert _get(server.url + "/health")[0] == 200
    status, body = _get(server.url + "/v1/models")
    d = json.loads(body)
    assert status == 200 and d["object"] == "list"
    by_id = {m["id"]: m for m in d["data"]}
    assert by_id["base"]["parent"] is None and by_id["base"]["object"] == "model"
    assert by_id["a8"]["parent"] == "base" and by_id["a16"]["parent"] == "base"


def test_completion_counts_tokens(server):
    status, body = _post(server.url + "/v1/completions",
                         {"model": "a8", "prompt": list(range(37)), "max_tokens": 7,
                          "ignore_eos": True})
    d = json.loads(body)
    assert status == 200 and d["object"] == "text_completion"
    assert d["usage"]["prompt_tokens"] == 37 and d["usage"]["completion_tokens"] == 7
    assert d["usage"]["prompt_tokens_source"] == "token_ids"
    assert d["choices"][0]["finish_reason"] == "length"
    assert 0 < d["twin_timing"]["ttft_s"] < d["twin_timing"]["e2e_s"]
    # a text prompt is estimated as ceil(UTF-8 bytes / 4)
    _, body = _post(server.url + "/v1/completions",
                    {"model": "base", "prompt": "x" * 41, "max_tokens": 2, "ignore_eos": True})
    u = json.loads(body)["usage"]
    assert u["prompt_tokens"] == 11 and u["prompt_tokens_source"].startswith("estimate")


def test_streamed_completion_has_one_chunk_per_token(server):
    status, raw = _post(server.url + "/v1/completions",
                        {"model": "a16", "prompt": [1, 2, 3], "max_tokens": 12,
                         "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}})
    chunks = _sse(raw)
    tokens = [c for c in chunks if c["choices"]]
    assert status == 200 and len(tokens) == 12
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_output_length_without_ignore_eos_is_capped_and_seeded(server):
    lens = []
    for _ in range(3):
        _, body = _post(server.url + "/v1/completions",
                        {"model": "a8", "prompt": [5] * 10, "max_tokens": 40})
        d = json.loads(body)
        n = d["usage"]["completion_tokens"]
        assert 1 <= n <= 40
        assert d["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")
        lens.append(n)
    _, body = _post(server.url + "/v1/completions",
                    {"model": "a8", "prompt": [5] * 10, "max_tokens": 9, "min_tokens": 9})
    assert json.loads(body)["usage"]["completion_tokens"] == 9


def test_chat_completion_plain_and_streamed(server):
    msgs = [{"role": "user", "content": "hello there"}]
    status, body = _post(server.url + "/v1/chat/completions",
                         {"model": "a8", "messages": msgs, "max_tokens": 4, "ignore_eos": True})
    d = json.loads(body)
    assert status == 200 and d["object"] == "chat.completion"
    assert d["choices"][0]["message"]["role"] == "assistant"
    assert d["usage"]["completion_tokens"] == 4
    assert d["usage"]["prompt_tokens"] == 4 + 4 + 3          # fixed + per message + ceil(11/4)
    status, raw = _post(server.url + "/v1/chat/completions",
                        {"model": "base", "messages": msgs, "max_completion_tokens": 5,
                         "ignore_eos": True, "stream": True})
    chunks = _sse(raw)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(content) == 5 and content[-1]["choices"][0]["finish_reason"] == "length"


def test_bad_requests_get_vllm_errors(server):
    status, body = _post(server.url + "/v1/completions",
                         {"model": "nope", "prompt": [1], "max_tokens": 1})
    d = json.loads(body)
    assert status == 404 and d["object"] == "error" and d["type"] == "NotFoundError"
    assert "nope" in d["message"]
    status, body = _post(server.url + "/v1/completions",
                         {"model": "base", "prompt": [1], "max_tokens": 10**7})
    assert status == 400 and "maximum context length" in json.loads(body)["message"]
    status, body = _post(server.url + "/v1/completions", {"model": "base", "prompt": []})
    assert status == 400


def test_load_and_unload_adapter(server, peft_dirs):
    status, _ = _post(server.url + "/v1/load_lora_adapter",
                      {"lora_name": "late", "lora_path": peft_dirs[16]})
    assert status == 200
    ids = [m["id"] for m in json.loads(_get(server.url + "/v1/models")[1])["data"]]
    assert "late" in ids
    status, body = _post(server.url + "/v1/completions",
                         {"model": "late", "prompt": [1, 2], "max_tokens": 3, "ignore_eos": True})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    status, body = _post(server.url + "/v1/load_lora_adapter",
                         {"lora_name": "late", "lora_path": peft_dirs[16]})
    err = json.loads(body)
    assert status == 400 and "already been loaded" in err["message"]
    assert err["type"] == "InvalidUserInput" and err["code"] == 400 and err["object"] == "error"
    # vLLM 0.8.5's answers (serving_models.py): empty fields are InvalidUserInput, a missing
    # field fails request validation (BadRequestError), a path without an adapter is a 404
    status, body = _post(server.url + "/v1/load_lora_adapter", {"lora_name": "", "lora_path": ""})
    assert status == 400 and json.loads(body)["type"] == "InvalidUserInput"
    status, body = _post(server.url + "/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400 and json.loads(body)["type"] == "BadRequestError"
    assert "lora_path" in json.loads(body)["message"]
    status, body = _post(server.url + "/v1/load_lora_adapter",
                         {"lora_name": "x", "lora_path": peft_dirs[16] + "-missing"})
    assert status == 404 and json.loads(body)["type"] == "NotFoundError"
    assert "No adapter found" in json.loads(body)["message"]
    status, body = _post(server.url + "/v1/unload_lora_adapter", {"lora_name": ""})
    assert status == 400 and json.loads(body)["type"] == "InvalidUserInput"
    status, body = _post(server.url + "/v1/load_lora_adapter",
                         {"lora_name": "big", "lora_path": peft_dirs[32]})
    assert status == 400 and "max_lora_rank" in json.loads(body)["message"]
    assert _post(server.url + "/v1/unload_lora_adapter", {"lora_name": "late"})[0] == 200
    assert _post(server.url + "/v1/completions",
                 {"model": "late", "prompt": [1], "max_tokens": 1})[0] == 404
    status, body = _post(server.url + "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert status == 404 and json.loads(body)["type"] == "NotFoundError"


METRIC_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info", "vllm:cache_config_info", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket")


def test_metrics_have_vllm_names_and_the_profiles_kv_capacity(server):
    _post(server.url + "/v1/completions",
          {"model": "a8", "prompt": [1] * 20, "max_tokens": 3, "ignore_eos": True})
    status, body = _get(server.url + "/metrics")
    text = body.decode()
    assert status == 200
    for name in METRIC_NAMES:
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name
    for line in text.splitlines():
        if line.startswith(("vllm:num_requests", "vllm:time_to_first")):
            assert 'model_name="base"' in line
    m = re.search(r'^vllm:cache_config_info\{([^}]*)\}', text, re.M)
    labels = re.findall(r'(\w+)="([^"]*)"', m.group(1))
    # vLLM 0.8.5's CacheConfig attributes (prometheus_client writes label names sorted)
    assert [k for k, _ in labels] == sorted([
        "block_size", "gpu_memory_utilization", "swap_space", "cache_dtype", "is_attention_free",
        "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching",
        "prefix_caching_hash_algo", "cpu_offload_gb", "calculate_kv_scales", "num_gpu_blocks",
        "num_cpu_blocks", "swap_space_bytes"])
    labels = dict(labels)
    assert int(labels["block_size"]) == PROFILE.block_size
    assert int(labels["num_gpu_blocks"]) == PROFILE.kv_tokens(2, 16) // PROFILE.block_size
    assert re.search(r'^vllm:lora_requests_info\{max_lora="2",', text, re.M)
    gen = float(re.search(r"^vllm:generation_tokens_total\{.*\} (\S+)", text, re.M).group(1))
    assert gen >= 3


def test_wall_clock_run_equals_virtual_replay_of_its_arrivals(peft_dirs):
    """The asyncio driver only stamps arrivals and releases tokens: replaying the stamped
    arrivals through the engine in pure virtual time gives the same first-token and finish
    times, under a burst that makes adapters compete for max_loras slots."""
    mods = tuple((f"m{i}", peft_dirs[(8, 16)[i % 2]]) for i in range(3))
    cfg = ServeConfig(profile=PROFILE, served_model_name="base", max_loras=2, max_lora_rank=16,
                      lora_modules=mods, time_scale=20.0, port=0)
    srv = ServerThread(cfg)
    n = 40
    ins = [30 + 7 * i for i in range(n)]
    outs = [5 + (i % 6) for i in range(n)]

    async def fire():
        async with aiohttp.ClientSession() as s:
            async def one(i):
                if i % 10 == 5:
                    await asyncio.sleep(0.05)
                async with s.post(srv.url + "/v1/completions", json={
                        "model": f"m{i % 3}", "prompt": [1] * ins[i], "max_tokens": outs[i],
                        "ignore_eos": True}) as r:
                    return (await r.json())["twin_timing"]
            return await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(n)]), 30)

    try:
        timing = asyncio.run(fire())
    finally:
        srv.close()
    order = np.argsort([t["arrival_s"] for t in timing], kind="stable")
    arrival = np.array([timing[i]["arrival_s"] for i in order])
    adapter = np.array([i % 3 for i in order])
    load = [PROFILE.load_time_ms((8, 16)[k % 2], 16) for k in range(3)]
    first, finish = replay(srv.server.settings, arrival, adapter, np.array(ins)[order],
                           np.array(outs)[order], load, names=[name for name, _ in mods])
    np.testing.assert_allclose(first - arrival, [timing[i]["ttft_s"] for i in order], atol=1e-9)
    np.testing.assert_allclose(finish - arrival, [timing[i]["e2e_s"] for i in order], atol=1e-9)


def test_hundreds_of_concurrent_streams_complete(server):
    n, k = 200, 20

    async def fire():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            async def one(i):
                got = 0
                async with s.post(server.url + "/v1/completions", json={
                        "model": ("a8", "a16", "base")[i % 3], "prompt": [3] * 100,
                        "max_tokens": k, "ignore_eos": True, "stream": True}) as r:
                    async for line in r.content:
                        got += line.startswith(b"data: {")
                return got
            return await asyncio.wait_for(asyncio.gather(*[one(i) for i in range(n)]), 25)

    assert asyncio.run(fire()) == [k] * n
    text = _get(server.url + "/metrics")[1].decode()
    assert re.search(r"^vllm:num_requests_running\{.*\} 0\.0$", text, re.M)


def test_a_client_that_disconnects_is_aborted(server):
    """As vLLM, a request whose client went away leaves the batch and frees its KV blocks."""
    async def fire():
        async with aiohttp.ClientSession() as s:
            r = await s.post(server.url + "/v1/completions", json={
                "model": "a8", "prompt": [1] * 50, "max_tokens": 100_000, "ignore_eos": True,
                "stream": True})
            await r.content.readline()
            r.close()
            for _ in range(100):
                text = await (await s.get(server.url + "/metrics")).text()
                if re.search(r"^vllm:num_requests_running\{.*\} 0\.0$", text, re.M):
                    return text
                await asyncio.sleep(0.05)
            return text

    text = asyncio.run(fire())
    assert re.search(r"^vllm:num_requests_running\{.*\} 0\.0$", text, re.M)
    assert re.search(r"^vllm:gpu_cache_usage_perc\{.*\} 0\.0$", text, re.M)


# ------------------------------------------------------------------------------ CLI
@pytest.mark.parametrize("args,needle", [
    (["--profile", "no-such-gpu"], "--profile"),
    (["--enable-lora", "--lora-modules", "justaname"], "expected name=path"),
    (["--enable-lora", "--lora-modules", "a=/no/such/dir"], "does not exist"),
    (["--enable-lora", "--max-lora-rank", "8", "--lora-modules", "a={r16}"],
     "greater than max_lora_rank 8"),
    (["--enable-lora", "--lora-modules", "a={bad}"], "field 'r'"),
    (["--lora-modules", "a={r16}"], "--enable-lora"),
    (["--enable-lora", "--max-loras", "384", "--max-lora-rank", "32"], "no KV capacity"),
    (["--enable-lora", "--max-loras", "8", "--max-cpu-loras", "4"], "--max-cpu-loras"),
])
def test_bad_cli_input_is_one_error_line(args, needle, peft_dirs, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"lora_alpha": 16}')
    args = [a.format(r16=peft_dirs[16], bad=bad) for a in args]
    assert twin_main(["serve", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err


@pytest.mark.parametrize("field,value,needle", [
    ("time_scale", 0.0, "time_scale"), ("time_scale", float("nan"), "time_scale"),
    ("time_scale", 1e308, "time_scale"), ("vllm_version", "0.7.0", "vllm_version"),
    ("port", 70000, "port"), ("max_cpu_loras", 1, "max_cpu_loras"),
    ("served_model_name", "", "served_model_name")])
def test_serve_config_refuses_bad_values(field, value, needle):
    kw = dict(profile=PROFILE, served_model_name="base", max_loras=4)
    kw[field] = value
    with pytest.raises(ValueError, match=needle):
        ServeConfig(**kw)


def test_cli_prints_the_address_and_stops_on_sigterm(peft_dirs):
    proc = subprocess.Popen(
        [sys.executable, "-m", "twin", "serve", "--port", "0", "--enable-lora", "--max-loras",
         "4", "--lora-modules", f"x={peft_dirs[8]}", "--time-scale", "10"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # vLLM 0.8.5's start-up line with the KV capacity (its /metrics lacks it), then the URL
        kv_line = proc.stdout.readline()
        assert re.fullmatch(r"GPU KV cache size: [0-9,]+ tokens\n", kv_line), kv_line
        line = proc.stdout.readline()
        m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert m, line
        from twin.harness.client import kv_cache_tokens, parse_prometheus
        metrics = parse_prometheus(_get(m.group(1) + "/metrics")[1].decode())
        from_metrics = kv_cache_tokens(metrics)
        unknown = [(n, {**lab, "num_gpu_blocks": "None"} if n == "vllm:cache_config_info"
                    else lab, v) for n, lab, v in metrics]   # as a real vLLM 0.8.5 reports
        assert kv_cache_tokens(unknown) is None
        assert kv_cache_tokens(unknown, kv_line) == from_metrics > 0
        status, body = _post(m.group(1) + "/v1/completions",
                             {"model": "x", "prompt": [1, 2], "max_tokens": 2,
                              "ignore_eos": True})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


# ------------------------------------------------------------------------------ vLLM releases
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from twin.serve.metrics import VllmRelease  # noqa: E402

# What the Gateway API Inference Extension's endpoint picker scrapes by default, read from
# github.com/kubernetes-sigs/gateway-api-inference-extension at the release tags:
# v0.5.1 pkg/epp/server/runserver.go (Default*Metric) and pkg/epp/backend/metrics/metrics.go
# (LoRA label names); v1.0.0-v1.2.0 pkg/epp/server/runserver.go (v1.1.0 adds cache_config_info,
# whose labels block_size and num_gpu_blocks pkg/epp/backend/metrics/metrics.go reads);
# v1.3.0-v1.5.0 pkg/epp/server/options.go (kv_cache_usage_perc replaces gpu_cache_usage_perc,
# num_requests_running added).
GIE_V0_5 = ["vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:lora_requests_info"]
GIE_V1_0_TO_1_2 = GIE_V0_5 + ["vllm:cache_config_info"]
GIE_V1_3_TO_1_5 = ["vllm:num_requests_waiting", "vllm:num_requests_running",
                   "vllm:kv_cache_usage_perc", "vllm:lora_requests_info",
                   "vllm:cache_config_info"]
LORA_LABELS = {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}

# vLLM's bucket edges (vllm/v1/metrics/loggers.py, PrometheusStatLogger; the same from 0.8 to
# 0.12 except iteration_tokens_total, whose buckets were the CUDA-graph capture sizes in 0.8.x)
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0]
VLLM_REQUEST_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                        50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
VLLM_ITERATION_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
VLLM_CUDAGRAPH_SIZES = [1, 2, 4] + list(range(8, 513, 8))        # V1 default capture sizes
SECONDS_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": VLLM_TTFT,
    "vllm:time_per_output_token_seconds": VLLM_TPOT,
    "vllm:inter_token_latency_seconds": VLLM_TPOT,
    "vllm:request_time_per_output_token_seconds": VLLM_TPOT,
    "vllm:e2e_request_latency_seconds": VLLM_REQUEST_LATENCY,
    "vllm:request_queue_time_seconds": VLLM_REQUEST_LATENCY,
    "vllm:request_prefill_time_seconds": VLLM_REQUEST_LATENCY,
    "vllm:request_decode_time_seconds": VLLM_REQUEST_LATENCY,
    "vllm:request_inference_time_seconds": VLLM_REQUEST_LATENCY,
}


def _scrape(url: str) -> dict:
    """Parse /metrics as a gateway does: family name -> family."""
    status, body = _get(url + "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _buckets(fam) -> list[float]:
    return [float(s.labels["le"]) for s in fam.samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"]


def _hist(fam, suffix: str) -> float:
    return next(s.value for s in fam.samples if s.name == fam.name + suffix)


def _release_server(peft_dirs, version: str) -> ServerThread:
    return ServerThread(ServeConfig(
        profile=PROFILE, served_model_name="base", max_loras=2, max_lora_rank=16,
        lora_modules=(("a8", peft_dirs[8]),), time_scale=20.0, port=0, vllm_version=version,
        vocab_size=128256))


@pytest.mark.parametrize("version,pickers,absent", [
    ("0.8.5", [GIE_V0_5, GIE_V1_0_TO_1_2], ["vllm:kv_cache_usage_perc",
                                             "vllm:inter_token_latency_seconds"]),
    ("0.10.2", [GIE_V0_5, GIE_V1_0_TO_1_2, GIE_V1_3_TO_1_5], []),
    ("0.12.0", [GIE_V1_3_TO_1_5], ["vllm:gpu_cache_usage_perc",
                                   "vllm:time_per_output_token_seconds"]),
])
def test_gateway_scrape_finds_what_the_endpoint_picker_needs(peft_dirs, version, pickers, absent):
    """A gateway-style scrape (prometheus_client's parser) finds every metric the picker reads,
    with the LoRA and cache labels it parses; histograms carry vLLM's bucket edges and their
    values are the engine's own virtual-clock times."""
    srv = _release_server(peft_dirs, version)
    try:
        timings = []
        for i in range(3):
            status, body = _post(srv.url + "/v1/completions", {
                "model": ("a8", "base")[i % 2], "prompt": list(range(40 + 10 * i)),
                "max_tokens": 6, "ignore_eos": True})
            assert status == 200
            timings.append(json.loads(body)["twin_timing"])
        fams = _scrape(srv.url)
    finally:
        srv.close()
    for need in pickers:
        assert set(need) <= set(fams), sorted(set(need) - set(fams))
    for name in absent:
        assert name not in fams
    assert set(fams) == set(VllmRelease.parse(version).metric_names())
    lora = fams["vllm:lora_requests_info"].samples[0].labels
    assert set(lora) == LORA_LABELS and lora["max_lora"] == "2"
    cache = fams["vllm:cache_config_info"].samples[0].labels
    assert int(cache["block_size"]) * int(cache["num_gpu_blocks"]) == \
        PROFILE.kv_tokens(2, 16) // PROFILE.block_size * PROFILE.block_size
    # bucket edges
    for name, edges in SECONDS_HISTOGRAMS.items():
        if name in fams:
            assert _buckets(fams[name]) == edges, name
    it = VLLM_CUDAGRAPH_SIZES if version == "0.8.5" else VLLM_ITERATION_TOKENS
    assert _buckets(fams["vllm:iteration_tokens_total"]) == it
    tok = _buckets(fams["vllm:request_prompt_tokens"])
    assert tok[:7] == [1, 2, 5, 10, 20, 50, 100] and tok[-1] <= PROFILE.max_model_len < tok[-1] * 2.5
    # values: three requests, each time from the engine's clock
    e2e, queue = fams["vllm:e2e_request_latency_seconds"], fams["vllm:request_queue_time_seconds"]
    prefill = fams["vllm:request_prefill_time_seconds"]
    decode = fams["vllm:request_decode_time_seconds"]
    inference = fams["vllm:request_inference_time_seconds"]
    assert _hist(e2e, "_count") == 3
    assert _hist(e2e, "_sum") == pytest.approx(sum(t["e2e_s"] for t in timings), abs=1e-9)
    assert _hist(fams["vllm:time_to_first_token_seconds"], "_sum") == pytest.approx(
        sum(t["ttft_s"] for t in timings), abs=1e-9)
    parts = _hist(queue, "_sum") + _hist(prefill, "_sum") + _hist(decode, "_sum")
    assert parts == pytest.approx(_hist(e2e, "_sum"), abs=1e-9)      # e2e = queue+prefill+decode
    assert _hist(inference, "_sum") == pytest.approx(
        _hist(prefill, "_sum") + _hist(decode, "_sum"), abs=1e-9)
    assert _hist(fams["vllm:request_prompt_tokens"], "_sum") == 40 + 50 + 60
    assert _hist(fams["vllm:request_generation_tokens"], "_sum") == 18
    assert _hist(fams["vllm:request_params_max_tokens"], "_sum") == 18
    assert _hist(fams["vllm:iteration_tokens_total"], "_sum") == 150 + 18   # prompts + tokens
    assert _hist(fams["vllm:request_params_n"], "_count") == 3


def test_version_and_ping_answer(server, peft_dirs):
    status, body = _get(server.url + "/version")
    assert status == 200 and json.loads(body) == {"version": "0.8.5"}
    assert _get(server.url + "/ping")[0] == 200
    assert _post(server.url + "/ping", {})[0] == 200
    srv = _release_server(peft_dirs, "0.12.0")
    try:
        assert json.loads(_get(srv.url + "/version")[1]) == {"version": "0.12.0"}
    finally:
        srv.close()


def test_vllm_release_rules():
    assert VllmRelease.parse("v0.9.2").kv_cache_usage and VllmRelease.parse("0.9.2").gpu_cache_usage
    assert not VllmRelease.parse("0.9.1").kv_cache_usage
    assert not VllmRelease.parse("0.11.0").gpu_cache_usage
    assert VllmRelease.parse("0.10.1.post1").nested_error and \
        not VllmRelease.parse("0.10.0").nested_error
    for bad_version in ("0.7.3", "latest", "0.8", "1.2.3.4.5"):
        if bad_version == "0.8":
            assert VllmRelease.parse(bad_version).key == (0, 8, 0)
            continue
        with pytest.raises(ValueError):
            VllmRelease.parse(bad_version)


# ------------------------------------------------------------------------------ validation
def _post_raw(url: str, data: bytes) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


CMPL = {"model": "base", "prompt": [1, 2, 3], "max_tokens": 2}
CHAT = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize("route,extra,field,needle", [
    ("completions", {"n": 2}, "n", "not supported"),
    ("completions", {"n": 0}, "n", "at least 1"),
    ("completions", {"temperature": "0.5"}, "temperature", "valid number"),
    ("completions", {"temperature": -0.1}, "temperature", "non-negative"),
    ("completions", {"prompt": [1, 128256]}, "prompt", "Token id 128256 is out of vocabulary"),
    ("completions", {"prompt": [-1, 5]}, "prompt", "out of vocabulary"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options",
     "only be defined when `stream=True`"),
    ("completions", {"logprobs": 1}, "logprobs", "not supported"),
    ("completions", {"best_of": 2}, "best_of", "not supported"),
    ("completions", {"echo": True}, "echo", "not supported"),
    ("completions", {"suffix": "x"}, "suffix", "not supported"),
    ("completions", {"prompt_logprobs": 1}, "prompt_logprobs", "not supported"),
    ("completions", {"use_beam_search": True}, "use_beam_search", "not supported"),
    ("completions", {"response_format": {"type": "json_object"}}, "response_format",
     "guided decoding"),
    ("completions", {"guided_regex": "a+"}, "guided_regex", "guided decoding"),
    ("completions", {"priority": 1}, "priority", "priority scheduling"),
    ("completions", {"top_p": 0}, "top_p", "(0, 1]"),
    ("completions", {"presence_penalty": 3}, "presence_penalty", "[-2, 2]"),
    ("completions", {"seed": 2**64}, "seed", "64-bit"),
    ("completions", {"stop": 5}, "stop", "string"),
    ("completions", {"stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats", "not supported"),
    ("completions", {"max_tokens": 0}, "max_tokens", "at least 1"),
    ("completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens",
     "greater than or equal to 1"),
    ("chat/completions", {"n": 3}, "n", "not supported"),
    ("chat/completions", {"logprobs": True}, "logprobs", "not supported"),
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs", "not supported"),
    ("chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "tool calls"),
    ("chat/completions", {"temperature": "hot"}, "temperature", "valid number"),
    ("chat/completions", {"continue_final_message": True}, "continue_final_message",
     "add_generation_prompt"),
])
def test_requests_vllm_refuses_get_its_400_naming_the_field(server, route, extra, field, needle):
    body = {**(CHAT if route.startswith("chat") else CMPL), **extra}
    status, raw = _post(server.url + f"/v1/{route}", body)
    d = json.loads(raw)
    assert status == 400
    assert set(d) == {"object", "message", "type", "param", "code"}        # vLLM 0.8.5 shape
    assert d["object"] == "error" and d["type"] == "BadRequestError" and d["code"] == 400
    assert d["param"] == field and d["message"].startswith(field + ":"), d
    assert needle in d["message"], d["message"]


def test_newer_release_nests_the_error_body(peft_dirs):
    srv = _release_server(peft_dirs, "0.10.1")
    try:
        status, raw = _post(srv.url + "/v1/completions", {**CMPL, "n": 2})
    finally:
        srv.close()
    d = json.loads(raw)
    assert status == 400 and set(d) == {"error"}
    assert d["error"] == {"message": d["error"]["message"], "type": "BadRequestError",
                          "param": "n", "code": 400}


def test_unmodelled_fields_are_accepted_by_name_and_honoured_ones_applied(server):
    body = {**CMPL, "prompt": list(range(37)), "temperature": 0.7, "top_p": 0.9, "seed": 3,
            "stop": ["\n"], "truncate_prompt_tokens": 10, "ignore_eos": True, "no_such_field": 1,
            "request_id": "abc"}
    status, raw, headers = _post_raw(server.url + "/v1/completions", json.dumps(body).encode())
    d = json.loads(raw)
    assert status == 200
    assert d["usage"]["prompt_tokens"] == 10                   # truncate_prompt_tokens honoured
    assert d["id"] == "cmpl-abc"
    assert headers["X-Twin-Not-Modelled"].split(",") == ["temperature", "top_p", "seed", "stop"]
    assert headers["X-Twin-Ignored-Fields"] == "no_such_field"  # vLLM ignores unknown fields


@pytest.mark.parametrize("raw", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "base", "prompt": ' + b"[" * 5_000 + b"1" + b"]" * 5_000 + b"}",
    b'{"model": "base", "prompt": "' + b"[" * 5_000 + b'", "max_tokens": 1, "x": '
    + b"{\"a\":" * 70 + b"1" + b"}" * 70 + b"}",
])
def test_deeply_nested_json_is_a_400_not_a_500(server, raw):
    status, body, _ = _post_raw(server.url + "/v1/completions", raw)
    d = json.loads(body)
    assert status == 400 and d["type"] == "BadRequestError" and "nested" in d["message"]
    assert _get(server.url + "/health")[0] == 200


def test_brackets_inside_strings_do_not_count_as_nesting(server):
    body = {**CMPL, "prompt": "[" * 500 + "{" * 500, "max_tokens": 1, "ignore_eos": True}
    assert _post(server.url + "/v1/completions", body)[0] == 200


@pytest.mark.parametrize("args,needle", [
    (["--time-scale", "1e308"], "--time-scale"),
    (["--time-scale", "nan"], "--time-scale"),
    (["--max-num-batched-tokens", "1"], "--max-num-batched-tokens 1: must be >= --max-num-seqs"),
    (["--max-num-batched-tokens", "4096", "--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-batched-tokens", "10000000"], "--max-num-batched-tokens"),
    (["--served-model-name", ""], "--served-model-name"),
    (["--served-model-name", " base"], "--served-model-name"),
    (["--vllm-version", "0.7.3"], "--vllm-version"),
    (["--vllm-version", "latest"], "--vllm-version"),
])
def test_bad_start_up_flags_are_one_line_exit_2(args, needle, capsys):
    assert twin_main(["serve", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err


def test_unparsable_flag_value_is_one_line_too(capsys):
    with pytest.raises(SystemExit) as e:
        twin_main(["serve", "--time-scale", "fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--time-scale" in err[0], err


def test_bad_flags_exit_2_from_the_command_line():
    for args in (["--time-scale", "1e308"], ["--max-num-batched-tokens", "1"],
                 ["--served-model-name", ""]):
        p = subprocess.run([sys.executable, "-m", "twin", "serve", "--port", "0", *args],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and args[0] in lines[0], (args, p.stderr)


def test_help_states_the_ranges():
    from twin.serve.cli import build_parser
    text = " ".join(build_parser().format_help().split())
    assert "in [0.001, 1000]" in text and ">= --max-num-seqs" in text
    assert "0.8.0 or later" in text and "non-empty" in text


def test_soak_benchmark_runs_small(capsys):
    """experiments.twin_serve_soak end to end at a small size (the full run: 1,000
    connections, < 2 min)."""
    from experiments.twin_serve_soak import main as soak
    assert soak(["--connections", "60", "--tokens", "4", "--slow-seconds", "1.5",
                 "--time-scale", "2", "--timeout", "40"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("soak: served 60/60, errors 0") and "slow reader aborted yes" in last


def test_json_depth_bound_skips_strings_and_escapes():
    from twin.serve.validate import MAX_JSON_DEPTH, json_depth_ok
    n = MAX_JSON_DEPTH
    assert json_depth_ok(b"[" * n + b"]" * n) and not json_depth_ok(b"[" * (n + 1) + b"]" * (n + 1))
    deep_value = json.dumps({"a": "x\\", "q": 'say "[[["', "b": [[[[1]]]]}).encode()
    assert json_depth_ok(deep_value, 5) and not json_depth_ok(deep_value, 4)
    in_string = json.dumps({"p": "[{" * 10_000 + '\\"' + "[" * 100}).encode()
    assert json_depth_ok(in_string)


def test_unknown_field_names_cannot_inject_headers(server):
    body = {**CMPL, "a\r\nX-Evil: 1": 1, "tempé": 2}
    status, _, headers = _post_raw(server.url + "/v1/completions", json.dumps(body).encode())
    assert status == 200 and "X-Evil" not in headers
    assert headers["X-Twin-Ignored-Fields"] == "a%0D%0AX-Evil:%201,temp%C3%A9"


def test_no_field_value_makes_a_500(server):
    """Every field vLLM knows, with values of every JSON type: 200, or a 400/404 error body,
    never a server error."""
    from twin.serve.validate import CHAT as CHAT_FIELDS
    from twin.serve.validate import COMPLETION as COMPLETION_FIELDS
    values = [None, -1, 1.5, float("nan"), "x", [1], ["a"], {"a": 1}, True, 2**70]
    messages = [[{"role": "user", "content": [{"type": "text", "text": 5}]}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                [{"content": "no role"}], [{"role": "user", "content": 5}]]
    cases = []
    for route, table, base in (("completions", COMPLETION_FIELDS, CMPL),
                               ("chat/completions", CHAT_FIELDS, CHAT)):
        for f in table:
            cases += [(route, {**base, f: v}) for v in values]
    cases += [("chat/completions", {**CHAT, "messages": m}) for m in messages]

    async def fire():
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as s:
            async def one(route, body):
                async with sem:
                    async with s.post(server.url + f"/v1/{route}",
                                      data=json.dumps(body)) as r:
                        raw = await r.read()           # 200: JSON or an SSE stream
                        return r.status, (json.loads(raw) if r.status != 200 else None)
            return await asyncio.wait_for(asyncio.gather(*[one(*c) for c in cases]), 60)

    for (route, body), (status, d) in zip(cases, asyncio.run(fire())):
        assert status in (200, 400, 404), (route, body, status, d)
        if status != 200:
            assert d["object"] == "error" and d["code"] == status, (route, body, d)
