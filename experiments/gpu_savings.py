"""GPU savings study: GPUs each method needs on the paper scenarios, twin-verified.

``python -m experiments.gpu_savings [--quick] [--json OUT] [--out-dir DIR] [--duration S]
[--store FILE] [--rebound ROWS] [--class-checks N] [--search-store FILE] [--status]``

For every instance of ``instances/paper`` (scenario = base model x rank set x rate set, growing
adapter counts) and every registered method (``--methods``; by default all but ``milp`` and
``cpsat``, whose models are meant for small instances — ``experiments.optimality_gap`` studies
them, and ``auto`` runs them where they apply):

* methods that size the fleet themselves (maxbase, maxbase-half, greedy, exact) are solved once
  and the placement replayed in the fleet twin; the GPU count is theirs when the twin accepts,
  and the method has *failed* at that point when any GPU starves or hits a memory error;
* a failed MaxBase / MaxBase* proposal is then scaled out as an operator would: the same rule
  (every adapter resident, load as the only criterion) over growing fleets (``n_gpus``, load
  balanced), and the first fleet the twin accepts is the GPUs that rule needs (column
  ``scaled_out``); the failure stays recorded;
* fixed-fleet methods (random, dlora, loraserve) are given fleets of growing size, starting from
  their own default (capacity bound, or LoRAServe's utilisation bound), and the first size the
  twin accepts is their GPU count; no accepted size within ``--max-extra`` GPUs is a failure.

Every instance also gets the twin-sound lower bound ``lb`` on the GPUs of *any* placement the
twin accepts with the same window (``optim.feasibility.twin_lower_bound``: the largest load an
unstarved GPU carries, measured with the verification seeds and a spread margin, one-adapter
and adapter-count-aware, then busiest- and fullest-GPU replays and, where two GPUs are left,
every split of adapters and load with up to ``--pair-checks`` GPU checks; then, toward the
best method's count, the exclusions without the load thresholds, ``raise_bound_to``: a count
at a time without the checked searches while it is two or more above, with them once one
above; ``point_bound``), and ``lb_one`` (the
one-adapter part alone). A method's count is *certified optimal* at a point when the twin accepts its own placement with ``lb`` GPUs.

MaxBase is reported both ways, each stated: ``maxbase`` is the GPUs its rule needs *scaled out*
until the twin accepts (its proposal, when accepted, else the first accepted larger fleet), and
``maxbase_strict`` is its own placement only (a starving point is a failure and has no count).
``maxbase_reduction_ceiling`` is the mean of ``(MaxBase scaled out - lb) / MaxBase`` over the
points where MaxBase has a count (no placement can save more on average), and
``greedy_gpus_above_bound`` sums ``greedy - lb``.

Writes ``gpu_savings.csv``, ``gpu_savings.md`` (GPUs per method, MaxBase strict, ``lb``; one row
per instance) and ``gpu_savings.png`` (GPUs vs adapters per scenario, the bound dashed) under
``--out-dir``, optionally all rows as JSON. The summary prints total GPUs per method (MaxBase
scaled out and strict, with its failures), the mean relative reduction of greedy over MaxBase
both ways, and ends with ``greedy_vs_maxbase_gpu_reduction=<pct> greedy_twin_failures=<k>
greedy_total_gpus=<n> certified_optimal=<c>/<points>`` (reduction over MaxBase scaled out;
``greedy_total_gpus`` sums greedy's twin-accepted counts; its failures are counted apart).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
from tqdm import tqdm

from optim.feasibility import raise_bound_to, twin_lower_bound
from optim.supply_exclusion import SUPPLY_CHECKS
from optim.instance import Instance, InstanceError, load_instance
from optim.methods import MethodOptions, get_method, method_names, solve

from .common import (COUNTING, REPO, RowStore, add_class_checks_option,
                     add_search_store_option, git_commit, instance_point_key,
                     print_class_status, use_search_store)

PAPER_DIR = REPO / "instances" / "paper"
EXACT_ONLY = ("milp", "cpsat")   # hundreds of adapters are beyond them; see optimality_gap
PAIR_CHECKS = 48                 # twin_lower_bound's two-GPU split checks per instance
SCALE_OUT = ("maxbase", "maxbase-half")     # self-sizing methods given larger fleets on failure
_NAME = re.compile(r"paper-(?P<model>\w+)-r(?P<ranks>\w+)-q(?P<rates>\w+)-n(?P<n>\d+)$")


def scenario_of(inst: Instance) -> dict:
    m = _NAME.match(inst.name)
    if not m:
        raise ValueError(f"{inst.name}: not a paper-scenario name")
    return {"model": m["model"], "ranks": m["ranks"], "rates": m["rates"], "n": int(m["n"]),
            "scenario": f"{m['model']}-r{m['ranks']}-q{m['rates']}"}


def gpus_needed(inst: Instance, method: str, duration_s: float, max_extra: int,
                workers: int | None) -> dict:
    """Twin-verified GPU count of ``method`` on ``inst`` (see module docstring)."""
    info = get_method(method)
    t0 = time.perf_counter()
    if not info.fixed_fleet:
        p = solve(inst, method, options=MethodOptions(extra=COUNTING), verify=True,
                  duration_s=duration_s, workers=workers)
        ok = bool(p.gpus) and p.verdict == "accepted" and p.status in ("solved", "optimal",
                                                                       "over_pool")
        bad = sum(1 for g in p.gpus if g.verified and not g.verified.ok)
        row = {"gpus": p.n_gpus if ok else None, "proposed_gpus": p.n_gpus, "failed": not ok,
               "twin_failed_gpus": bad, "tries": 1, "status": p.status, "scaled_out": False}
        if not ok and method in SCALE_OUT and p.gpus:
            more = _first_accepted(inst, method, p.n_gpus + 1, max_extra - 1, duration_s,
                                   workers)
            row.update(gpus=more["gpus"], tries=more["tries"], status=more["status"],
                       scaled_out=more["gpus"] is not None)
        return {**row, "wall_s": time.perf_counter() - t0}
    first = solve(inst, method, verify=False)
    start = int(first.params.get("n_gpus") or max(1, first.n_gpus))
    r = _first_accepted(inst, method, start, max_extra, duration_s, workers)
    return {**r, "proposed_gpus": start, "failed": r["gpus"] is None, "scaled_out": False,
            "wall_s": time.perf_counter() - t0}


def _first_accepted(inst: Instance, method: str, start: int, max_extra: int, duration_s: float,
                    workers: int | None) -> dict:
    """The first fleet size in ``start .. start + max_extra`` whose placement by ``method`` the
    twin accepts (``gpus`` None when there is none), the sizes tried, and the twin-rejected GPUs
    of the first size."""
    bad_first = None
    for tries, n in enumerate(range(start, start + max_extra + 1), start=1):
        p = solve(inst, method, options=MethodOptions(n_gpus=n, extra=COUNTING),
                  verify=True, duration_s=duration_s, workers=workers)
        if bad_first is None:
            bad_first = sum(1 for g in p.gpus if g.verified and not g.verified.ok)
        if p.gpus and p.verdict == "accepted":
            return {"gpus": p.n_gpus, "twin_failed_gpus": bad_first, "tries": tries,
                    "status": p.status}
    return {"gpus": None, "twin_failed_gpus": bad_first, "tries": max_extra + 1,
            "status": "no accepted fleet"}


def select_instances(paths: list[Path], quick: bool,
                     positions: Sequence[int] = (0, 1, 2, 3)) -> list[Path]:
    """All paper instances, or for ``--quick`` the Llama scenarios at the ``positions`` of
    their adapter counts in increasing order (default: the 4 smallest)."""
    if not quick:
        return paths
    by_scen: dict[str, list[tuple[int, Path]]] = {}
    for p in paths:
        m = _NAME.match(p.stem)
        if m and m["model"] == "llama":
            by_scen.setdefault(f"{m['ranks']}-{m['rates']}", []).append((int(m["n"]), p))
    return [p for v in by_scen.values() for i, (_, p) in enumerate(sorted(v)) if i in positions]


def reduction(df: pd.DataFrame, a: str = "greedy", b: str = "maxbase", strict: bool = False
              ) -> tuple[float | None, int]:
    """Mean relative GPU reduction of ``a`` over ``b`` on the points where both have a
    twin-accepted count (``strict``: only where neither failed its own proposal) and the
    number of twin failures of ``a``."""
    if a not in set(df["method"]):
        return None, 0
    piv = df.pivot_table(index="instance", columns="method", values="gpus", aggfunc="first")
    if strict:
        own_ok = df[~df["failed"].astype(bool)].pivot_table(
            index="instance", columns="method", values="gpus", aggfunc="first")
        piv = own_ok.reindex(columns=piv.columns)
    fails = int(df[(df["method"] == a)]["failed"].sum())
    if a not in piv or b not in piv:
        return None, fails
    both = piv[[a, b]].dropna()
    if both.empty:
        return None, fails
    return float(((both[b] - both[a]) / both[b]).mean() * 100.0), fails


def reduction_ceiling(df: pd.DataFrame, b: str = "maxbase") -> float | None:
    """Mean of ``(b - lb) / b`` over the points where ``b`` has a twin-accepted count: the
    largest mean reduction over ``b`` any placement could reach on these points."""
    part = df[(df["method"] == b) & df["gpus"].notna()]
    if part.empty:
        return None
    return float(((part["gpus"] - part["lb"]) / part["gpus"]).mean() * 100.0)


def above_bound(df: pd.DataFrame, a: str = "greedy") -> int | None:
    """Sum over points of ``a``'s twin-accepted GPUs minus the lower bound."""
    part = df[(df["method"] == a) & df["gpus"].notna()]
    return None if part.empty else int((part["gpus"] - part["lb"]).sum())


def total_gpus(df: pd.DataFrame, a: str, strict: bool = False) -> tuple[int | None, int]:
    """(sum of ``a``'s twin-accepted GPU counts, points without one). ``strict``: only ``a``'s
    own placements count (a scaled-out count is a failure, as is any rejected proposal)."""
    part = df[df["method"] == a]
    if part.empty:
        return None, 0
    ok = part[~part["failed"].astype(bool)] if strict else part[part["gpus"].notna()]
    return int(ok["gpus"].sum()), int(len(part) - len(ok))


def certified(df: pd.DataFrame, a: str = "greedy") -> int:
    """Points where ``a``'s own twin-accepted placement uses exactly ``lb`` GPUs (optimal in
    the twin)."""
    part = df[(df["method"] == a) & ~df["failed"].astype(bool) & df["gpus"].notna()]
    return int((part["gpus"] == part["lb"]).sum())


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = sorted(df["scenario"].unique())
    cols = 3
    rows = (len(scen) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    methods = sorted(df["method"].unique())
    for ax, s in zip(axes.flat, scen):
        part = df[df["scenario"] == s]
        for m in methods:
            d = part[part["method"] == m].sort_values("n")
            ax.plot(d["n"], d["gpus"], marker="o", ms=3, label=m)
            f = d[d["failed"]]
            if not f.empty:
                ax.scatter(f["n"], f["proposed_gpus"], marker="x", color="k", s=18)
        lb = part.drop_duplicates("instance").sort_values("n")
        ax.plot(lb["n"], lb["lb"], ls="--", color="k", lw=1, label="lower bound")
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("adapters", fontsize=8)
        ax.set_ylabel("GPUs (twin-verified)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(scen):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("GPUs needed per method (x = twin-rejected proposal)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def point_key(inst, method: str, duration_s: float, max_extra: int, pair_checks: int) -> str:
    """What a stored point depends on (``common.instance_point_key``): instance content,
    method, window, options, the twin's fingerprint (and an SLO's latency-tail constants)."""
    return instance_point_key(inst, method=method, duration_s=duration_s, max_extra=max_extra,
                              pair_checks=pair_checks)


def stored_rows(path: Path, quick: bool, methods: str | None) -> pd.DataFrame:
    """The latest stored row of each (instance, method) in a ``--store`` file, of the quick
    study's 600 s window with ``quick`` and of the full study's windows without it, restricted
    to ``methods`` (comma list) when given."""
    if not path.is_file():
        raise OSError(f"no such file: {path}")
    want = set(methods.split(",")) if methods else None
    last: dict[tuple[str, str], dict] = {}
    for r in RowStore(path).rows.values():
        if (float(r["duration_s"]) == 600.0) == quick and (want is None or r["method"] in want):
            last[(r["instance"], r["method"])] = r
    if not last:
        raise ValueError(f"{path}: no stored rows of the {'quick' if quick else 'full'} study")
    return pd.DataFrame(list(last.values()))


def accepted_counts(rows: Sequence[dict]) -> list[int]:
    """The GPU counts of the rows that have one (a failed method has none)."""
    return [int(r["gpus"]) for r in rows if r.get("gpus") == r.get("gpus")
            and r.get("gpus") is not None]


def point_bound(inst: Instance, bound, counts: Sequence[int], duration_s: float,
                workers: int | None, class_checks: int | None = None) -> int:
    """The point's ``lb``: the twin lower bound, raised by the exclusions of
    ``feasibility.raise_bound_to`` without the bound's load thresholds — the same for a solve
    and for ``--rebound``. Where the best count is two or more above, one count at a time
    without the checked searches (the count-partition bound, the fullest and busiest GPU, the
    pair steps at two, the class step's caps and supply, the searches' cached successes):
    each step excludes ``lb`` GPUs where fewer are already excluded, so ``lb + 1`` is a bound.
    Where it is (then) one above, with the checked searches as well (the class step with
    ``class_checks`` GPU checks, default ``class_exclusion.CLASS_CHECKS``)."""
    lb = bound.best
    if not counts:
        return lb
    best = min(counts)
    while lb + 1 < best:
        up = raise_bound_to(inst, lb, lb + 1, duration_s, workers, 0, full_counts=True,
                            class_checks=0)
        if up == lb:
            return lb
        lb = up
    if best == lb + 1:
        return raise_bound_to(inst, lb, best, duration_s, workers, SUPPLY_CHECKS,
                              full_counts=True, class_checks=class_checks)
    return lb


def rebound(inst: Instance, part, workers: int | None, pair_checks: int,
            class_checks: int | None = None) -> tuple[int, int]:
    """(lb, lb_one) of one instance's stored rows ``part`` with the current code."""
    dur = float(part["duration_s"].iloc[0])
    b = twin_lower_bound(inst, dur, workers, pair_checks, full_counts=True)
    return point_bound(inst, b, accepted_counts(part.to_dict(orient="records")), dur,
                       workers, class_checks), b.one_adapter


def solve_point(inst: Instance, methods: Sequence[str], duration_s: float, max_extra: int,
                pair_checks: int, workers: int | None, store: RowStore | None, head: dict,
                commit: str, keep_bound: bool = False,
                class_checks: int | None = None) -> list[dict]:
    """Every method's row at one instance (``gpus_needed``; ``head`` starts each row), with
    the twin lower bound ``lb`` and ``lb_one``; rows already in ``store`` are taken from it and
    new ones appended. The bound is raised toward the best count (``point_bound``), which
    may certify it.
    ``keep_bound``: a point with a stored row of another method takes ``lb`` and ``lb_one``
    from it instead (the bound is the point's, not the method's; ``--rebound`` recomputes it),
    so rerunning one method spares the bound's exclusion searches."""
    keys = {m: point_key(inst, m, duration_s, max_extra, pair_checks) for m in methods}
    stored = {m: store.get(k) if store is not None else None for m, k in keys.items()}
    if all(r is not None for r in stored.values()):
        return [stored[m] for m in methods]
    known = [r for r in stored.values() if r is not None]
    bound = None
    if keep_bound and known:
        lb, one = int(known[0]["lb"]), int(known[0]["lb_one"])
    else:
        bound = twin_lower_bound(inst, duration_s, workers, pair_checks, full_counts=True)
        lb, one = bound.best, bound.one_adapter
    mine = []
    for m in methods:
        row = stored[m]
        if row is None:
            row = {**head, "lb": lb, "lb_one": one, "method": m, "duration_s": duration_s,
                   **gpus_needed(inst, m, duration_s, max_extra, workers), "commit": commit}
            if bound is None:           # the bound is settled: stored as it finishes
                store.put(keys[m], row)
        mine.append(row)
    if bound is None:
        return mine
    lb = point_bound(inst, bound, accepted_counts(mine), duration_s, workers, class_checks)
    if lb != bound.best:
        mine = [{**r, "lb": lb} for r in mine]
    for m, row in zip(methods, mine):
        if store is not None and stored[m] is None:
            store.put(keys[m], row)
    return mine


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu_savings",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="Llama scenarios, 4 smallest counts each, 600 s twin window")
    ap.add_argument("--json", default=None, help="write every row as JSON")
    ap.add_argument("--out-dir", default=str(REPO / "results" / "gpu_savings"))
    ap.add_argument("--instances", default=str(PAPER_DIR))
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window in s (default: 600 with --quick, else the instance's)")
    ap.add_argument("--max-extra", type=int, default=8,
                    help="fixed-fleet methods: largest fleet tried = start + this")
    ap.add_argument("--methods", default=None,
                    help="comma-separated methods (default: every registered method but milp "
                         "and cpsat, which experiments.optimality_gap studies; auto stands for "
                         "them)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--match", default=None,
                    help="only the instances whose name contains this (with --rebound: only "
                         "their stored rows are bounded again; the others stay as stored)")
    ap.add_argument("--pair-checks", type=int, default=PAIR_CHECKS,
                    help="GPU checks the bound may spend showing that no split over two GPUs "
                         "is accepted, where two are left (0: skip; default %(default)s)")
    add_class_checks_option(ap)
    add_search_store_option(ap)
    ap.add_argument("--status", action="store_true",
                    help="solve nothing: for each stored point greedy has not certified, how "
                         "far it is above its bound and where the class step stands (from "
                         "the cache)")
    ap.add_argument("--store", default=str(REPO / "experiments" / "evidence" /
                                           "gpu_savings_points.jsonl"),
                    help="each point's row is appended here as it finishes (a committed file: "
                         "a later session continues the study), keyed by instance, method, "
                         "window, options and the twins' fingerprints (the row records its "
                         "commit); a rerun takes the stored rows; '' turns it off")
    ap.add_argument("--rebound", default=None, metavar="ROWS.json",
                    help="no solving: read the rows an earlier run wrote with --json (or the "
                         "latest stored rows of a --store .jsonl file), recompute "
                         "each instance's lower bound (same window) with the current code, and "
                         "write and print the figures again; a stored point of --store whose "
                         "bound changed is stored again with the new one")
    a = ap.parse_args(argv)
    if (err := use_search_store(a.search_store)) is not None:
        print(f"error: {err}", file=sys.stderr)
        return 2

    if a.pair_checks < 0:
        print(f"error: --pair-checks must be >= 0, got {a.pair_checks}", file=sys.stderr)
        return 2
    paths = sorted(Path(a.instances).glob("paper-*.json"))
    if not paths:
        print(f"error: no paper instances under {a.instances}", file=sys.stderr)
        return 2
    paths = select_instances(paths, a.quick)
    if a.match is not None:
        paths = [p for p in paths if a.match in p.stem]
        if not paths:
            print(f"error: --match {a.match!r}: no paper instance under {a.instances} has it "
                  "in its name", file=sys.stderr)
            return 2
    try:                               # every file checked before any work
        loaded = {p: load_instance(p) for p in paths}
    except InstanceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.status:
        store = RowStore(Path(a.store)) if a.store else None
        pts = []
        for p in paths:
            inst = loaded[p]
            dur = a.duration if a.duration is not None else (600.0 if a.quick else inst.duration_s)
            key = point_key(inst, "greedy", dur, a.max_extra, a.pair_checks)
            pts.append((inst.name, inst, dur, store.get(key) if store is not None else None))
        print_class_status(pts, a.class_checks)
        return 0
    methods = (a.methods.split(",") if a.methods
               else [m for m in method_names() if m not in EXACT_ONLY])
    for m in methods:
        get_method(m)
    rows = []
    t0 = time.perf_counter()
    if a.rebound is not None:
        try:
            old = (stored_rows(Path(a.rebound), a.quick, a.methods)
                   if str(a.rebound).endswith(".jsonl")
                   else pd.read_json(Path(a.rebound), orient="records"))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --rebound {a.rebound}: cannot read rows ({e})", file=sys.stderr)
            return 2
        if a.match is not None and "instance" in old.columns:
            old = old[old["instance"].astype(str).str.contains(a.match, regex=False)]
        missing = {"instance", "method", "gpus", "failed", "duration_s"} - set(old.columns)
        if missing:
            print(f"error: --rebound {a.rebound}: rows lack {sorted(missing)}", file=sys.stderr)
            return 2
        if old.empty:
            print(f"error: --rebound {a.rebound}: no stored rows"
                  + (f" of an instance matching {a.match!r}" if a.match is not None else ""),
                  file=sys.stderr)
            return 2
        by_name = {loaded[p].name: p for p in paths}
        unknown = sorted(set(old["instance"]) - set(by_name))
        if unknown:
            print(f"error: --rebound: instances not under {a.instances}: {unknown[:5]}",
                  file=sys.stderr)
            return 2
        methods = list(dict.fromkeys(old["method"]))
        paths = [by_name[n] for n in dict.fromkeys(old["instance"])]
        kept = RowStore(Path(a.store)) if a.store else None
        for name, part in tqdm(old.groupby("instance", sort=False), desc="bounds", unit="inst"):
            inst = loaded[by_name[name]]
            lb, one = rebound(inst, part, a.workers, a.pair_checks, a.class_checks)
            new = [{**r, "lb": lb, "lb_one": one} for r in part.to_dict(orient="records")]
            rows += new
            for r in new if kept is not None else ():
                key = point_key(inst, r["method"], float(r["duration_s"]), a.max_extra,
                                a.pair_checks)
                was = kept.get(key)
                if was is not None and (was.get("lb"), was.get("lb_one")) != (lb, one):
                    kept.put(key, {**was, "lb": lb, "lb_one": one})
        paths_iter: list[Path] = []
    else:
        paths_iter = paths
    store = RowStore(Path(a.store)) if a.store else None
    commit = git_commit()
    for path in tqdm(paths_iter, desc="instances", unit="inst"):
        inst = loaded[path]
        dur = a.duration if a.duration is not None else (600.0 if a.quick else inst.duration_s)
        sc = scenario_of(inst)
        rows += solve_point(inst, methods, dur, a.max_extra, a.pair_checks, a.workers, store,
                            {"instance": inst.name, **sc}, commit,
                            class_checks=a.class_checks)
    df = pd.DataFrame(rows)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "gpu_savings.csv", index=False)
    def cell(r) -> str:
        if r["gpus"] is None or r["gpus"] != r["gpus"]:
            return "fail"
        return f"{int(r['gpus'])}*" if r["failed"] else f"{int(r['gpus'])}"

    shown = df.assign(cell=df.apply(cell, axis=1))
    mb = df[df["method"] == "maxbase"]
    if not mb.empty:                  # MaxBase strict: its own placement, or "starved"
        strict_cells = mb.assign(method="maxbase_strict", cell=[
            "starved" if f else str(int(g)) for f, g in zip(mb["failed"], mb["proposed_gpus"])])
        shown = pd.concat([shown, strict_cells], ignore_index=True)
    piv = shown.pivot_table(index=["scenario", "n", "lb"], columns="method", values="cell",
                            aggfunc="first").reset_index()
    fails = df[df["failed"]].groupby("method").size().to_dict()
    md = ["| " + " | ".join(map(str, piv.columns)) + " |",
          "|" + "---|" * len(piv.columns)]
    for _, row in piv.iterrows():
        md.append("| " + " | ".join(str(v) for v in row.values) + " |")
    md.append("")
    md.append("`k*`: the method's own placement starved on the twin; k GPUs is the first fleet "
              "its rule, scaled out, gets accepted with (column `maxbase`: MaxBase scaled out). "
              "`maxbase_strict`: MaxBase's own placement only (`starved`: the twin rejects it). "
              "`fail`: no accepted placement. `lb`: twin-sound lower bound on the GPUs of any "
              "placement the twin accepts.")
    md.append("Own placements rejected by the twin, per method: "
              + ", ".join(f"{m}={fails.get(m, 0)}" for m in methods))
    (out / "gpu_savings.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    plot(df, out / "gpu_savings.png")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(df.to_json(orient="records", indent=1), encoding="utf-8")
    print("\n".join(md))
    means = df.groupby("method")["gpus"].mean()
    print("mean GPUs where accepted: " + ", ".join(f"{m}={means.get(m, float('nan')):.2f}"
                                                   for m in methods))
    for m in methods:
        tot, miss = total_gpus(df, m)
        print(f"{m}_total_gpus={tot} (points without an accepted count: {miss})")
    if "maxbase" in methods:
        strict_tot, strict_fail = total_gpus(df, "maxbase", strict=True)
        n_pts = df["instance"].nunique()
        print(f"maxbase_strict_total_gpus={strict_tot} over the {n_pts - strict_fail} points "
              f"where its own placement is accepted; maxbase_strict_failures={strict_fail} "
              f"(its own placement starves)")
    for m in methods:
        if m == "maxbase":
            continue
        red, k = reduction(df, m, "maxbase")
        if red is not None:
            print(f"{m}_vs_maxbase_gpu_reduction={red:.1f}% {m}_twin_failures={k} "
                  "(MaxBase scaled out)")
    print(f"wrote {out}/gpu_savings.csv, .md, .png in {time.perf_counter() - t0:.0f}s")
    ceiling, above = reduction_ceiling(df), above_bound(df)
    if ceiling is not None:
        print(f"maxbase_reduction_ceiling={ceiling:.1f} (no placement can save more over MaxBase "
              "scaled out on average at these points)")
    if above is not None:
        print(f"greedy_gpus_above_bound={above} (over {df['instance'].nunique()} instances)")
    strict, _ = reduction(df, strict=True)
    if strict is not None:
        print(f"greedy_vs_maxbase_strict_gpu_reduction={strict:.1f} (only the points where "
              "MaxBase's own placement is accepted)")
    red, k = reduction(df)
    n_pts = df["instance"].nunique()
    tot, _ = total_gpus(df, "greedy")
    if red is None and tot is None:
        print("note: no 'greedy' method was run; its figures are n/a")
        print(f"greedy_vs_maxbase_gpu_reduction=n/a greedy_twin_failures=n/a "
              f"greedy_total_gpus=n/a certified_optimal=n/a/{n_pts}")
    else:
        red_s = "n/a" if red is None else f"{red:.1f}"
        print(f"greedy_vs_maxbase_gpu_reduction={red_s} greedy_twin_failures={k} "
              f"greedy_total_gpus={tot} certified_optimal={certified(df)}/{n_pts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
