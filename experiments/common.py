"""Helpers shared by the experiments: error metrics, the shared-data location, output files."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

from surrogates.metrics import mape, smape  # noqa: F401  (DESIGN.md section 6 definitions)

REPO = Path(__file__).resolve().parent.parent
SHARED_ENV = "LORA_SHARED_DATA"
# method options of the studies that count GPUs: each GPU's Amax is not tuned after
# acceptance (optim.amax_tuning; it costs replays and never changes the count)
COUNTING = {"tune_amax": False}


def add_class_checks_option(ap) -> None:
    """The studies' ``--class-checks N``: the class step's GPU-check budget where a point is
    one GPU above its bound (``feasibility.raise_bound_to``); a larger budget than a stopped
    search had goes on from its saved progress."""
    import argparse

    from optim.class_exclusion import CLASS_CHECKS

    def budget(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a whole number of GPU checks, got {text!r}")
        if n < 0:
            raise argparse.ArgumentTypeError(f"must be >= 0 (0: cached results only), got {n}")
        return n

    ap.add_argument("--class-checks", type=budget, default=CLASS_CHECKS, metavar="N",
                    help="GPU checks the class step may spend on a point one GPU above its "
                         "bound (0: its cached results only; a larger budget goes on from a "
                         "stopped search's saved progress; default %(default)s)")


SEARCH_STORE = REPO / "experiments" / "evidence" / "bound_searches.json"


def add_search_store_option(ap) -> None:
    """The studies' ``--search-store FILE``: where the bound searches' verdicts and saved
    progress are kept beside the user cache (``optim.capacity._store_path``)."""
    ap.add_argument("--search-store", default=str(SEARCH_STORE), metavar="FILE",
                    help="the lower-bound searches' verdicts and saved progress (class step, "
                         "exclusion checks) are kept here as well as in the user cache: a "
                         "committed file, so a stopped search goes on in a later session on a "
                         "machine whose cache is empty ('' turns it off; default "
                         "%(default)s)")


def use_search_store(path: str) -> str | None:
    """Point ``$LORA_PLACEMENT_STORE`` at ``path`` for this process and its workers (''
    clears it); an error text when the path cannot hold the store."""
    from optim.capacity import STORE_ENV
    if not path:
        os.environ.pop(STORE_ENV, None)
        return None
    p = Path(path)
    if p.exists() and not p.is_file():
        return f"--search-store {path}: not a file"
    if not p.parent.is_dir():
        return f"--search-store {path}: no folder {p.parent}"
    if p.exists():
        try:
            doc = json.loads(p.read_text() or "{}")
        except (OSError, ValueError) as e:
            return f"--search-store {path}: not a JSON object of search records ({e})"
        if not isinstance(doc, dict):
            return (f"--search-store {path}: not a JSON object of search records (a "
                    f"{type(doc).__name__}); left as it is")
    os.environ[STORE_ENV] = str(p.resolve())
    return None


def print_class_status(points, budget: int) -> None:
    """``--status`` of the studies: for each (label, instance, window, greedy's stored row or
    None) not certified, how far greedy is above its stored bound and, one above, where the
    class step that may raise the bound stands (``feasibility.class_search_status``: from the
    cache, nothing replayed); then one line of counts."""
    from collections import Counter

    from optim.feasibility import class_search_status
    n = Counter()
    for label, inst, dur, row in points:
        g = None if row is None else row.get("gpus")
        if row is None:
            n["not_stored"] += 1
            print(f"{label}: not stored (run the study)")
        elif g is None or g != g:
            n["failed"] += 1
            print(f"{label}: greedy found no accepted placement")
        elif int(g) == int(row["lb"]):
            n["certified"] += 1
        elif int(g) > int(row["lb"]) + 1:
            n["two_or_more_above"] += 1
            print(f"{label}: greedy {int(g)}, bound {int(row['lb'])}: two or more above (the "
                  "class step runs where greedy is one above)")
        else:
            n["one_above"] += 1
            st = class_search_status(inst, int(row["lb"]), dur, budget)
            print(f"{label}: greedy {int(g)}, bound {int(row['lb'])}: {st.describe()}")
    keys = ("certified", "one_above", "two_or_more_above", "failed", "not_stored")
    print(f"points={len(points)} " + " ".join(f"{k}={n[k]}" for k in keys))


def git_commit(mark_changes: bool = False) -> str:
    """The checkout's short commit hash (``unknown`` outside git); with ``mark_changes``,
    ``+changes`` appended when tracked files differ from it."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        if mark_changes:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=REPO, capture_output=True, text=True,
                                   timeout=10).stdout
            out += "+changes" if dirty.strip() else ""
        return out or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def shared_data_dir() -> Path:
    """The real-measurement folder: ``$LORA_SHARED_DATA`` or ``<repo>/../shared/data/vllm_h100``."""
    return Path(os.environ.get(SHARED_ENV, REPO.parent / "shared" / "data" / "vllm_h100"))


def require_file(path: str | Path, what: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: {what}: file not found: {p}")
    return p


def markdown_table(df) -> str:
    """A GitHub Markdown table (no tabulate dependency)."""
    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines)


def instance_point_key(inst, **options) -> str:
    """The key of a study's stored point: a hash of the instance's content, ``options`` (method,
    window, limits ...) and the twin's fingerprint of every profile, and under a client-view
    SLO the fitted latency-tail constants too (a twin change reruns the point; the row records
    the commit it was measured on)."""
    import hashlib
    from optim.capacity import slo_key, twin_fingerprint
    key = {"instance": inst.to_dict(), **options,
           "twin": [twin_fingerprint(t.load_profile()) for t in inst.gpu_types]}
    if inst.slo is not None:            # a client-view SLO: the latency tail's constants too
        key["slo"] = [slo_key(t.load_profile(), inst.slo) for t in inst.gpu_types]
    blob = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class RowStore:
    """Rows of finished points in a JSON-lines file, appended as each finishes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict] = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue             # a line cut by an interruption
                self.rows[rec["key"]] = rec["row"]

    def get(self, key: str) -> dict | None:
        return self.rows.get(key)

    def put(self, key: str, row: dict) -> None:
        self.rows[key] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"key": key, "row": row}, default=_plain) + "\n")


def _plain(x):
    """JSON form of numpy scalars (the rows hold some)."""
    import numpy as np
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    return str(x)
