"""Placement speed: greedy on large instances and twin verification of a 100-GPU placement.

``python -m experiments.placement_speed [--instance FILE] [--gpus 100] [--duration 3600]``

1. Greedy (no verification) on ``instances/large/large-llama-n10000.json`` (and the other large
   instances with ``--all``): wall seconds of the placement itself, best of ``--repeats``, after a
   warm-up that compiles / loads the surrogate.
2. Verification: the first ``--gpus`` GPUs of greedy's placement of the largest instance (or of
   the given one; when it has fewer GPUs, copies of its GPUs with renamed adapters) replayed in the fleet twin for ``--duration`` simulated seconds with every core
   (``os.cpu_count()`` worker processes); wall seconds end to end (including process start-up).

Last line: ``greedy_10000_s=<s> verify_<n>gpu_s=<s> cores=<k>``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

from optim.greedy import greedy_plans
from optim.instance import load_instance
from optim.methods import solve
from optim.placement import Placement
from optim.verify import verify

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "instances" / "large" / "large-llama-n10000.json"


def time_greedy(path: Path, repeats: int) -> tuple[float, list]:
    """Best wall time of the ``greedy`` method without verification (pre-checks, packing and
    the shrink step, as ``python -m optim solve --no-verify`` runs it) and its GPUs."""
    inst = load_instance(path)
    greedy_plans(inst, inst.adapters[:50], "gpus")              # warm-up (model load, JIT)
    best, plans = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plans = list(solve(inst, "greedy", verify=False).gpus)
        best = min(best, time.perf_counter() - t0)
    return best, plans


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.placement_speed")
    p.add_argument("--instance", default=str(DEFAULT))
    p.add_argument("--all", action="store_true", help="time greedy on every instances/large file")
    p.add_argument("--gpus", type=int, default=100)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    if a.gpus < 1 or a.duration <= 0 or a.repeats < 1:
        raise SystemExit("error: --gpus and --repeats must be >= 1 and --duration > 0")
    main_path = Path(a.instance)
    paths = sorted((REPO / "instances" / "large").glob("*.json")) if a.all else []
    if main_path.resolve() not in {q.resolve() for q in paths}:
        paths.append(main_path)
    results = {}
    for path in paths:
        if not path.exists():
            raise SystemExit(f"error: --instance: file not found: {path}")
        t, plans = time_greedy(path, a.repeats)
        inst = load_instance(path)
        results[path.resolve()] = (t, plans, inst)
        print(f"greedy {path.name}: adapters={len(inst.adapters)} gpus={len(plans)} "
              f"placement_wall_s={t:.3f}")
    t_main, plans, inst = results[main_path.resolve()]
    sub = list(plans[:a.gpus])
    copy = 1
    while len(sub) < a.gpus:   # fewer GPUs than asked: add copies with renamed adapters
        for g in plans[:a.gpus - len(sub)]:
            sub.append(replace(g, adapters=tuple((replace(x, id=f"{x.id}#{copy}"), s)
                                                 for x, s in g.adapters)))
        copy += 1
    placement = Placement(inst.name, "greedy", "solved", tuple(sub))
    cores = os.cpu_count() or 1
    t0 = time.perf_counter()
    # verification of a subset: shares are complete per adapter (no splits), so check per GPU
    sub_inst = replace(inst, adapters=tuple(x for g in sub for x, _ in g.adapters))
    v = verify(placement, sub_inst, duration_s=a.duration, workers=cores)
    wall = time.perf_counter() - t0
    bad = sum(1 for g in v.gpus if not g.verified.ok)
    print(f"verify: gpus={len(sub)} simulated_s={a.duration:.0f} wall_s={wall:.1f} "
          f"cores={cores} twin_rejected_gpus={bad}")
    print(f"greedy_{len(inst.adapters)}_s={t_main:.3f} verify_{len(sub)}gpu_s={wall:.1f} "
          f"cores={cores}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
