"""Placement under latency SLOs: GPUs needed at three SLO levels against the 90 % rule.

``python -m experiments.slo_placement [--quick] [--methods greedy,loraserve] [--workers W]
[--out-dir DIR] [--store FILE] [--rebound] [--keep-bounds] [--class-checks N]
[--search-store FILE] [--status]``

For each paper instance (``--quick``: the Llama scenarios at their 2nd and 4th smallest adapter
counts, 600 s twin window; else every paper instance with its own window) and each level below, every
method's placement is twin-verified with the SLO as part of the verdict (a GPU is accepted when
it is not starved, starts, and meets every bound over the window after the SLO's 60 s warm-up;
``twin.slo``). Levels (p99 over the requests after the warm-up; an unserved request misses):

=========  ==============  ==============
level      p99 TTFT (ms)   p99 ITL (ms)
=========  ==============  ==============
90pct      --              --             (the 90 % throughput rule alone)
loose      10000           200
moderate   2000            100
tight      500             50
=========  ==============  ==============

Methods: ``greedy`` sizes the fleet (Maxpack FFD, twin repair and compaction under the SLO);
fixed-fleet methods such as ``loraserve`` (the rank-aware baseline) are given growing fleets from
their own default until the twin accepts one (``experiments.gpu_savings.gpus_needed``);
``cpsat`` / ``milp`` can be added with ``--methods`` where their models reach. Each (instance,
level) gets the twin-sound lower bound under that level's SLO (``twin_lower_bound``: the
one-adapter and count-aware carry limits measured under the SLO, then the exclusions; where the
best count is one above it, ``raise_bound_to``); a count is *certified* when it equals the bound.

Resumable: each (instance, level, method) row is appended to ``--store`` (default
``experiments/evidence/slo_placement_points.jsonl``) keyed by the instance with its SLO, the
method, the window and the twins' fingerprints; ``--rebound`` recomputes the stored points'
bounds with the current code (no placement is solved again) and stores the changed rows. Writes ``slo_placement.csv`` / ``.md`` / ``.png``
under ``--out-dir``. Last line: ``slo_levels=3 twin_failures=<greedy placements the twin
rejected under an SLO> certified_under_slo=<k>/<n> extra_gpus_vs_90pct=<greedy GPUs under each
level minus under the 90 % rule, summed over the instances>``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from optim.instance import Instance, load_instance
from optim.methods import method_names
from twin.slo import Slo

from .common import (REPO, add_class_checks_option, add_search_store_option, git_commit,
                     print_class_status, use_search_store)
from .gpu_savings import (PAPER_DIR, RowStore, point_key, rebound, scenario_of,
                          select_instances, solve_point)

LEVELS: dict[str, Slo | None] = {
    "90pct": None,
    "loose": Slo(ttft_p99_ms=10_000.0, itl_p99_ms=200.0),
    "moderate": Slo(ttft_p99_ms=2_000.0, itl_p99_ms=100.0),
    "tight": Slo(ttft_p99_ms=500.0, itl_p99_ms=50.0),
}
SLO_LEVELS = tuple(k for k, v in LEVELS.items() if v is not None)
MAX_EXTRA = 6


def select(quick: bool) -> list[Path]:
    """Every paper instance, or (``quick``) the Llama scenarios at their 2nd and 4th smallest
    counts (one GPU and a few at the 90 % rule)."""
    return select_instances(sorted(PAPER_DIR.glob("paper-*.json")), quick, positions=(1, 3))


def plot(df: pd.DataFrame, path: Path) -> None:
    """GPUs per instance at each level (greedy solid, bound dashed), one panel per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = list(dict.fromkeys(df["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(6 * len(methods), 4), squeeze=False)
    names = list(dict.fromkeys(df["instance"]))
    x = range(len(names))
    for ax, m in zip(axes[0], methods):
        for level, color in zip(LEVELS, ("0.4", "tab:green", "tab:orange", "tab:red")):
            d = df[(df["method"] == m) & (df["level"] == level)].set_index("instance")
            d = d.reindex(names)
            ax.plot(x, d["gpus"], marker="o", ms=3, color=color, label=f"{level}")
            ax.plot(x, d["lb"], ls="--", lw=1, color=color)
        ax.set_xticks(list(x))
        ax.set_xticklabels([n.replace("paper-llama-", "").replace("paper-", "") for n in names],
                           rotation=70, fontsize=6)
        ax.set_ylabel("GPUs (twin-verified; dashed: lower bound)", fontsize=8)
        ax.set_title(m, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("GPUs needed under latency SLOs (levels: experiments.slo_placement)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rebound_point(inst: Instance, methods: Sequence[str], rows: list[dict], duration_s: float,
                  workers: int | None, store: RowStore | None,
                  class_checks: int | None = None) -> list[dict]:
    """``rows`` (one per method) with ``lb`` recomputed by the current bound code
    (``gpu_savings.rebound``); changed rows are stored again under their keys."""
    lb, one = rebound(inst, pd.DataFrame(rows), workers, 0, class_checks)
    out = [{**r, "lb": lb, "lb_one": one} for r in rows]
    if store is not None:
        for m, old, new in zip(methods, rows, out):
            if (old["lb"], old["lb_one"]) != (new["lb"], new["lb_one"]):
                store.put(point_key(inst, m, duration_s, MAX_EXTRA, 0), new)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.slo_placement",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="Llama scenarios at their 2nd and 4th smallest counts, 600 s window")
    ap.add_argument("--methods", default="greedy,loraserve")
    ap.add_argument("--levels", default=",".join(LEVELS),
                    help=f"comma-separated among {', '.join(LEVELS)}")
    ap.add_argument("--match", default=None, help="only instances whose name contains this")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out-dir", default=str(REPO / "results" / "slo_placement"))
    ap.add_argument("--store", default=str(REPO / "experiments" / "evidence" /
                                           "slo_placement_points.jsonl"),
                    help="each point's row is appended here as it finishes; a rerun takes "
                         "the stored rows ('' turns it off)")
    ap.add_argument("--rebound", action="store_true",
                    help="recompute each stored point's lower bound with the current code "
                         "(no method is run again for a stored point) and store it")
    ap.add_argument("--keep-bounds", action="store_true",
                    help="a point missing one method's row runs that method only and takes "
                         "the lower bound stored with its other rows (--rebound recomputes "
                         "it); without this the bound is computed anew")
    add_class_checks_option(ap)
    add_search_store_option(ap)
    ap.add_argument("--status", action="store_true",
                    help="solve nothing: for each stored point greedy has not certified, how "
                         "far it is above its bound and where the class step stands (from "
                         "the cache)")
    a = ap.parse_args(argv)
    if (err := use_search_store(a.search_store)) is not None:
        print(f"error: {err}", file=sys.stderr)
        return 2
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in method_names()]
    if bad:
        print(f"error: --methods: unknown {bad} (known: {', '.join(method_names())})",
              file=sys.stderr)
        return 2
    levels = [x.strip() for x in a.levels.split(",") if x.strip()]
    if [x for x in levels if x not in LEVELS] or "90pct" not in levels:
        print(f"error: --levels: choose among {', '.join(LEVELS)}, 90pct included",
              file=sys.stderr)
        return 2
    store = RowStore(Path(a.store)) if a.store else None
    commit = git_commit()
    rows: list[dict] = []
    jobs = [(p, lv) for p in select(a.quick) if a.match is None or a.match in p.stem
            for lv in levels]
    if a.status:
        pts = []
        for path, level in jobs:
            inst = replace(load_instance(path), slo=LEVELS[level])
            dur = 600.0 if a.quick else inst.duration_s
            key = point_key(inst, "greedy", dur, MAX_EXTRA, 0)
            pts.append((f"{inst.name} {level}", inst, dur,
                        store.get(key) if store is not None else None))
        print_class_status([p for p in pts if not p[0].endswith(" 90pct")], a.class_checks)
        return 0
    for path, level in tqdm(jobs, desc="instance x level", unit="pt"):
        base = load_instance(path)
        inst = replace(base, slo=LEVELS[level])
        dur = 600.0 if a.quick else inst.duration_s
        got = solve_point(inst, methods, dur, MAX_EXTRA, 0, a.workers, store,
                          {"instance": inst.name, **scenario_of(inst), "level": level,
                           "slo": inst.slo.describe() if inst.slo else "90 % rule"}, commit,
                          keep_bound=a.keep_bounds, class_checks=a.class_checks)
        rows += (rebound_point(inst, methods, got, dur, a.workers, store, a.class_checks)
                 if a.rebound else got)
    df = pd.DataFrame(rows)
    df["certified"] = df["gpus"].notna() & (df["gpus"] == df["lb"])
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "slo_placement.csv", index=False)
    piv = df.assign(cell=[("fail" if g is None or g != g else
                           f"{int(g)}{'' if c else f' (lb {int(lb)})'}")
                          for g, c, lb in zip(df["gpus"], df["certified"], df["lb"])]
                    ).pivot_table(index=["instance"], columns=["method", "level"],
                                  values="cell", aggfunc="first")
    piv = piv.reindex(columns=[(m, lv) for m in methods for lv in levels])
    md = ["| instance | " + " | ".join(f"{m} {lv}" for m, lv in piv.columns) + " |",
          "|---|" + "---|" * len(piv.columns)]
    for name, row in piv.iterrows():
        md.append(f"| {name} | " + " | ".join(str(v) for v in row.values) + " |")
    md += ["", "Cells: twin-accepted GPUs; `(lb k)`: above the twin lower bound k under that "
           "level (else certified optimal in the twin under it); `fail`: no accepted placement."
           " Levels: " + "; ".join(f"{k}: {v.describe() if v else 'the 90 % rule'}"
                                   for k, v in LEVELS.items() if k in levels)]
    (out / "slo_placement.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    plot(df, out / "slo_placement.png")
    print("\n".join(md))
    g = df[df["method"] == "greedy"] if "greedy" in methods else df[df["method"] == methods[0]]
    slo_rows = g[g["level"] != "90pct"]
    base_gpus = g[g["level"] == "90pct"].set_index("instance")["gpus"]
    extra = {}
    for lv in [x for x in levels if x != "90pct"]:
        d = slo_rows[slo_rows["level"] == lv].set_index("instance")["gpus"]
        both = d.dropna().index.intersection(base_gpus.dropna().index)
        extra[lv] = int((d[both] - base_gpus[both]).sum())
    for m in methods:
        d = df[df["method"] == m]
        print(f"{m}: " + ", ".join(
            f"{lv} total={int(d[d['level'] == lv]['gpus'].dropna().sum())} "
            f"certified={int(d[d['level'] == lv]['certified'].sum())}/"
            f"{int((d['level'] == lv).sum())}" for lv in levels))
    failures = int(slo_rows["failed"].sum())
    print(f"slo_levels={len(extra)} twin_failures={failures} "
          f"certified_under_slo={int(slo_rows['certified'].sum())}/{len(slo_rows)} "
          f"extra_gpus_vs_90pct=" + ",".join(f"{k}:+{v}" for k, v in extra.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
