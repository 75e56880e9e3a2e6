"""Classical bin packing through the exact methods: how many public instances are proven optimal.

``python -m experiments.classical_bpp [--data PATH ...] [--methods cpsat,milp] [--time-limit S]
[--limit K] [--optima CSV]``

Each file (BPPLIB: one instance; OR-Library ``binpack*.txt``: many) becomes a constant-capacity
instance (``optim.exact.classical``) and is solved with ``optim solve --method M --no-verify``
semantics, the whole method under the time limit. Default data: the five Falkenauer instances
committed for the tests (``tests/data/bpp``); point ``--data`` at OR-Library/BPPLIB files for the
full sets (not shipped). ``--optima`` (CSV ``name,optimum``) adds a check against published
optima; without it the table shows the value each OR-Library file states, which for
``u120_08`` and ``u120_19`` is an old best-known value one above the optimum.

Each run is stored as it finishes in ``<out-dir>/classical_bpp_runs.jsonl``, keyed by the
instance's weights and capacity, the method, the time limit and a fingerprint of the solver's
source (``optim/exact``); a stopped study started again with the same arguments continues where
it stopped (``--fresh`` reruns everything). Writes ``<out-dir>/classical_bpp.{csv,md,png}``;
last line
``instances=<n> runs=<r> proven_optimal=<p> max_wall_s=<w> over_limit=<o>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "tests" / "data" / "bpp"


def load_files(paths: Sequence[str]) -> list:
    from optim.exact.classical import read_bin_packing
    out = []
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("*.txt")) if p.is_dir() else [p]
        for f in files:
            out += read_bin_packing(f)
    return out


def solver_fingerprint() -> str:
    """Hash of the exact layer's source: a stored run is reused only by the same solver."""
    import hashlib
    h = hashlib.sha256()
    for f in sorted((REPO / "optim" / "exact").glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def run_key(bp, method: str, time_limit: float, solver: str) -> str:
    """What a stored run depends on: the instance's content, method, limit and solver."""
    import hashlib
    blob = json.dumps({"weights": list(map(int, bp.weights)), "capacity": int(bp.capacity),
                       "method": method, "time_limit": time_limit, "solver": solver})
    return hashlib.sha256(blob.encode()).hexdigest()


def run(paths: Sequence[str], methods: Sequence[str], time_limit: float, limit: int | None,
        optima: dict[str, int], out_dir: Path, fresh: bool = False) -> int:
    import pandas as pd
    from tqdm import tqdm

    from optim.exact.classical import classical_instance
    from optim.instance import instance_from_dict
    from optim.methods import MethodOptions, solve

    from .common import RowStore, git_commit

    bps = load_files(paths)[:limit]
    store_path = out_dir / "classical_bpp_runs.jsonl"
    if fresh and store_path.exists():
        store_path.unlink()
    store = RowStore(store_path)
    solver, commit = solver_fingerprint(), git_commit(mark_changes=True)
    rows = []
    for bp in tqdm(bps, desc="classical instances", file=sys.stderr):
        inst = instance_from_dict(classical_instance(bp), source=bp.name)
        row = {"instance": bp.name, "items": len(bp.weights), "capacity": bp.capacity,
               "l1": -(-sum(bp.weights) // bp.capacity), "stated": bp.stated_best,
               "optimum": optima.get(bp.name)}
        for m in methods:
            key = run_key(bp, m, time_limit, solver)
            done = store.get(key)
            if done is None:
                t0 = time.perf_counter()
                p = solve(inst, m, objective="gpus",
                          options=MethodOptions(time_limit_s=time_limit))
                wall = time.perf_counter() - t0
                it = (p.params.get("iterations") or [{}])[0]
                done = {f"{m}_bins": p.n_gpus or None, f"{m}_status": p.status,
                        f"{m}_bound": p.best_bound, f"{m}_wall_s": round(wall, 2),
                        f"{m}_lp": it.get("lp_bound"), f"{m}_start": it.get("start"),
                        f"{m}_commit": commit}
                store.put(key, done)
            row.update(done)
        rows.append(row)
    df = pd.DataFrame(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "classical_bpp.csv", index=False)
    from experiments.common import markdown_table
    (out_dir / "classical_bpp.md").write_text(
        f"# Classical bin packing ({time_limit:g} s per run)\n\n{markdown_table(df)}\n")
    _plot(df, methods, out_dir / "classical_bpp.png")
    runs = len(df) * len(methods)
    proven = sum(int((df[f"{m}_status"] == "optimal").sum()) for m in methods)
    wrong = sum(int(((df[f"{m}_bins"] != df["optimum"]) & df["optimum"].notna()
                     & (df[f"{m}_status"] == "optimal")).sum()) for m in methods)
    walls = [w for m in methods for w in df[f"{m}_wall_s"]]
    over = sum(1 for w in walls if w > max(1.1 * time_limit, time_limit + 2.0))
    print(f"wrote {out_dir / 'classical_bpp.csv'}, .md, .png")
    print(f"instances={len(df)} runs={runs} proven_optimal={proven} max_wall_s={max(walls):.1f} "
          f"over_limit={over}" + (f" optimal_but_not_published={wrong}" if optima else ""))
    return 0 if wrong == 0 else 1


def _plot(df, methods, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for m, mk in zip(methods, ("o", "s", "^")):
        ok = df[f"{m}_status"] == "optimal"
        ax.scatter(df["items"][ok], df[f"{m}_wall_s"][ok], marker=mk, label=f"{m}: proven")
        ax.scatter(df["items"][~ok], df[f"{m}_wall_s"][~ok], marker="x",
                   label=f"{m}: not proven")
    ax.set_xlabel("items")
    ax.set_ylabel("wall time of the method (s)")
    ax.set_title("Exact methods on classical bin packing")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.classical_bpp",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--data", nargs="+", default=[str(DEFAULT_DATA)],
                    help="BPPLIB/OR-Library files or directories of them (default: %(default)s)")
    ap.add_argument("--methods", default="cpsat,milp", help="default: %(default)s")
    ap.add_argument("--time-limit", type=float, default=20.0, help="s per run (default 20)")
    ap.add_argument("--limit", type=int, default=None, help="first K instances only")
    ap.add_argument("--optima", default=None, help="CSV with columns name,optimum")
    ap.add_argument("--out-dir", default=str(REPO / "results" / "classical_bpp"))
    ap.add_argument("--fresh", action="store_true",
                    help="rerun every instance (default: continue from the stored runs)")
    a = ap.parse_args(argv)
    if not a.time_limit > 0:
        ap.error("--time-limit must be > 0")
    if a.limit is not None and a.limit < 1:
        ap.error("--limit must be >= 1")
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in ("cpsat", "milp")]
    if bad or not methods:
        ap.error(f"--methods: choose from cpsat, milp (got {a.methods!r})")
    optima = {}
    if a.optima:
        import csv
        try:
            with open(a.optima) as f:
                optima = {r["name"]: int(r["optimum"]) for r in csv.DictReader(f)}
        except (OSError, KeyError, ValueError) as e:
            ap.error(f"--optima {a.optima}: needs columns name,optimum ({e})")
    try:
        return run(a.data, methods, a.time_limit, a.limit, optima, Path(a.out_dir), a.fresh)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
