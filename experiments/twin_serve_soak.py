"""Soak test of ``twin serve``: 1,000 concurrent connections and a slow reader, bounded in time.

``python -m experiments.twin_serve_soak [--connections 1000] [--tokens 32] [--time-scale 5]
[--slow-seconds 20] [--timeout 100] [--seed 0]``

Starts ``python -m twin serve`` in its own process on 127.0.0.1 (port 0, loopback only) with 8
dummy PEFT adapters (``--max-loras 8``), then, from one aiohttp client process:

- a **slow reader**: one raw socket (receive buffer 4 KiB) asks for a streamed completion of
  4,000 tokens and reads 256 bytes every 0.2 s for ``--slow-seconds`` wall seconds, then hangs
  up (the server must keep serving everyone else while that response's socket is full, and abort
  the request when it goes away, as vLLM does);
- **``--connections`` concurrent streamed completions**, all sent at once on their own
  connections (``TCPConnector(limit=0)``), ``--tokens`` tokens each with ``ignore_eos``,
  100-token token-id prompts, spread over the adapters and the base model.

It prints one line per phase and a last line: requests served / sent, errors (non-200 answers,
short streams, exceptions, time-outs), the most connections in flight, p50/p99 end-to-end and
first-token latency measured by the client (wall seconds x ``--time-scale`` = twin seconds), the
same p99 by the server's twin (``twin_timing``), the server's largest lag behind its scaled clock
(``twin:virtual_clock_lag_seconds``, twin seconds), whether the slow reader's request was aborted
(``vllm:num_requests_running`` back to 0), and the wall time. Everything is bounded by
``--timeout`` wall seconds (default 100, under two minutes with start-up); exit 1 when any request
failed or the run timed out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from twin.cli_support import float_above, int_at_least, positive_int, seed_type

from .twin_serve_load import _make_adapters

N_ADAPTERS = 8
PROMPT_TOKENS = 100
SLOW_TOKENS = 4000


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, need))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def _slow_reader(host: str, port: int, seconds: float, stats: dict) -> None:
    """One streamed request read 256 bytes every 0.2 s, then dropped."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({"model": "a0", "prompt": [7] * PROMPT_TOKENS, "max_tokens": SLOW_TOKENS,
                       "ignore_eos": True, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body)
    await writer.drain()
    t_end = time.monotonic() + seconds
    got = 0
    while time.monotonic() < t_end:
        chunk = await reader.read(256)
        if not chunk:
            break
        got += len(chunk)
        await asyncio.sleep(0.2)
    stats["slow_bytes"] = got
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass


async def _one(s, url: str, i: int, tokens: int, scale: float, state: dict, out: list) -> None:
    model = f"a{i % N_ADAPTERS}" if i % 5 else "base"
    start = time.monotonic()
    state["in_flight"] += 1
    state["peak"] = max(state["peak"], state["in_flight"])
    first = None
    timing = None
    n = 0
    try:
        async with s.post(url + "/v1/completions", json={
                "model": model, "prompt": [7] * PROMPT_TOKENS, "max_tokens": tokens,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            if r.status != 200:
                out.append({"error": f"HTTP {r.status}"})
                return
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                if first is None:
                    first = time.monotonic()
                if b'"twin_timing"' in line:
                    timing = json.loads(line[6:])["twin_timing"]
                else:
                    n += 1
        end = time.monotonic()
        if n != tokens or timing is None:
            out.append({"error": f"short stream: {n} of {tokens} tokens"})
            return
        out.append({"e2e_client": (end - start) * scale, "ttft_client": (first - start) * scale,
                    "e2e_twin": timing["e2e_s"], "ttft_twin": timing["ttft_s"]})
    except Exception as e:                      # noqa: BLE001 - every failure is counted
        out.append({"error": type(e).__name__})
    finally:
        state["in_flight"] -= 1


async def _run(url: str, a, wall_left) -> dict:
    import aiohttp

    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    stats: dict = {}
    state = {"in_flight": 0, "peak": 0}
    results: list[dict] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as s:
        slow = asyncio.create_task(_slow_reader(host, int(port), a.slow_seconds, stats))
        await asyncio.sleep(0.5)                      # the slow reader's socket fills first
        t0 = time.monotonic()
        many = asyncio.gather(*[_one(s, url, i, a.tokens, a.time_scale, state, results)
                                for i in range(a.connections)])
        try:
            await asyncio.wait_for(many, max(1.0, wall_left() - 5))
            stats["timed_out"] = False
        except asyncio.TimeoutError:
            stats["timed_out"] = True
        stats["burst_wall"] = time.monotonic() - t0
        print(f"burst: {a.connections} streamed requests in {stats['burst_wall']:.1f} wall s, "
              f"most in flight {state['peak']}", flush=True)
        try:
            await asyncio.wait_for(slow, max(1.0, wall_left() - 3))
        except asyncio.TimeoutError:
            slow.cancel()
        print(f"slow reader: read {stats.get('slow_bytes', 0):,} bytes in {a.slow_seconds:g} s, "
              "then hung up", flush=True)
        running = None
        for _ in range(50):                           # the aborted request leaves the batch
            text = await (await s.get(url + "/metrics")).text()
            running = float(re.search(r"^vllm:num_requests_running\{.*\} (\S+)$", text, re.M)[1])
            if running == 0:
                break
            await asyncio.sleep(0.1)
        stats["lag"] = float(re.search(r"^twin:virtual_clock_lag_seconds\{.*\} (\S+)$", text,
                                       re.M)[1])
        stats["running_after"] = running
    stats["results"] = results
    stats["peak"] = state["peak"]
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.twin_serve_soak",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int_at_least(1, 5000), default=1000)
    ap.add_argument("--tokens", type=positive_int, default=32, help="output tokens per request")
    ap.add_argument("--time-scale", type=float_above(0.0, 1000.0), default=5.0)
    ap.add_argument("--slow-seconds", type=float_above(0.0, 60.0), default=20.0,
                    help="wall seconds the slow reader stays connected")
    ap.add_argument("--timeout", type=float_above(10.0, 115.0), default=100.0,
                    help="wall seconds for the whole run (server start-up included)")
    ap.add_argument("--seed", type=seed_type, default=0)
    a = ap.parse_args(argv)

    t_start = time.monotonic()

    def wall_left() -> float:
        return a.timeout - (time.monotonic() - t_start)

    _raise_fd_limit(a.connections + 256)
    with tempfile.TemporaryDirectory() as tmp:
        mods = _make_adapters(Path(tmp), N_ADAPTERS)
        proc = subprocess.Popen(
            [sys.executable, "-m", "twin", "serve", "--host", "127.0.0.1", "--port", "0",
             "--served-model-name", "base", "--enable-lora", "--max-loras", str(N_ADAPTERS), "--max-lora-rank", "16",
             "--time-scale", str(a.time_scale), "--seed", str(a.seed), "--lora-modules", *mods],
            stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda: _raise_fd_limit(a.connections + 256))
        try:
            line = proc.stdout.readline()
            if line.startswith("GPU KV cache size"):
                line = proc.stdout.readline()
            m = re.fullmatch(r"listening on (\S+)\n", line)
            if not m:
                print(f"error: twin serve did not start: {line!r}", file=sys.stderr)
                return 2
            stats = asyncio.run(_run(m[1], a, wall_left))
        finally:
            proc.terminate()
            proc.wait(15)
    wall = time.monotonic() - t_start
    res = stats["results"]
    ok = [r for r in res if "error" not in r]
    errors = len(res) - len(ok) + (a.connections - len(res))
    kinds: dict[str, int] = {}
    for r in res:
        if "error" in r:
            kinds[r["error"]] = kinds.get(r["error"], 0) + 1
    if errors:
        print("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
              + (f", not finished x{a.connections - len(res)}" if len(res) < a.connections
                 else ""))

    def pct(key: str, q: float) -> float:
        return float(np.percentile([r[key] for r in ok], q)) if ok else float("nan")

    aborted = "yes" if stats.get("running_after") == 0 else f"no ({stats.get('running_after')})"
    print(f"soak: served {len(ok)}/{a.connections}, errors {errors}, most in flight "
          f"{stats['peak']}; client e2e p50 {pct('e2e_client', 50):.3f} p99 "
          f"{pct('e2e_client', 99):.3f} twin s (server's twin p99 {pct('e2e_twin', 99):.3f}), "
          f"TTFT p99 {pct('ttft_client', 99):.3f} (twin {pct('ttft_twin', 99):.3f}); "
          f"virtual-clock lag {stats['lag']:.3f} twin s; slow reader aborted {aborted}; "
          f"--time-scale {a.time_scale:g}, wall {wall:.1f} s"
          + ("; TIMED OUT" if stats.get("timed_out") else ""))
    return 0 if errors == 0 and not stats.get("timed_out") else 1


if __name__ == "__main__":
    sys.exit(main())
