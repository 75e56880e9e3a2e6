"""Twin speed: wall seconds per simulated hour and real-time factor on one core.

``python -m experiments.twin_speed [--duration 3600] [--repeats 3] [--json OUT]``

Three named Llama configurations (rank 16, ShareGPT-like lengths, Poisson arrivals):
light (Amax 16, 64 adapters at 0.1/0.05/0.025 req/s), heavy (Amax 32, 384 adapters at
0.1/0.05/0.025) and overloaded (Amax 128, 192 adapters at 1.6/0.8/0.4). The kernel is compiled
(and cached) by a short warm-up run first; wall time is the kernel's own (``wall_s``), the best of
``--repeats``. Memory is the process's peak resident set (``ru_maxrss``) after each configuration.
"""

from __future__ import annotations

import argparse
import json
import resource
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.twin_speed")
    p.add_argument("--profile", default="llama-3.1-8b-instruct")
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    prof = load_profile(a.profile)
    warm = adapters_from_cycles(4, [16], [0.5])
    simulate_server(prof, warm, ServerConfig(max_loras=2), 10.0)   # compile / load cache
    print(f"after warm-up: peak RSS {peak_rss_mb():.0f} MB")
    rows = []
    for name, c in CONFIGS.items():
        adapters = adapters_from_cycles(c["n"], [16], list(c["rates"]))
        best, total_t = None, None
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            m = simulate_server(prof, adapters, ServerConfig(max_loras=c["amax"]), a.duration,
                                seed=rep)
            total = time.perf_counter() - t0
            if best is None or m.wall_s < best.wall_s:
                best, total_t = m, total
        per_hour = best.wall_s * 3600.0 / a.duration
        rows.append({"config": name, "amax": c["amax"], "adapters": c["n"],
                     "arrived_requests": best.arrived_requests, "steps": best.steps,
                     "kernel_wall_s": best.wall_s, "end_to_end_wall_s": total_t,
                     "wall_s_per_sim_hour": per_hour,
                     "real_time_factor": a.duration / best.wall_s,
                     "peak_rss_mb": peak_rss_mb()})
        print(f"{name:>10}: amax={c['amax']:<4} adapters={c['n']:<4} "
              f"requests={best.arrived_requests:<8} steps={best.steps:<8} "
              f"kernel={best.wall_s:.3f}s end_to_end={total_t:.3f}s "
              f"per_sim_hour={per_hour:.3f}s rtf={a.duration / best.wall_s:.0f}x "
              f"peak_rss={peak_rss_mb():.0f}MB")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    heavy = next(r for r in rows if r["config"] == "heavy")
    print(f"heavy_wall_s_per_sim_hour={heavy['wall_s_per_sim_hour']:.3f} "
          f"heavy_real_time_factor={heavy['real_time_factor']:.0f} "
          f"peak_rss_mb={max(r['peak_rss_mb'] for r in rows):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
