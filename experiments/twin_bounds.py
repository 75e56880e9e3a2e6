"""Twin-sound lower bounds on GPU counts, per paper instance, and the measured limits behind them.

``python -m experiments.twin_bounds [--quick] [--duration S] [--instances DIR] [--csv OUT]
[--pair-checks N]``
``python -m experiments.twin_bounds --adversarial N [--duration S] [--seed K]``

For every instance (``--quick``: the subset ``experiments.gpu_savings --quick`` runs, with its
600 s window) prints ``optim.feasibility.twin_lower_bound``: the one-adapter bound, the
adapter-count-aware bound, which replays raised it (one GPU, fullest GPU, busiest GPU, two-GPU
splits with up to ``--pair-checks`` GPU checks), the per-GPU caps, and the carry limits measured
for them
(``optim.capacity.carry_limit``: per-seed limits, their spread and the margin taken). The
measurements are cached on disk, so running this first makes ``experiments.gpu_savings``
start with warm bounds. Ends with ``points=<n> by_count_tighter=<k>``.

``--adversarial N`` instead samples N GPUs per profile (seeded by ``--seed``) built to beat the
one-adapter limit of the window ``--duration`` (default 3600 s): one hot rank-8 adapter with 0-3
colder ones of any rank, Amax 1-4, workload seeds 0-99 (beyond the 8 the limit is measured
with), offered 0.98-1.02 x the limit. Every GPU offered more than the limit must starve; it
prints, per profile, the limit and ``unstarved_above_limit=<k> largest_unstarved_ratio=<r>``
(largest offered / limit among unstarved GPUs), and ends with
``adversarial_unstarved_above_limit=<k>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd
from tqdm import tqdm

import numpy as np

from optim.capacity import BOUND_SEEDS, carry_limit
from twin.sharegpt import default_lengths
from twin.fleet import GpuAssignment, simulate_fleet
from twin.server import ServerConfig
from twin.workload import Adapter
from optim.feasibility import _type_rank, twin_lower_bound
from optim.instance import load_instance

from .gpu_savings import PAIR_CHECKS, PAPER_DIR, select_instances


PROFILES = ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct")


def adversarial(n: int, duration_s: float, seed: int, workers: int | None) -> int:
    """The ``--adversarial`` check (module docstring); returns the GPUs unstarved above."""
    lengths = default_lengths()
    per = lengths.mean_input + lengths.mean_output
    rng = np.random.default_rng(seed)
    bad_total = 0
    for prof in PROFILES:
        lim = carry_limit(prof, 8, 1, lengths, duration_s, tuple(range(BOUND_SEEDS)), 0.9,
                          workers)
        jobs, loads, seeds = [], [], []
        for _ in range(n):
            load = lim.limit_tps * rng.uniform(0.98, 1.02)
            cold = int(rng.integers(0, 4))
            hot = 1.0 if cold == 0 else rng.uniform(0.7, 1.0)
            ads = [Adapter("hot", 8, hot * load / per)]
            rank = int(rng.choice([8, 16, 32]))
            ads += [Adapter(f"c{i}", rank, (1 - hot) * load / per / cold) for i in range(cold)]
            cfg = ServerConfig(max_loras=int(rng.integers(1, 5)))
            jobs.append(GpuAssignment(prof, cfg, tuple((a, 1.0) for a in ads)))
            loads.append(load)
            seeds.append(int(rng.integers(0, 100)))
        res = simulate_fleet(jobs, duration_s=duration_s, lengths=lengths, workers=workers,
                             check_routing=False, seeds=seeds)
        ratios = [L / lim.limit_tps for L, m in zip(loads, res.per_gpu)
                  if not (m.starved or m.memory_error)]
        bad = sum(1 for r in ratios if r > 1.0)
        bad_total += bad
        print(f"{prof} window={duration_s:.0f}s limit={lim.limit_tps:.0f} tok/s "
              f"(per-seed {min(lim.per_seed_tps):.0f}-{max(lim.per_seed_tps):.0f}, "
              f"sd {lim.spread_tps:.1f}, Amax {lim.amax}) sampled={n} unstarved={len(ratios)} "
              f"unstarved_above_limit={bad} "
              f"largest_unstarved_ratio={max(ratios) if ratios else float('nan'):.4f}")
    return bad_total


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.twin_bounds",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the gpu_savings --quick subset with a 600 s window")
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window in s (default: 600 with --quick, else the instance's)")
    ap.add_argument("--instances", default=str(PAPER_DIR))
    ap.add_argument("--csv", default=None, help="write the per-instance table as CSV")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--pair-checks", type=int, default=PAIR_CHECKS,
                    help="GPU checks spent on two-GPU splits where two GPUs are left (0: skip)")
    ap.add_argument("--adversarial", type=int, default=None, metavar="N",
                    help="sample N adversarial GPUs per profile instead (module docstring)")
    ap.add_argument("--seed", type=int, default=0, help="--adversarial: sampling seed")
    a = ap.parse_args(argv)
    if a.duration is not None and not a.duration > 0:
        print(f"error: --duration must be > 0, got {a.duration}", file=sys.stderr)
        return 2
    if a.adversarial is not None:
        if a.adversarial < 1:
            print(f"error: --adversarial must be >= 1, got {a.adversarial}", file=sys.stderr)
            return 2
        bad = adversarial(a.adversarial, a.duration or 3600.0, a.seed, a.workers)
        print(f"adversarial_unstarved_above_limit={bad}")
        return 0
    if a.pair_checks < 0:
        print(f"error: --pair-checks must be >= 0, got {a.pair_checks}", file=sys.stderr)
        return 2
    paths = select_instances(sorted(Path(a.instances).glob("paper-*.json")), a.quick)
    if not paths:
        print(f"error: no paper instances under {a.instances}", file=sys.stderr)
        return 2
    rows = []
    for path in tqdm(paths, desc="instances", unit="inst"):
        inst = load_instance(path)
        dur = a.duration if a.duration is not None else (600.0 if a.quick else inst.duration_s)
        b = twin_lower_bound(inst, dur, a.workers, a.pair_checks)
        rows.append({"instance": inst.name, "duration_s": dur, "load_tps": round(b.load_tps),
                     "max_adapter_tps": round(b.max_adapter_tps),
                     "gpu_cap_tps": round(b.gpu_cap_tps), "count_cap_tps": round(b.count_cap_tps),
                     "lb_one": b.one_adapter, "lb_by_count": b.by_count,
                     "one_gpu_out": b.one_gpu_excluded, "fullest_to": b.fullest_excluded_to,
                     "busiest_to": b.busiest_excluded_to, "pair_out": b.two_gpus_excluded,
                     "lb": b.best,
                     "count_limits": " ".join(f"{n}:{v:.0f}" for n, v in b.count_limits)})
    df = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_rows", None,
                           "display.max_colwidth", 60):
        print(df.to_string(index=False))
    if a.csv:
        Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.csv, index=False)
    print("\ncarry limits measured (tok/s of expected offered load; limit = max(largest, mean + "
          "4 sd)):")
    seen = set()
    for path in paths:
        inst = load_instance(path)
        dur = a.duration if a.duration is not None else (600.0 if a.quick else inst.duration_s)
        b = twin_lower_bound(inst, dur, a.workers, a.pair_checks)
        for t in inst.gpu_types:
            r = _type_rank(inst, t)
            for n, _ in (b.count_limits if r is not None else ()):
                key = (t.profile, r, n, dur)
                if key in seen:
                    continue
                seen.add(key)
                c = carry_limit(t.profile, r, n, inst.lengths, dur,
                                tuple(inst.seed + g for g in range(8)),
                                inst.starvation_threshold, a.workers)
                print(f"  {t.profile} rank>={r} adapters={n} window={dur:.0f}s amax={c.amax} "
                      f"per_seed=[{', '.join(f'{v:.0f}' for v in c.per_seed_tps)}] "
                      f"sd={c.spread_tps:.1f} ({c.spread_tps / c.limit_tps * 100:.2f} %) "
                      f"limit={c.limit_tps:.0f}")
    print(f"points={len(df)} by_count_tighter={int((df['lb_by_count'] > df['lb_one']).sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
