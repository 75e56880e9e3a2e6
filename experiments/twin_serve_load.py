"""``twin serve`` under load: does a client see the twin's timing, and does the server keep up?

``python -m experiments.twin_serve_load [--time-scale 10] [--duration 120] [--adapters 16]
[--rate 0.5] [--max-loras 8] [--seed 0] [--plot results/twin_serve_load.png]``

Starts ``python -m twin serve`` in its own process on 127.0.0.1 (port 0) with ``--adapters``
dummy PEFT adapters (ranks 8 and 16 alternating), then an aiohttp client sends a seeded Poisson
stream (``--rate`` req/s per adapter, in twin seconds) of streamed completions for ``--duration``
twin seconds: token-id prompts and ``ignore_eos`` outputs drawn from the twin's ShareGPT-like
length model. For every request it compares what the client measured (wall seconds x
``--time-scale``: time to the first token chunk, time to ``[DONE]``) with what the server's twin
says (``twin_timing`` of the usage chunk). Prints the request count, the most requests in flight,
the server's largest lag behind the scaled clock (``twin:virtual_clock_lag_seconds``), and the
client-minus-twin differences (median, p95, max; twin seconds and % of the twin's value).
The difference is the wall overhead of client + HTTP, multiplied by the time scale.
For 1,000 concurrent connections and a slow reader see ``experiments.twin_serve_soak``.

``--engine-only`` skips HTTP: the same workload goes through the online engine in pure virtual
time (:func:`twin.serve.engine.replay`), and the script prints its speed in twin seconds per
wall second, the ceiling of ``--time-scale`` that the engine itself allows on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from twin.cli_support import float_above, positive_int, progress, seed_type
from twin.sharegpt import default_lengths


def _make_adapters(root: Path, n: int) -> list[str]:
    mods = []
    for i in range(n):
        p = root / f"a{i}"
        p.mkdir()
        (p / "adapter_config.json").write_text(json.dumps({"r": (8, 16)[i % 2]}))
        mods.append(f"a{i}={p}")
    return mods


async def _client(url: str, schedule, scale: float, quiet: bool) -> tuple[list[dict], int, float]:
    import aiohttp

    results: list[dict] = []
    in_flight = peak = 0
    bar = progress(total=len(schedule), desc="requests", quiet=quiet, unit="req")

    async def one(s, t_send, model, prompt_len, out_len):
        nonlocal in_flight, peak
        await asyncio.sleep(max(0.0, t_send - (time.monotonic() - t0)))
        in_flight += 1
        peak = max(peak, in_flight)
        start = time.monotonic()
        first = None
        timing = None
        async with s.post(url + "/v1/completions", json={
                "model": model, "prompt": [7] * prompt_len, "max_tokens": out_len,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                if first is None:
                    first = time.monotonic()
                if b'"twin_timing"' in line:
                    timing = json.loads(line[6:])["twin_timing"]
        end = time.monotonic()
        in_flight -= 1
        bar.update(1)
        results.append({"ttft_client": (first - start) * scale, "e2e_client": (end - start) * scale,
                        "ttft_twin": timing["ttft_s"], "e2e_twin": timing["e2e_s"]})

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        t0 = time.monotonic()
        await asyncio.gather(*[one(s, *x) for x in schedule])
        metrics = await (await s.get(url + "/metrics")).text()
    bar.close()
    lag = float(re.search(r"^twin:virtual_clock_lag_seconds\{.*\} (\S+)$", metrics, re.M)[1])
    return results, peak, lag


def _engine_only(a, arrival, models, ins, outs) -> int:
    from twin.profile import load_profile
    from twin.serve.engine import EngineSettings, replay

    prof = load_profile("llama-3.1-8b-instruct")
    settings = EngineSettings.from_profile(prof, a.max_loras, 16)
    load = [prof.load_time_ms((8, 16)[i % 2], 16) for i in range(a.adapters)]
    t0 = time.perf_counter()
    first, finish = replay(settings, arrival, models, ins, outs, load)
    wall = time.perf_counter() - t0
    end = float(finish.max())
    print(f"engine only: {len(arrival)} requests over {a.duration:g} twin s ({a.adapters} "
          f"adapters x {a.rate:g} req/s, --max-loras {a.max_loras}, seed {a.seed}); all done at "
          f"{end:.1f} twin s after {wall:.2f} wall s = {end / wall:.0f} twin s per wall second")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.twin_serve_load",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-scale", type=float_above(0.0), default=10.0)
    ap.add_argument("--duration", type=float_above(0.0), default=120.0,
                    help="twin seconds of arrivals")
    ap.add_argument("--adapters", type=positive_int, default=16)
    ap.add_argument("--rate", type=float_above(0.0), default=0.5,
                    help="req/s per adapter (twin time)")
    ap.add_argument("--max-loras", type=positive_int, default=8)
    ap.add_argument("--seed", type=seed_type, default=0)
    ap.add_argument("--plot", default=None, help="save client-vs-twin scatter plots here (PNG)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--engine-only", action="store_true",
                    help="time the engine alone in virtual time (no HTTP, no wall clock)")
    a = ap.parse_args(argv)

    rng = np.random.default_rng(a.seed)
    total_rate = a.rate * a.adapters
    n = int(rng.poisson(total_rate * a.duration))
    arrivals = np.sort(rng.uniform(0, a.duration, n)) / a.time_scale      # wall seconds
    ins, outs = default_lengths().sample(n, rng)
    models = rng.integers(0, a.adapters, n)
    schedule = [(float(t), f"a{m}", int(i), int(o)) for t, m, i, o in
                zip(arrivals, models, ins, outs)]
    if a.engine_only:
        return _engine_only(a, arrivals * a.time_scale, models, ins, outs)
    with tempfile.TemporaryDirectory() as tmp:
        mods = _make_adapters(Path(tmp), a.adapters)
        proc = subprocess.Popen(
            [sys.executable, "-m", "twin", "serve", "--port", "0", "--enable-lora",
             "--max-loras", str(a.max_loras), "--max-cpu-loras", str(max(a.adapters, a.max_loras)),
             "--max-lora-rank", "16", "--time-scale", str(a.time_scale), "--seed", str(a.seed),
             "--lora-modules", *mods], stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            if line.startswith("GPU KV cache size"):       # vLLM's start-up line comes first
                line = proc.stdout.readline()
            m = re.fullmatch(r"listening on (\S+)\n", line)
            if not m:
                print(f"error: twin serve did not start: {line!r}", file=sys.stderr)
                return 2
            t0 = time.monotonic()
            res, peak, lag = asyncio.run(_client(m[1], schedule, a.time_scale, a.quiet))
            wall = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(15)
    print(f"twin serve load: {n} streamed requests over {a.duration:g} twin s "
          f"({a.adapters} adapters x {a.rate:g} req/s, --max-loras {a.max_loras}), "
          f"--time-scale {a.time_scale:g}, seed {a.seed}; wall {wall:.1f} s; "
          f"most in flight {peak}; server lag behind the scaled clock at most {lag:.3f} twin s")
    print(f"{'client - twin':16s} {'median':>9s} {'p95':>9s} {'max':>9s}   (twin seconds; "
          "% of the twin's value)")
    for key in ("ttft", "e2e"):
        c = np.array([r[f"{key}_client"] for r in res])
        t = np.array([r[f"{key}_twin"] for r in res])
        d = c - t
        rel = d / np.maximum(t, 1e-9) * 100
        print(f"{key:16s} {np.median(d):9.4f} {np.percentile(d, 95):9.4f} {d.max():9.4f}   "
              f"({np.median(rel):.2f} %, {np.percentile(rel, 95):.2f} %, {rel.max():.2f} %)")
    mean_c = np.mean([r["e2e_client"] for r in res])
    mean_t = np.mean([r["e2e_twin"] for r in res])
    print(f"mean e2e: client {mean_c:.3f} s, twin {mean_t:.3f} s "
          f"({(mean_c / mean_t - 1) * 100:+.2f} %)")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        for ax, key in zip(axes, ("ttft", "e2e")):
            t = [r[f"{key}_twin"] for r in res]
            ax.scatter(t, [r[f"{key}_client"] for r in res], s=6)
            hi = max(max(t), max(r[f"{key}_client"] for r in res))
            ax.plot([0, hi], [0, hi], "k--", lw=0.8)
            ax.set_xlabel(f"{key} by the twin (s)")
            ax.set_ylabel(f"{key} measured by the client x time scale (s)")
        fig.suptitle(f"twin serve, --time-scale {a.time_scale:g}, {n} requests")
        fig.tight_layout()
        Path(a.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(a.plot, dpi=120)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
