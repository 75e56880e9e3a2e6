"""First solves: the wall time of ``optim solve`` on an instance the machine has never seen.

``python -m experiments.first_solve [--quick] [--sets small,paper] [--max-adapters N]
[--targets-only] [--method greedy] [--workers W] [--csv OUT] [--resume FILE]``

Each instance is solved in a fresh process with an empty user cache (``LORA_PLACEMENT_CACHE``
pointing at a new folder; the limits shipped in ``optim/data/carry_limits.json`` are part of
the package and are used), verification on, exactly as ``python -m optim solve PATH --method
greedy`` runs. Printed per instance: the wall time of the whole command, the time spent in the
twin lower bound's measurements (``feasibility.twin_lower_bound``, first call) and its share.

Targets (issue 25): every ``instances/small`` instance and every paper instance with <= 160
adapters within 60 s; 768-adapter paper instances within 120 s. ``--quick``: the small
instances whose index is 0 or 1 mod 4 (both base models), the paper instances the gpu_savings
quick set holds (Llama, each scenario's 4 smallest counts) and the three Llama 768-adapter
ones. ``--targets-only``: only instances with a target (the 192-512 and 1,536-adapter paper
instances have none and take the longest).

Resumable: each instance's row is appended to ``--resume`` (default
``results/first_solve/rows.jsonl``) as it finishes, keyed by the instance, the method and the
commit; the same command skips rows already there. Ends with
``instances=<n> max_first_solve_s=<x> over_target=<k>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from .common import REPO, git_commit, markdown_table
from .gpu_savings import select_instances

SETS = {"small": REPO / "instances" / "small", "paper": REPO / "instances" / "paper"}
_PAPER = re.compile(r"paper-(?P<model>\w+)-r(?P<ranks>\w+)-q(?P<rates>\w+)-n(?P<n>\d+)$")


def target_s(path: Path) -> float | None:
    """The issue's target for one instance (None: no target stated)."""
    if path.parent.name == "small":
        return 60.0
    m = _PAPER.match(path.stem)
    if not m:
        return None
    n = int(m["n"])
    return 60.0 if n <= 160 else 120.0 if n == 768 else None


def pick(sets: Sequence[str], quick: bool, max_adapters: int | None) -> list[Path]:
    out: list[Path] = []
    for s in sets:
        paths = sorted(SETS[s].glob("*.json"))
        if s == "small" and quick:
            paths = [p for p in paths if int(p.stem.split("-")[1]) % 4 in (0, 1)]  # both models
        if s == "paper":
            if quick:
                sel = select_instances(paths, True)
                sel += [p for p in paths if _PAPER.match(p.stem)
                        and _PAPER.match(p.stem)["model"] == "llama"
                        and int(_PAPER.match(p.stem)["n"]) == 768]
                paths = sel
            if max_adapters is not None:
                paths = [p for p in paths if int(_PAPER.match(p.stem)["n"]) <= max_adapters]
        out += paths
    return out


def solve_once(path: Path, method: str, workers: int | None) -> dict:
    """Run one first solve in a fresh process with an empty cache; time the bound inside it."""
    with tempfile.TemporaryDirectory(prefix="first-solve-") as cache:
        env = {**os.environ, "LORA_PLACEMENT_CACHE": cache}
        code = ("import sys, time, json, optim.feasibility as F\n"
                "spent = [0.0]\n"
                "orig = F.twin_lower_bound\n"
                "def timed(*a, **k):\n"
                "    t = time.perf_counter()\n"
                "    try:\n"
                "        return orig(*a, **k)\n"
                "    finally:\n"
                "        spent[0] += time.perf_counter() - t\n"
                "F.twin_lower_bound = timed\n"
                "from optim.cli import main\n"
                "rc = main(sys.argv[1:])\n"
                "print('FIRST_SOLVE ' + json.dumps({'rc': rc, 'bound_s': spent[0]}))\n"
                "sys.exit(rc)\n")
        args = [sys.executable, "-c", code, "solve", str(path), "--method", method, "--quiet"]
        if workers:
            args += ["--workers", str(workers)]
        t0 = time.perf_counter()
        r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
        wall = time.perf_counter() - t0
    info = {"rc": r.returncode, "bound_s": float("nan")}
    for line in r.stdout.splitlines():
        if line.startswith("FIRST_SOLVE "):
            info = json.loads(line[len("FIRST_SOLVE "):])
    gpus = re.search(r" gpus=(\d+)", r.stdout)
    lb = re.search(r"twin_lower_bound=(\d+)", r.stdout)
    return {"instance": path.stem, "wall_s": round(wall, 2), "bound_s": round(info["bound_s"], 2),
            "bound_share": round(info["bound_s"] / wall, 3) if wall > 0 else None,
            "gpus": int(gpus[1]) if gpus else None, "lower_bound": int(lb[1]) if lb else None,
            "exit": r.returncode, "target_s": target_s(path),
            "error": r.stderr.strip().splitlines()[-1] if r.returncode not in (0, 1) and
            r.stderr.strip() else ""}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.first_solve",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", default="small,paper")
    ap.add_argument("--max-adapters", type=int, default=None,
                    help="paper instances with at most this many adapters")
    ap.add_argument("--targets-only", action="store_true",
                    help="only instances the issue states a target for")
    ap.add_argument("--method", default="greedy")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--resume", default=str(REPO / "results" / "first_solve" / "rows.jsonl"))
    a = ap.parse_args(argv)
    sets = [s.strip() for s in a.sets.split(",") if s.strip()]
    bad = [s for s in sets if s not in SETS]
    if bad:
        print(f"error: --sets: unknown set(s) {bad} (known: {', '.join(SETS)})", file=sys.stderr)
        return 2
    paths = pick(sets, a.quick, a.max_adapters)
    if a.targets_only:
        paths = [p for p in paths if target_s(p) is not None]
    store = Path(a.resume)
    store.parent.mkdir(parents=True, exist_ok=True)
    commit = git_commit()
    done: dict[str, dict] = {}
    if store.is_file():
        for line in store.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("commit") == commit and row.get("method") == a.method:
                done[row["instance"]] = row
    rows = []
    for path in tqdm(paths, desc="first solves", unit="inst"):
        if path.stem in done:
            rows.append(done[path.stem])
            continue
        row = {**solve_once(path, a.method, a.workers), "method": a.method, "commit": commit}
        with open(store, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        rows.append(row)
        tqdm.write(f"{row['instance']}: {row['wall_s']:.1f} s (bound {row['bound_s']:.1f} s)")
    df = pd.DataFrame(rows)
    print(markdown_table(df[["instance", "wall_s", "bound_s", "bound_share", "gpus",
                             "lower_bound", "exit", "target_s"]]))
    if a.csv:
        df.to_csv(a.csv, index=False)
    over = df[df["target_s"].notna() & (df["wall_s"] > df["target_s"])]
    failed = df[~df["exit"].isin([0, 1])]
    print(f"load_average_1min={os.getloadavg()[0]:.2f} cores={os.cpu_count()} commit={commit}")
    print(f"instances={len(df)} max_first_solve_s={df['wall_s'].max():.1f} "
          f"over_target={len(over)} failed={len(failed)}")
    return 0 if failed.empty else 1


if __name__ == "__main__":
    sys.exit(main())
