"""Twin speed: wall seconds per simulated hour and real-time factor on one core.

``python -m experiments.twin_speed [--duration 3600] [--repeats 3] [--json OUT]``

Three named Llama configurations (rank 16, ShareGPT-like lengths, Poisson arrivals):
light (Amax 16, 64 adapters at 0.1/0.05/0.025 req/s), heavy (Amax 32, 384 adapters at
0.1/0.05/0.025) and overloaded (Amax 128, 192 adapters at 1.6/0.8/0.4). The kernel is compiled
(and cached) by a short warm-up run first; wall time is the kernel's own (``wall_s``), the best of
``--repeats``. Each configuration runs in its own fresh process, so its memory figure is that
process's peak resident set (``ru_maxrss``: Python, numpy, numba and the simulation together).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from twin.profile import load_profile
from twin.server import ServerConfig, simulate_server
from twin.workload import adapters_from_cycles

CONFIGS = {
    "light": dict(amax=16, n=64, rates=(0.1, 0.05, 0.025)),
    "heavy": dict(amax=32, n=384, rates=(0.1, 0.05, 0.025)),
    "overloaded": dict(amax=128, n=192, rates=(1.6, 0.8, 0.4)),
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(name: str, profile: str, duration: float, repeats: int) -> dict:
    """Time one named configuration in this process (after a warm-up that loads the cache)."""
    prof = load_profile(profile)
    warm = adapters_from_cycles(4, [16], [0.5])
    simulate_server(prof, warm, ServerConfig(max_loras=2), 10.0)   # compile / load cache
    c = CONFIGS[name]
    adapters = adapters_from_cycles(c["n"], [16], list(c["rates"]))
    best, total_t = None, None
    for rep in range(repeats):
        t0 = time.perf_counter()
        m = simulate_server(prof, adapters, ServerConfig(max_loras=c["amax"]), duration, seed=rep)
        total = time.perf_counter() - t0
        if best is None or m.wall_s < best.wall_s:
            best, total_t = m, total
    return {"config": name, "amax": c["amax"], "adapters": c["n"],
            "arrived_requests": best.arrived_requests, "steps": best.steps,
            "kernel_wall_s": best.wall_s, "end_to_end_wall_s": total_t,
            "wall_s_per_sim_hour": best.wall_s * 3600.0 / duration,
            "real_time_factor": duration / best.wall_s, "peak_rss_mb": peak_rss_mb()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.twin_speed")
    p.add_argument("--profile", default="llama-3.1-8b-instruct")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--only", choices=sorted(CONFIGS), default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.duration <= 0 or a.repeats < 1:
        raise SystemExit("error: --duration must be > 0 and --repeats >= 1")
    if a.only:   # child process: one configuration, JSON on stdout
        print(json.dumps(measure(a.only, a.profile, a.duration, a.repeats)))
        return 0
    rows = []
    for name in CONFIGS:
        out = subprocess.run([sys.executable, "-m", "experiments.twin_speed", "--only", name,
                              "--profile", a.profile, "--duration", str(a.duration),
                              "--repeats", str(a.repeats)], capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"{name:>10}: amax={r['amax']:<4} adapters={r['adapters']:<4} "
              f"requests={r['arrived_requests']:<8} steps={r['steps']:<8} "
              f"kernel={r['kernel_wall_s']:.3f}s end_to_end={r['end_to_end_wall_s']:.3f}s "
              f"per_sim_hour={r['wall_s_per_sim_hour']:.3f}s rtf={r['real_time_factor']:.0f}x "
              f"peak_rss={r['peak_rss_mb']:.0f}MB")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    heavy = next(r for r in rows if r["config"] == "heavy")
    print(f"heavy_wall_s_per_sim_hour={heavy['wall_s_per_sim_hour']:.3f} "
          f"heavy_real_time_factor={heavy['real_time_factor']:.0f} "
          f"heavy_peak_rss_mb={heavy['peak_rss_mb']:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
