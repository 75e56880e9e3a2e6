"""Is the twin's throughput-vs-Amax curve unimodal? Brute force against the integer search.

``python -m experiments.amax_curves [--quick] [--workers W] [--out-dir DIR]``

Two kinds of curve, each replayed at every integer Amax 1..min(n + 1, largest startable):

* **limit** — n equal-rate adapters of one rank at ``optim.capacity.OVERLOAD`` (1.05) x the
  one-adapter carry limit, seed 0 (``capacity.overload_throughputs``, the same replays): the saturated throughput ``optim.capacity`` ranks Amax by when it measures the
  adapter-count carry limits behind the lower bound (a missed best Amax there would make the
  bound unsound, so that measurement now replays every Amax);
* **score** — n adapters drawn (seeded) from a paper instance, their rates scaled so the GPU is
  offered ``f`` x the one-adapter limit, verification seed: the twin score (throughput /
  (threshold x offered)) ``optim.amax_search.twin_best_amax`` maximises when it picks a GPU's
  Amax (>= 1: accepted).

Per curve: its strict local maxima, the best Amax by brute force, and what
``optim.integer_search.search_max`` (coarse scan + bracket refinement) returns — its gap to the
best, and for score curves whether it misses an accepted Amax (a GPU the search alone would have
given up) and whether ``twin_best_amax`` as shipped, which replays the skipped Amax before it
gives a GPU up, still misses one (``verdict_missed_now``).

Each curve is stored as it finishes (``--out-dir``/amax_curves_points.jsonl, keyed by its
inputs and the twin's fingerprint), so a stopped run continues. Last line::

    curves=<n> non_unimodal=<k> search_missed_best=<k> max_gap_pct=<x> verdict_missed_by_search=<k> verdict_missed_now=<k>
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from .common import REPO, RowStore, git_commit

PROFILES = ("llama-3.1-8b-instruct", "qwen-2.5-7b-instruct")
LIMIT_COUNTS = (8, 16, 24, 32, 48, 64, 96, 128)
SCORE_COUNTS = (8, 16, 32, 64)
SCORE_LOADS = (0.85, 0.95)
SCORE_INSTANCES = {"llama-3.1-8b-instruct": "paper-llama-rmixed-qmixed-n320",
                   "qwen-2.5-7b-instruct": "paper-qwen-rmixed-qmixed-n320"}


def local_maxima(v: np.ndarray) -> list[int]:
    """Amax (1-based) of the strict local maxima of a curve (plateaus count once, at their
    first point)."""
    out, n = [], len(v)
    for i in range(n):
        left = v[i - 1] if i > 0 else -np.inf
        j = i
        while j + 1 < n and v[j + 1] == v[i]:
            j += 1
        right = v[j + 1] if j + 1 < n else -np.inf
        if v[i] > left and v[i] > right:
            out.append(i + 1)
    return out


def compare(v: np.ndarray) -> dict:
    """Brute force against ``search_max`` on one curve (values at Amax 1..len(v))."""
    from optim.integer_search import search_max
    table = {a: float(x) for a, x in enumerate(v, start=1)}
    arg, best, seen = search_max(lambda xs: [table[a] for a in xs], len(v))
    g = int(np.argmax(v)) + 1
    top = float(v[g - 1])
    gap = 100.0 * (top - best) / abs(top) if np.isfinite(top) and top != 0 else 0.0
    return {"search_amax": arg, "search_value": best, "search_runs": len(seen),
            "best_amax": g, "best_value": top, "gap_pct": gap,
            "local_maxima": local_maxima(np.asarray(v, dtype=float))}


def limit_curve(profile: str, rank: int, n: int, duration_s: float, workers: int) -> np.ndarray:
    from optim.capacity import (BOUND_SEEDS, OVERLOAD, carry_limit, max_startable_amax,
                                overload_throughputs)
    from twin.profile import load_profile
    from twin.sharegpt import sharegpt_lengths
    prof = load_profile(profile)
    lengths = sharegpt_lengths(mean_input=223.0, mean_output=196.3)
    one = carry_limit(prof, rank, 1, lengths, duration_s, tuple(range(BOUND_SEEDS)), 0.9,
                      workers)
    xs = list(range(1, min(n + 1, max_startable_amax(prof, rank)) + 1))
    return np.array(overload_throughputs(prof, rank, n, xs, OVERLOAD * one.limit_tps, lengths,
                                         duration_s, 0.9, 0, workers=workers))


def score_curve(profile: str, n: int, load: float, duration_s: float, seed: int,
                workers: int) -> tuple[np.ndarray, bool]:
    from dataclasses import replace

    from optim.amax_search import amax_upper, twin_best_amax, twin_scores
    from optim.capacity import BOUND_SEEDS, carry_limit
    from optim.instance import load_instance
    from optim.placement import plan_gpu
    inst = load_instance(REPO / "instances" / "paper" / f"{SCORE_INSTANCES[profile]}.json")
    inst = replace(inst, duration_s=duration_s)
    rng = np.random.default_rng(seed)
    pick = [inst.adapters[i] for i in sorted(rng.choice(len(inst.adapters), n, replace=False))]
    rank = max(a.rank for a in pick)
    one = carry_limit(profile, min(a.rank for a in inst.adapters), 1, inst.lengths, duration_s,
                      tuple(range(BOUND_SEEDS)), inst.starvation_threshold, workers)
    scale = load * one.limit_tps / (sum(a.rate for a in pick) * inst.mean_tokens)
    pairs = [(replace(a, rate=a.rate * scale), 1.0) for a in pick]
    plan = plan_gpu(inst.gpu_types[0].name, profile, 1, pairs, inst.mean_tokens, rank)
    xs = list(range(1, amax_upper(plan) + 1))
    v = np.array([v for v, _ in twin_scores(inst, plan, xs, inst.seed, duration_s, workers)])
    found, _ = twin_best_amax(inst, plan, inst.seed, duration_s, workers)
    return v, found is not None


def points(quick: bool) -> list[dict]:
    dur = 600.0 if quick else 3600.0
    profiles = PROFILES[:1] if quick else PROFILES
    out = []
    for p in profiles:
        for rank in ((8,) if quick else (8, 16)):
            for n in (LIMIT_COUNTS[:4] if quick else LIMIT_COUNTS):
                out.append({"kind": "limit", "profile": p, "rank": rank, "n": n,
                            "duration_s": dur})
        for n in (SCORE_COUNTS[:3] if quick else SCORE_COUNTS):
            for f in SCORE_LOADS:
                for seed in ((0,) if quick else (0, 1)):
                    out.append({"kind": "score", "profile": p, "n": n, "load": f, "seed": seed,
                                "duration_s": dur})
    return out


def point_key(pt: dict) -> str:
    from optim.capacity import twin_fingerprint
    from twin.profile import load_profile
    blob = json.dumps({**pt, "v": 1, "twin": twin_fingerprint(load_profile(pt["profile"]))},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def run_point(pt: dict, workers: int) -> dict:
    now = None
    if pt["kind"] == "limit":
        v = limit_curve(pt["profile"], pt["rank"], pt["n"], pt["duration_s"], workers)
    else:
        v, now = score_curve(pt["profile"], pt["n"], pt["load"], pt["duration_s"], pt["seed"],
                             workers)
    row = {**pt, **compare(v), "values": [float(x) for x in v]}
    if pt["kind"] == "score":
        table = dict(enumerate(v, start=1))
        row["any_accepted"] = bool(np.max(v) >= 1.0)
        row["search_accepted"] = bool(table[row["search_amax"]] >= 1.0)
        row["twin_best_amax_accepted"] = bool(now)      # optim.amax_search as shipped
    return row


def summary(rows: list[dict]) -> str:
    non_uni = sum(1 for r in rows if len(r["local_maxima"]) > 1)
    missed = sum(1 for r in rows if r["best_value"] > r["search_value"])
    gap = max((r["gap_pct"] for r in rows), default=0.0)
    verdict = sum(1 for r in rows if r["kind"] == "score" and r["any_accepted"]
                  and not r["search_accepted"])
    now = sum(1 for r in rows if r["kind"] == "score" and r["any_accepted"]
              and not r["twin_best_amax_accepted"])
    return (f"curves={len(rows)} non_unimodal={non_uni} search_missed_best={missed} "
            f"max_gap_pct={gap:.3f} verdict_missed_by_search={verdict} verdict_missed_now={now}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lim = [r for r in rows if r["kind"] == "limit"]
    sco = [r for r in rows if r["kind"] == "score"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, group, label in ((axes[0], lim, "saturated throughput / best"),
                             (axes[1], sco, "twin score (>= 1: accepted)")):
        for r in group:
            v = np.asarray(r["values"], dtype=float)
            y = v / r["best_value"] if r["kind"] == "limit" else v
            tag = (f"{r['profile'][:5]} r{r['rank']} n={r['n']}" if r["kind"] == "limit"
                   else f"{r['profile'][:5]} n={r['n']} f={r['load']} s{r['seed']}")
            ax.plot(np.arange(1, len(v) + 1), y, lw=0.9, label=tag)
            ax.plot([r["search_amax"]], [y[r["search_amax"] - 1]], "kx", ms=5)
        ax.set_xscale("log")
        ax.set_xlabel("Amax (max_loras)")
        ax.set_ylabel(label)
        ax.legend(fontsize=6, ncol=2)
    axes[0].set_title("limit curves (x: the integer search's pick)")
    axes[1].set_title("score curves")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from tqdm import tqdm
    ap = argparse.ArgumentParser(prog="python -m experiments.amax_curves",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="Llama, rank 8, 600 s windows, fewer counts (a few minutes)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out-dir", type=Path, default=REPO / "results" / "amax_curves")
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.error(f"--workers must be >= 1, got {a.workers}")
    store = RowStore(a.out_dir / "amax_curves_points.jsonl")
    rows = []
    for pt in tqdm(points(a.quick), desc="Amax curves"):
        key = point_key(pt)
        row = store.get(key)
        if row is None:
            row = {**run_point(pt, a.workers), "commit": git_commit()}
            store.put(key, row)
        rows.append(row)
    print(f"{'kind':6s} {'profile':22s} {'rank/load':>9s} {'n':>4s} {'best':>5s} {'search':>6s} "
          f"{'gap %':>7s} {'runs':>5s} local maxima")
    for r in rows:
        what = str(r["rank"]) if r["kind"] == "limit" else f"{r['load']}/s{r['seed']}"
        print(f"{r['kind']:6s} {r['profile']:22s} {what:>9s} {r['n']:4d} {r['best_amax']:5d} "
              f"{r['search_amax']:6d} {r['gap_pct']:7.3f} {r['search_runs']:5d} "
              f"{r['local_maxima'][:10]}{' ...' if len(r['local_maxima']) > 10 else ''}")
    plot = a.out_dir / "amax_curves.png"
    _plot(rows, plot)
    print(f"plot: {plot}")
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
