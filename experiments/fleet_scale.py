"""Fleet-scale verification: plan 10,000 adapters onto ~1,000 GPUs and verify the plan in the twin.

``python -m experiments.fleet_scale [--gpus 1000] [--adapters 10000] [--seed 0] [--duration 3600]
[--backend local|ray] [--address A] [--workers W] [--sample 24] [--json OUT]``

1. Instance (seeded, ``numpy.random.default_rng(seed)``): ``--adapters`` adapters on
   Llama-3.1-8B / H100, ranks 8/16/32 (50/30/20 %), log-normal(0, 1) rates, each adapter capped at
   half a GPU's nominal load so no adapter needs replication; the total rate is sized so that
   greedy opens ``--gpus`` GPUs.
2. Plan: the ``greedy`` method without twin verification (fast surrogate, as ``python -m optim
   solve --no-verify``). Greedy's GPU count is a step function of the total rate, so the total is
   rescaled by target / GPUs, then bisected, and the plan redone (at most 10 rounds,
   deterministic); the time of the final plan (``plan_s``) and of all rounds
   (``calibration_s``) are reported separately.
3. Verify: ``optim.verify.verify`` on the whole plan (every GPU replayed for ``--duration``
   simulated seconds with seed ``seed + g``) on ``--backend`` (local processes, or Ray tasks on a
   local Ray instance or the cluster at ``--address``); ``verify_s`` is wall time end to end,
   including process / Ray start-up.
4. Where the time goes: ``--sample`` GPUs of the plan (evenly spaced) are rerun in this process
   with the verification's seeds, timing workload generation, the compiled kernel and the
   metrics separately (their throughput must equal the verification's: a consistency check);
   the start-up of a fresh pool is timed on tiny jobs. Memory: the peak RSS of this process and
   of the largest worker (local backend).

Last line: ``gpus=<n> adapters=<m> verify_s=<s> backend=<b>``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from optim.generate import MEAN_LENGTHS, NOMINAL_CAPACITY_TPS
from optim.instance import GpuType, Instance, SolverLimits
from optim.methods import solve
from optim.placement import Placement
from optim.verify import verify
from twin.fleet import BACKENDS, FleetBackendError, GpuAssignment, check_backend, simulate_fleet
from twin.sharegpt import default_lengths
from twin.profile import load_profile
from twin.server import ServerConfig, simulate_requests
from twin.workload import Adapter, generate_requests, offered_token_rate

PROFILE = "llama-3.1-8b-instruct"
RANKS, RANK_P = (8, 16, 32), (0.5, 0.3, 0.2)
ADAPTER_CAP = 0.5               # no adapter offers more than half a GPU's nominal load
FIRST_GUESS_TPS = 15_500.0      # requested tok/s per GPU of the first round (capping cuts ~7 %)
MAX_ROUNDS = 10


def make_instance(n_adapters: int, total_rate: float, seed: int, duration_s: float,
                  pool: int) -> Instance:
    """The seeded instance (module docstring): the same seed gives the same ranks and rate
    weights for any ``total_rate``."""
    rng = np.random.default_rng(seed)
    ranks = rng.choice(RANKS, size=n_adapters, p=RANK_P)
    w = rng.lognormal(0.0, 1.0, n_adapters)
    lengths = default_lengths()
    cap = ADAPTER_CAP * NOMINAL_CAPACITY_TPS / (lengths.mean_input + lengths.mean_output)
    rates = np.minimum(w / w.sum() * total_rate, cap)
    ads = tuple(Adapter(f"a{i}", int(ranks[i]), float(round(rates[i], 6)))
                for i in range(n_adapters))
    return Instance(name=f"fleet-scale-n{n_adapters}-s{seed}", adapters=ads,
                    gpu_types=(GpuType("h100", PROFILE, pool, 2.5),), lengths=lengths,
                    lengths_spec=dict(MEAN_LENGTHS), solver=SolverLimits(time_limit_s=300.0),
                    duration_s=duration_s, seed=seed,
                    description=f"{n_adapters} adapters, log-normal rates, ranks 8/16/32")


def plan_fleet(n_gpus: int, n_adapters: int, seed: int, duration_s: float, log=print
               ) -> tuple[Instance, Placement, float, float, int]:
    """Greedy (no twin) plans, rescaling the requested total rate until greedy opens ``n_gpus``
    GPUs: proportional steps until the target is bracketed, then bisection (greedy's GPU count
    is a step function of the rate, so the closest plan is kept when no round hits it).
    Returns the instance, the plan, the final plan's wall s, all rounds' wall s, rounds."""
    mean_tok = MEAN_LENGTHS["mean_input"] + MEAN_LENGTHS["mean_output"]
    total = n_gpus * FIRST_GUESS_TPS / mean_tok
    lo = hi = None                       # requested totals that gave too few / too many GPUs
    tried: dict[int, tuple] = {}
    t_all = time.perf_counter()
    for rnd in range(1, MAX_ROUNDS + 1):
        inst = make_instance(n_adapters, total, seed, duration_s, pool=4 * n_gpus)
        t0 = time.perf_counter()
        p = solve(inst, "greedy", verify=False)
        plan_s = time.perf_counter() - t0
        if p.status != "solved" or not p.gpus:
            raise SystemExit(f"error: greedy returned status {p.status} for {n_adapters} "
                             f"adapters at {total:.1f} req/s")
        log(f"plan round {rnd}: requested_rate={total:.2f} req/s gpus={p.n_gpus} "
            f"plan_s={plan_s:.2f}")
        tried.setdefault(p.n_gpus, (inst, p, plan_s))
        if p.n_gpus == n_gpus:
            break
        if p.n_gpus < n_gpus:
            lo = total if lo is None else max(lo, total)
        else:
            hi = total if hi is None else min(hi, total)
        total = (lo + hi) / 2 if lo is not None and hi is not None else total * n_gpus / p.n_gpus
    best = min(tried, key=lambda g: (abs(g - n_gpus), g))
    inst, p, plan_s = tried[best]
    return inst, p, plan_s, time.perf_counter() - t_all, rnd


def time_sample(p: Placement, inst: Instance, duration_s: float, k: int) -> list[dict]:
    """Rerun ``k`` evenly spaced GPUs in this process with the verification's seeds; time
    workload generation, kernel and metrics of each."""
    idx = sorted({int(round(x)) for x in np.linspace(0, p.n_gpus - 1, k)}) if k > 0 else []
    rows = []
    for g in idx:
        gpu = p.gpus[g]
        prof = load_profile(gpu.profile)
        # in the twin's order (id order), as verification draws them
        adapters = [replace(a, rate=a.rate * s)
                    for a, s in gpu.twin_assignment(inst.judging).adapters]
        cfg = gpu.server_config(inst.judging)
        c0, t0 = time.process_time(), time.perf_counter()
        req = generate_requests(adapters, duration_s, inst.lengths, seed=inst.seed + g)
        t1 = time.perf_counter()
        m = simulate_requests(prof, adapters, req, cfg, duration_s,
                              offered_token_rate(adapters, inst.lengths))
        t2 = time.perf_counter()
        rows.append({"gpu": g, "requests": len(req), "workload_s": t1 - t0,
                     "kernel_s": m.wall_s, "metrics_s": (t2 - t1) - m.wall_s,
                     "cpu_s": time.process_time() - c0,
                     "throughput_tps": m.throughput_tps,
                     "verified_tps": gpu.verified.throughput_tps if gpu.verified else None})
    return rows


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def pool_startup_s(backend: str, address: str | None, workers: int) -> float:
    """Wall s for a fresh pool to return ``workers`` one-second jobs (start-up and first
    kernel load, no real work)."""
    a = Adapter("startup", 8, 0.5)
    jobs = [GpuAssignment(PROFILE, ServerConfig(max_loras=1), ((a, 1.0),))] * max(2, workers)
    t0 = time.perf_counter()
    simulate_fleet(jobs, duration_s=1.0, workers=workers, check_routing=False,
                   backend=backend, address=address)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.fleet_scale",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=1000, help="GPUs the plan should open")
    ap.add_argument("--adapters", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0, help="instance and twin workload seed")
    ap.add_argument("--duration", type=float, default=3600.0, help="twin window (s)")
    ap.add_argument("--backend", choices=BACKENDS, default="local")
    ap.add_argument("--address", default=None, help="--backend ray: Ray cluster address")
    ap.add_argument("--workers", type=int, default=None,
                    help="local processes / local Ray CPUs (default: all cores)")
    ap.add_argument("--sample", type=int, default=24,
                    help="GPUs rerun in-process to split the time (0: skip)")
    ap.add_argument("--json", default=None, help="write the figures to this JSON file")
    a = ap.parse_args(argv)
    for name, v, lo in (("--gpus", a.gpus, 1), ("--adapters", a.adapters, a.gpus),
                        ("--sample", a.sample, 0)):
        if v < lo:
            raise SystemExit(f"error: {name}: must be >= {lo}, got {v}")
    if not (np.isfinite(a.duration) and a.duration > 0):
        raise SystemExit(f"error: --duration: must be > 0, got {a.duration}")
    if not 0 <= a.seed < 2**32:
        raise SystemExit(f"error: --seed: must be in 0 .. 2^32-1, got {a.seed}")
    try:
        check_backend(a.backend, a.address, a.workers)
    except FleetBackendError as e:
        raise SystemExit(f"error: --{e.field}: {e.reason}") from None
    workers = a.workers or os.cpu_count() or 1
    out = {"load_avg_start": os.getloadavg()}
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in out['load_avg_start'])} "
          f"(cores={os.cpu_count()})")

    inst, p, plan_s, calib_s, rounds = plan_fleet(a.gpus, a.adapters, a.seed, a.duration)
    n_ad = sum(g.n_adapters for g in p.gpus)
    print(f"plan: greedy (fast surrogate, no twin) adapters={n_ad} gpus={p.n_gpus} "
          f"total_rate={sum(x.rate for x in inst.adapters):.1f} req/s "
          f"offered={inst.total_load_tps / 1e6:.2f} M tok/s plan_s={plan_s:.2f} "
          f"calibration_s={calib_s:.1f} rounds={rounds}")

    try:
        cpu0 = _cpu_s(resource.RUSAGE_CHILDREN), _cpu_s(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        v = verify(p, inst, duration_s=a.duration, workers=a.workers, backend=a.backend,
                   address=a.address)
        verify_s = time.perf_counter() - t0
        child_cpu = _cpu_s(resource.RUSAGE_CHILDREN) - cpu0[0]
        self_cpu = _cpu_s(resource.RUSAGE_SELF) - cpu0[1]
    except FleetBackendError as e:
        raise SystemExit(f"error: --{e.field}: {e.reason}") from None
    bad = sum(1 for g in v.gpus if not g.verified.ok)
    twin_tps = sum(g.verified.throughput_tps for g in v.gpus)
    out["load_avg_after_verify"] = os.getloadavg()
    where = "cluster" if a.address else workers
    print(f"verify: gpus={v.n_gpus} simulated_s={a.duration:g} backend={a.backend} "
          f"workers={where} verify_s={verify_s:.1f} verdict={v.verdict} "
          f"twin_rejected_gpus={bad} twin_throughput={twin_tps / 1e6:.2f} M tok/s")
    print(f"load average after verify: "
          f"{' '.join(f'{x:.2f}' for x in out['load_avg_after_verify'])}")
    out.update(driver_cpu_s=self_cpu, worker_cpu_s=child_cpu if a.backend == "local" else None)
    if a.backend == "local" and workers > 1:   # pool workers are children, reaped at shutdown
        print(f"cpu: workers {child_cpu:.1f} s, driver {self_cpu:.1f} s; on {workers} otherwise "
              f"idle cores the replay needs about {child_cpu / workers:.1f} s of wall time "
              f"(workers' CPU / cores; other processes' load only stretches the wall time)")

    rows = time_sample(v, inst, a.duration, a.sample)
    if rows:
        mean = {k: float(np.mean([r[k] for r in rows]))
                for k in ("workload_s", "kernel_s", "metrics_s", "requests", "cpu_s")}
        per_gpu = mean["workload_s"] + mean["kernel_s"] + mean["metrics_s"]
        busy = per_gpu * v.n_gpus / workers
        mismatch = sum(1 for r in rows if r["verified_tps"] is not None
                       and abs(r["throughput_tps"] - r["verified_tps"]) > 1e-6)
        start = pool_startup_s(a.backend, a.address, workers)
        print(f"time per GPU ({len(rows)} GPUs rerun in-process, {mean['requests']:.0f} "
              f"requests each on average): workload={mean['workload_s']:.3f} s "
              f"kernel={mean['kernel_s']:.3f} s metrics={mean['metrics_s']:.3f} s "
              f"total={per_gpu:.3f} s (cpu {mean['cpu_s']:.3f} s) "
              f"kernel_share={mean['kernel_s'] / per_gpu:.1%}")
        if not a.address:     # a cluster's CPU count is the cluster's business
            print(f"split of verify_s (from the sample's wall times, {workers} workers): GPU "
                  f"work {busy:.1f} s ({busy / verify_s:.1%}; kernel "
                  f"{busy * mean['kernel_s'] / per_gpu:.1f} s), other {verify_s - busy:.1f} s "
                  f"(pool start-up, scheduling, pickling, aggregation, idle cores at the end and "
                  f"other processes' load)")
        print(f"a fresh pool's start-up (tiny jobs): {start:.1f} s; rerun throughput differs "
              f"from the verification on {mismatch} of {len(rows)} GPUs")
        out.update(sample=rows, per_gpu_s=per_gpu, kernel_share=mean["kernel_s"] / per_gpu,
                   pool_startup_s=start, est_gpu_work_s=busy, sample_mismatch=mismatch)
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rss_child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"memory: driver_max_rss={rss_self:.0f} MB largest_local_worker_max_rss="
          f"{rss_child:.0f} MB")
    out.update(gpus=v.n_gpus, adapters=n_ad, seed=a.seed, duration_s=a.duration,
               backend=a.backend, address=a.address, workers=where, plan_s=plan_s,
               calibration_s=calib_s, rounds=rounds, verify_s=verify_s, verdict=v.verdict,
               twin_rejected_gpus=bad, driver_max_rss_mb=rss_self,
               worker_max_rss_mb=rss_child)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {a.json}")
    print(f"gpus={v.n_gpus} adapters={n_ad} verify_s={verify_s:.1f} backend={a.backend}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
