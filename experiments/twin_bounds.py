"""Twin-sound lower bounds on GPU counts, per paper instance, and the measured limits behind them.

``python -m experiments.twin_bounds [--quick] [--duration S] [--instances DIR] [--csv OUT]``

For every instance (``--quick``: the subset ``experiments.gpu_savings --quick`` runs, with its
600 s window) prints ``optim.feasibility.twin_lower_bound``: the one-adapter bound, the
adapter-count-aware bound, the per-GPU caps, and the carry limits measured for them
(``optim.capacity.carry_limit``: per-seed limits, their spread and the margin taken). The
measurements are cached on disk, so running this first makes ``experiments.gpu_savings``
start with warm bounds. Ends with ``points=<n> by_count_tighter=<k>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from optim.capacity import carry_limit
from optim.feasibility import _type_rank, twin_lower_bound
from optim.instance import load_instance

from .gpu_savings import PAPER_DIR, select_instances


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
    a = ap.parse_args(argv)
    if a.duration is not None and not a.duration > 0:
        print(f"error: --duration must be > 0, got {a.duration}", file=sys.stderr)
        return 2
    paths = select_instances(sorted(Path(a.instances).glob("paper-*.json")), a.quick)
    if not paths:
        print(f"error: no paper instances under {a.instances}", file=sys.stderr)
        return 2
    rows = []
    for path in tqdm(paths, desc="instances", unit="inst"):
        inst = load_instance(path)
        dur = a.duration if a.duration is not None else (600.0 if a.quick else inst.duration_s)
        b = twin_lower_bound(inst, dur, a.workers)
        rows.append({"instance": inst.name, "duration_s": dur, "load_tps": round(b.load_tps),
                     "max_adapter_tps": round(b.max_adapter_tps),
                     "gpu_cap_tps": round(b.gpu_cap_tps), "count_cap_tps": round(b.count_cap_tps),
                     "lb_one": b.one_adapter, "lb_by_count": b.by_count, "lb": b.best,
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
        b = twin_lower_bound(inst, dur, a.workers)
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
