"""Whole-process time of ``python -m twin run``: start-up (imports, numba cache, length model)
plus the simulation, as a user experiences it.

Runs each command once to warm the caches (numba's compiled kernel, the ShareGPT scales), then
``--repeats`` times, and prints the median wall time, the median CPU time (user + system of the
child, less sensitive to other jobs on a shared machine), the machine's core count and its load
average, and whether the targets hold (defaults <= 1.5 s, ``--amax 16 --adapters 64`` <= 1.0 s).

    python -m experiments.cli_startup [--repeats 5]

Last line: ``startup_default_s=... startup_light_s=...`` (median wall seconds).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "default": ([], 1.5),
    "light": (["--amax", "16", "--adapters", "64"], 1.0),
}


def time_process(args: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one ``python -m twin run ARGS``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "twin", "run", *args], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def reference_loop_s(repeats: int = 3) -> float:
    """Median seconds of a fixed pure-Python loop (``sum(range(3e7))``) in this process: the
    machine's speed at the time of the measurement, to compare figures taken on different days
    (on this repository's shared 2-core VM it has varied between runs by about 1.5x)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sum(range(30_000_000))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per command (after one "
                                                           "warm-up run)")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {a.repeats}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} (1 min) "
          "at start")
    medians = {}
    for name, (args, target) in COMMANDS.items():
        time_process(args)                                   # warm-up: caches
        runs = [time_process(args) for _ in range(a.repeats)]
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        medians[name] = wall
        cmd = " ".join(["python -m twin run", *args])
        print(f"{cmd:<45} median wall {wall:.2f} s, median CPU {cpu:.2f} s over {a.repeats} runs "
              f"(target <= {target:g} s: {'met' if wall <= target else 'NOT met'})")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at end; reference loop "
          f"{reference_loop_s():.3f} s (sum(range(3e7)), the machine's speed now)")
    print(f"startup_default_s={medians['default']:.3f} startup_light_s={medians['light']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
