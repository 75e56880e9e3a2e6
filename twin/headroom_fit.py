"""Measuring ``twin.headroom``'s table on the shared max-search runs: every run replayed in the
twin from its configuration columns, the twin's throughput error grouped by regime.

    python -m twin.headroom_fit --fit ../shared/data/vllm_h100 [--workers 2] [--evaluate]

``--evaluate`` also replays ``validation_llama.csv`` and prints how the plain and the headroom
verdicts classify its real-starved runs (evaluation only; nothing is fitted on it). Kept apart
from the table it measures: the table judges every twin verdict (``twin.server``), while the
measurement replays runs with the twin.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .headroom import (CONSTANTS_FILE, FIT_PROFILE, MAXSEARCH_CSV, MIN_RUNS, QUANTILE,
                       REPLAY_COLUMNS, VALIDATION_CSV, HeadroomEntry, HeadroomTable, Regime,
                       forget_constants, passes_with_headroom)
from .shared_runs import CONFIG_COLUMNS, replay_run
from .slot_fit import counts_agree

def replay_csv(path, workers: int = 1, progress: bool = True):
    """Replay every ok run of a shared-format CSV in the twin (``twin.shared_runs
    .replay_run``, seed 0, engine latencies) on ``workers`` processes; a table of the real
    and the twin's throughput, offered load and verdict per run, in the file's order."""
    import pandas as pd
    from tqdm import tqdm

    df = pd.read_csv(path)
    ok = df[(df["status"] == "ok") & df["total_throughput_tps"].notna()]
    ok = ok[[counts_agree(a, b) for a, b in zip(ok["adapter_rank_counts"], ok["rate_counts"])]]
    ok = ok.reset_index(drop=True)
    cfgs = ok[CONFIG_COLUMNS].to_dict("records")
    n = len(cfgs)
    args = (cfgs, [0] * n, [None] * n, [False] * n)
    if workers > 1:
        from .fleet import worker_pool
        with worker_pool(workers) as pool:
            res = list(tqdm(pool.map(replay_run, *args, chunksize=4), total=n,
                            desc="replaying runs", disable=not progress))
    else:
        res = [replay_run(*a) for a in tqdm(zip(*args), total=n, desc="replaying runs",
                                             disable=not progress)]
    out = ok[["run_id", "max_loras", "served_adapters", "max_lora_rank"]].copy()
    out["real_tps"] = ok["total_throughput_tps"].astype(float)
    out["real_offered_tps"] = ok["offered_throughput_est_tps"].astype(float)
    out["real_starved"] = ok["starved_90"].astype(str).str.lower() == "true"
    for k in REPLAY_COLUMNS:
        out[f"twin_{k}"] = [r[k] for r in res]
    return out


def regimes_of(df) -> list[Regime]:
    return [Regime.of(a, n, t, o) for a, n, t, o in
            zip(df["max_loras"], df["served_adapters"], df["twin_throughput_tps"],
                df["twin_offered_realised_tps"])]


def fit_headroom(df, profile: str = FIT_PROFILE, quantile: float = QUANTILE,
                 min_runs: int = MIN_RUNS) -> HeadroomTable:
    """The table from replayed max-search runs (``replay_csv``'s columns)."""
    d = df[~df["twin_memory_error"].astype(bool)]
    e = ((d["twin_throughput_tps"] - d["real_tps"]) / d["real_tps"]).to_numpy(float)
    keys = [r.chain() for r in regimes_of(d)]
    groups: dict[str, list[float]] = {}
    for err, chain in zip(e, keys):
        for k in chain:
            groups.setdefault(k, []).append(float(err))
    entries = []
    for k in sorted(groups, key=lambda k: (k != "all", k)):
        x = np.asarray(groups[k])
        h = float(np.quantile(np.maximum(x, 0.0), quantile))
        entries.append((k, HeadroomEntry(h, len(x), float(x.mean()), float(x.max()))))
    return HeadroomTable(profile, quantile, min_runs, tuple(entries))


def classify(df, table: HeadroomTable | None, threshold: float = 0.9) -> dict:
    """How the plain and the headroom verdicts classify replayed runs against the real
    starvation (``real_starved``): counts per (real, verdict)."""
    plain = (~df["twin_memory_error"].astype(bool)
             & (df["twin_throughput_tps"] >= threshold * df["twin_offered_realised_tps"]))
    hs = [0.0 if table is None else table.lookup(r).h for r in regimes_of(df)]
    with_h = [bool(p) and passes_with_headroom(t, o, h, threshold) for p, t, o, h in
              zip(plain, df["twin_throughput_tps"], df["twin_offered_realised_tps"], hs)]
    real = df["real_starved"].astype(bool).to_numpy()
    out = {"runs": int(len(df)), "real_starved": int(real.sum())}
    for name, acc in (("plain", np.asarray(plain, bool)), ("headroom", np.asarray(with_h, bool))):
        out[name] = {"starved_accepted": int((real & acc).sum()),
                     "unstarved_rejected": int((~real & ~acc).sum()),
                     "correct": int((real != acc).sum())}
    return out


def write_constants(table: HeadroomTable, data_dir: str | Path, runs: int,
                    path: Path = CONSTANTS_FILE) -> None:
    """Put ``table`` under its profile in the constants file (other profiles kept)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault("about", "twin.headroom: the twin's optimistic throughput error per regime, "
                   "measured on the shared max-search runs; refit: python -m twin.headroom_fit "
                   "--fit <data dir>")
    doc.setdefault("profiles", {})[table.profile] = {
        **table.to_dict(),
        "fit": {"data": f"{Path(data_dir).name}/{MAXSEARCH_CSV.as_posix()}", "runs": runs,
                "error": "e = (twin - real) / real total throughput; h = quantile of max(e, 0)"},
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    forget_constants()


def format_table(table: HeadroomTable) -> str:
    lines = [f"{'regime':44s} {'runs':>5s} {'h %':>6s} {'mean e %':>9s} {'max e %':>8s}"]
    for k, e in table.entries:
        lines.append(f"{k:44s} {e.runs:5d} {100 * e.headroom:6.2f} {100 * e.mean_error:9.2f} "
                     f"{100 * e.max_error:8.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m twin.headroom_fit",
                                description="Measure the twin's throughput optimism per regime "
                                "on the shared max-search runs and write the headroom table.")
    p.add_argument("--fit", required=True, metavar="DATA_DIR",
                   help="the shared data folder (…/vllm_h100)")
    p.add_argument("--profile", default=FIT_PROFILE)
    p.add_argument("--workers", type=int, default=1, help="replay processes (%(default)s)")
    p.add_argument("--out", default=str(CONSTANTS_FILE), help="constants file (%(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print, do not write")
    p.add_argument("--evaluate", action="store_true",
                   help="also replay validation_llama.csv and print the verdicts' classification")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    path = Path(a.fit) / MAXSEARCH_CSV
    if not path.exists():
        print(f"error: --fit: {path}: the max-search runs are needed for the fit",
              file=sys.stderr)
        return 2
    df = replay_csv(path, max(1, a.workers), progress=not a.quiet)
    table = fit_headroom(df, a.profile)
    print(format_table(table))
    if not a.dry_run:
        write_constants(table, a.fit, int((~df["twin_memory_error"].astype(bool)).sum()),
                        Path(a.out))
        print(f"wrote {a.out}", file=sys.stderr)
    if a.evaluate:
        v = replay_csv(Path(a.fit) / VALIDATION_CSV, max(1, a.workers), progress=not a.quiet)
        print(json.dumps(classify(v, table), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
