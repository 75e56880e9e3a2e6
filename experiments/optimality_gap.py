"""Optimality-gap study: heuristics vs. exact optima on ``instances/small`` (bounds on medium ones).

``python -m experiments.optimality_gap [--quick] [--json OUT] [--time-limit S] [--duration S]``

For every small instance (objective ``gpus``: the study measures GPU counts; cost and latency
instances are solved for GPUs too): the solver-independent lower bounds (L1, Martello–Toth L2,
LP relaxation), MILP and CP-SAT with the twin in the loop, greedy (when registered) and each
sizing baseline (maxbase, maxbase-half), every final placement verified in the fleet twin.
Gap of a method = GPUs(method) - proven optimum (or - best lower bound when none is proven);
a method whose placement the twin rejects is reported with its verdict.

"Proven optimum": an exact method finished with status optimal *and* the twin accepted its
placement. Optimal is relative to the encodable surrogate as corrected by the twin's capacity
cuts (``optim.exact.loop``) — no placement with fewer GPUs satisfies the capacity model with the
cuts found so far; it is a proof about the surrogate, which the twin has checked at the
optimum, not about the twin itself. ``greedy-cap`` packs with that same surrogate and skips
the twin-guided compaction, so its gap is a gap of the algorithm alone (DESIGN.md section 5);
``greedy`` is the shipped default (fast surrogate, twin repair and compaction), which chooses
Amax values off the surrogates' grid and so can use *fewer* GPUs than the surrogate's optimum
(a negative gap: the proof is about the surrogate). Every instance also gets the twin lower
bound ``twin_lb`` (``optim.feasibility.lora_gpu_lower_bound``), which holds for the twin itself:
a twin-accepted placement with that many GPUs is optimal for the twin (``twin_optimal``; where the
fewest accepted GPUs are one above it, the bound is raised by the exclusions behind a method's
"optimal in the twin" claim, ``raise_bound_to``); ``twin_proven`` counts those instances.
Medium instances
(``instances/paper`` with 96-160 adapters) get bounds and a time-limited CP-SAT bound only.

**Paper instances** with at most 160 adapters (78; ``--quick``: 10): greedy (verified), then
MILP and CP-SAT with a 120 s limit each, started from greedy's placement, twin in the loop.
Counted: runs whose final placement the twin accepts, and *false optima* — a result with status
``optimal`` while a twin-accepted placement with fewer GPUs is known.

Writes ``<out-dir>/optimality_gap.{csv,md,png}``, ``optimality_gap_paper.{csv,md}`` (and
``--json``); the last line is ``instances=<n> proven_optimal=<k> twin_proven=<t>/<n>
greedy_mean_gap=<g> greedy_optimal_share=<p> paper_exact_twin_accepted=<a>/<runs> false_optimal=<f>
paper_over_time_limit=<o>``.
Each instance's row is stored as it finishes (``--store``, default ``<out-dir>/points.jsonl``),
keyed by the instance, part, time limit, window and the twin's fingerprint, so a stopped run
continues where it stopped; ``--no-store`` measures everything again.
``--quick``: 12 small instances, a 20 s limit per solve; the twin window is 600 s in both modes
(shorter windows count the requests still in flight at the end as lost and call GPUs near
capacity starving).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from experiments.common import COUNTING, RowStore, instance_point_key, markdown_table

REPO = Path(__file__).resolve().parents[1]
SMALL_DIR = REPO / "instances" / "small"
MEDIUM = ("paper-llama-rmixed-qhigh-n96", "paper-qwen-rmixed-qhigh-n128",
          "paper-llama-rhigh-qhigh-n160")
# study name -> (registered method, method options): greedy as shipped (fast surrogate, twin
# compaction) and greedy packing with the encodable capacity model the exact methods encode,
# without compaction (DESIGN.md section 5)
PAPER_MAX_ADAPTERS = 160
PAPER_TIME_LIMIT_S = 120.0
HEURISTICS = {"greedy": ("greedy", {}),
              "greedy-cap": ("greedy", {"surrogate": "capacity", "compact": False}),
              "maxbase": ("maxbase", {}), "maxbase-half": ("maxbase-half", {})}


def _row_method(p, name: str) -> dict:
    return {f"{name}_gpus": p.n_gpus if p.gpus else None, f"{name}_status": p.status,
            f"{name}_verdict": p.verdict, f"{name}_time_s": round(p.wall_time_s, 3)}


def _stored(store: RowStore | None, inst, part: str, time_limit: float, duration: float
            ) -> tuple[str | None, dict | None]:
    """(key, stored row) of an instance in ``store``: the key hashes the instance, the study
    part, the time limit, the window and the twin's fingerprint (``common.instance_point_key``;
    a twin change reruns the instance, a code change does not: start a new ``--store`` to
    measure the code anew). (None, None) without a store."""
    if store is None:
        return None, None
    key = instance_point_key(inst, part=part, time_limit=time_limit, duration=duration)
    return key, store.get(key)


def run(quick: bool, time_limit: float, duration: float, out_dir: Path, json_out: str | None,
        workers: int | None, parts: tuple[str, ...] = ("small", "paper"),
        store: RowStore | None = None) -> int:
    from tqdm import tqdm

    from optim.exact.bounds import lower_bounds
    from optim.exact.capacity import build_problem
    from optim.exact.cpsat import solve_cpsat
    from optim.feasibility import lora_gpu_lower_bound, raise_bound_to
    from optim.supply_exclusion import SUPPLY_CHECKS
    from optim.instance import load_instance
    from optim.methods import MethodOptions, method_names, solve

    files = sorted(SMALL_DIR.glob("*.json")) if "small" in parts else []
    if quick:
        files = files[::3]
    heur = [h for h, (m, _) in HEURISTICS.items() if m in method_names()]
    rows = []
    for f in tqdm(files, desc="small instances", file=sys.stderr):
        inst = load_instance(f)
        key, hit = _stored(store, inst, "small", time_limit, duration)
        if hit is not None:
            rows.append(hit)
            continue
        row = {"instance": inst.name, "adapters": len(inst.adapters),
               "pool": inst.total_gpus_available, "kind": "small"}
        P = build_problem(inst, "gpus")
        b = lower_bounds(P, lp=True, time_limit_s=min(10.0, time_limit))
        row.update({"lb_l1": b.l1, "lb_l2": b.l2, "lb_lp": None if b.lp is None else round(b.lp, 3),
                    "lower_bound": int(b.best), "twin_lb": lora_gpu_lower_bound(inst, duration)})
        opts = MethodOptions(time_limit_s=time_limit, extra=COUNTING)
        for m in ("milp", "cpsat"):
            p = solve(inst, m, objective="gpus", options=opts, verify=True,
                      duration_s=duration, workers=workers)
            row.update(_row_method(p, m))
            row[f"{m}_solver_status"] = p.params.get("status")
            row[f"{m}_bound"] = p.params.get("best_bound")
            row[f"{m}_iterations"] = p.params.get("n_iterations")
            row[f"{m}_cuts"] = p.params.get("n_cuts")
            row[f"{m}_solve_time_s"] = round(p.params.get("solve_time_s") or 0.0, 3)
        for h in heur:
            method, extra = HEURISTICS[h]
            try:
                p = solve(inst, method, objective="gpus",
                          options=MethodOptions(extra={**COUNTING, **extra}),
                          verify=True, duration_s=duration, workers=workers)
            except ValueError as e:        # e.g. greedy without a trained surrogate
                row.update({f"{h}_gpus": None, f"{h}_status": "error", f"{h}_verdict": None,
                            f"{h}_error": str(e)[:200]})
                continue
            row.update(_row_method(p, h))
        proven = [row[f"{m}_gpus"] for m in ("milp", "cpsat")
                  if row[f"{m}_status"] == "optimal" and row[f"{m}_verdict"] == "accepted"]
        row["proven_optimum"] = min(proven) if proven else None
        row["exact_agree"] = len(set(proven)) <= 1
        accepted = [row[f"{m}_gpus"] for m in ("milp", "cpsat", *heur)
                    if row.get(f"{m}_verdict") == "accepted" and row.get(f"{m}_gpus")]
        if accepted:    # the certificate's exclusions, where the fewest are one above the bound
            row["twin_lb"] = raise_bound_to(inst, row["twin_lb"], min(accepted), duration,
                                            workers, SUPPLY_CHECKS)
        row["twin_optimal"] = bool(accepted) and min(accepted) == row["twin_lb"]
        ref = row["proven_optimum"] if proven else row["lower_bound"]
        for m in ("milp", "cpsat", *heur):
            g = row.get(f"{m}_gpus")
            row[f"{m}_gap"] = None if g is None or ref is None else g - ref
        rows.append(row)
        if key is not None:
            store.put(key, row)
    for name in (MEDIUM[:1 if quick else len(MEDIUM)] if "small" in parts else ()):
        f = REPO / "instances" / "paper" / f"{name}.json"
        if not f.is_file():
            continue
        inst = load_instance(f)
        P = build_problem(inst, "gpus")
        b = lower_bounds(P, lp=True, time_limit_s=min(10.0, time_limit))
        r = solve_cpsat(P, time_limit_s=time_limit)
        rows.append({"instance": inst.name, "adapters": len(inst.adapters), "kind": "medium",
                     "lb_l1": b.l1, "lb_l2": b.l2,
                     "lb_lp": None if b.lp is None else round(b.lp, 3),
                     "lower_bound": int(max(b.best, r.bound or 0)),
                     "cpsat_gpus": len(r.gpus) if r.gpus else None,
                     "cpsat_solver_status": r.status, "cpsat_solve_time_s": round(r.solve_time_s, 3),
                     "cpsat_verdict": None})
    paper = paper_rows(quick, duration, workers, store) if "paper" in parts else []
    return finish(rows, heur, out_dir, json_out, quick, time_limit, duration, paper)


def paper_files(quick: bool) -> list[Path]:
    """Paper instances with at most ``PAPER_MAX_ADAPTERS`` adapters (``--quick``: every
    eighth of them)."""
    files = sorted(f for f in (REPO / "instances" / "paper").glob("paper-*.json")
                   if int(f.stem.rsplit("-n", 1)[1]) <= PAPER_MAX_ADAPTERS)
    return files[::8] if quick else files


def paper_rows(quick: bool, duration: float, workers: int | None,
               store: RowStore | None = None) -> list[dict]:
    """Both exact methods (``PAPER_TIME_LIMIT_S`` each, twin in the loop) on the paper
    instances with <= 160 adapters, started from greedy's twin-verified placement (run once per
    instance and handed to both). A result is a *false optimal* when it claims optimality
    (status ``optimal``) while a twin-accepted placement with fewer GPUs is known (greedy's or
    the other method's)."""
    from tqdm import tqdm

    from optim.feasibility import lora_gpu_lower_bound
    from optim.instance import load_instance
    from optim.methods import MethodOptions, solve

    rows = []
    for f in tqdm(paper_files(quick), desc="paper instances (<= 160 adapters)", file=sys.stderr):
        inst = load_instance(f)
        key, hit = _stored(store, inst, "paper", PAPER_TIME_LIMIT_S, duration)
        if hit is not None:
            rows.append(hit)
            continue
        row = {"instance": inst.name, "adapters": len(inst.adapters), "kind": "paper",
               "twin_lb": lora_gpu_lower_bound(inst, duration)}
        g = solve(inst, "greedy", objective="gpus", options=MethodOptions(extra=COUNTING),
                  verify=True, duration_s=duration, workers=workers)
        row.update(_row_method(g, "greedy"))
        for m in ("milp", "cpsat"):
            p = solve(inst, m, objective="gpus",
                      options=MethodOptions(time_limit_s=PAPER_TIME_LIMIT_S,
                                            extra={"incumbent": g, **COUNTING}),
                      verify=True, duration_s=duration, workers=workers)
            row.update(_row_method(p, m))
            row[f"{m}_claim"] = p.params.get("claim")
            row[f"{m}_bound"] = p.best_bound
            row[f"{m}_in_limit"] = p.wall_time_s <= max(1.1 * PAPER_TIME_LIMIT_S,
                                                        PAPER_TIME_LIMIT_S + 2.0)
        accepted = [row[f"{m}_gpus"] for m in ("greedy", "milp", "cpsat")
                    if row.get(f"{m}_verdict") == "accepted" and row.get(f"{m}_gpus")]
        best = min(accepted) if accepted else None
        row["best_accepted"] = best
        for m in ("milp", "cpsat"):
            row[f"{m}_false_optimal"] = bool(row[f"{m}_status"] == "optimal" and best is not None
                                             and best < row[f"{m}_gpus"])
        rows.append(row)
        if key is not None:
            store.put(key, row)
    return rows


def finish(rows, heur, out_dir: Path, json_out, quick, time_limit, duration,
           paper: list[dict] | None = None) -> int:
    import pandas as pd
    out_dir.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["instance", "kind",
                                                               "lower_bound"])
    df.to_csv(out_dir / "optimality_gap.csv", index=False)
    cols = ["instance", "adapters", "lower_bound", "proven_optimum", "twin_lb"]
    for m in ("milp", "cpsat", *heur):
        cols += [c for c in (f"{m}_gpus", f"{m}_gap", f"{m}_solve_time_s" if m in ("milp", "cpsat")
                             else f"{m}_time_s", f"{m}_verdict") if c in df.columns]
    md = markdown_table(df[[c for c in cols if c in df.columns]])
    (out_dir / "optimality_gap.md").write_text(
        f"# Optimality gap (quick={quick}, time limit {time_limit:g} s, twin window "
        f"{duration:g} s)\n\n{md}\n")
    small = df[df["kind"] == "small"]
    n = len(small)
    k = int(small["proven_optimum"].notna().sum()) if n else 0
    if "greedy_gap" in small:
        gg = small["greedy_gap"].dropna()
        gmean = float(gg.mean()) if len(gg) else float("nan")
        gshare = float((gg == 0).mean()) if len(gg) else float("nan")
    else:
        gmean = gshare = float("nan")
    if n:
        _plot(small, heur, out_dir / "optimality_gap.png")
    if json_out:
        Path(json_out).write_text(df.to_json(orient="records", indent=1))
    print(f"wrote {out_dir / 'optimality_gap.csv'}, .md" + (", .png" if n else ""))
    if "twin_optimal" in small and n:
        below = (int((pd.to_numeric(small["greedy_gap"], errors="coerce") < 0).sum())
                 if "greedy_gap" in small else 0)
        print(f"twin_optimal={int(small['twin_optimal'].sum())} (a twin-accepted placement "
              f"meets the twin lower bound) greedy_below_surrogate_optimum={below}")
    tail = ""
    if paper:
        pdf = pd.DataFrame(paper)
        pdf.to_csv(out_dir / "optimality_gap_paper.csv", index=False)
        pcols = ["instance", "adapters", "twin_lb", "best_accepted"] + [
            f"{m}_{c}" for m in ("greedy", "milp", "cpsat")
            for c in ("gpus", "verdict", "status", "claim", "time_s") if f"{m}_{c}" in pdf]
        (out_dir / "optimality_gap_paper.md").write_text(
            f"# Exact methods on the paper instances with <= {PAPER_MAX_ADAPTERS} adapters "
            f"({PAPER_TIME_LIMIT_S:g} s limit, twin window {duration:g} s)\n\n"
            + markdown_table(pdf[pcols]) + "\n")
        runs = 2 * len(pdf)
        acc = int(sum((pdf[f"{m}_verdict"] == "accepted").sum() for m in ("milp", "cpsat")))
        false_opt = int(sum(pdf[f"{m}_false_optimal"].sum() for m in ("milp", "cpsat")))
        over = int(sum((~pdf[f"{m}_in_limit"]).sum() for m in ("milp", "cpsat")))
        print(f"wrote {out_dir / 'optimality_gap_paper.csv'}, .md")
        tail = (f" paper_exact_twin_accepted={acc}/{runs} false_optimal={false_opt}"
                f" paper_over_time_limit={over}")
    twin_k = int(small["twin_optimal"].sum()) if n and "twin_optimal" in small else 0
    print(f"instances={n} proven_optimal={k} twin_proven={twin_k}/{n} greedy_mean_gap={gmean:.3f} "
          f"greedy_optimal_share={gshare:.3f}{tail}")
    return 0


def _plot(df, heur, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(df) + 2), 4))
    x = range(len(df))
    ax.plot(x, df["lower_bound"], "k_", ms=14, mew=2, label="lower bound")
    if "proven_optimum" in df:
        ax.plot(x, df["proven_optimum"], "o", mfc="none", mec="k", ms=10, label="proven optimum")
    marks = {"milp": "s", "cpsat": "D", "greedy": "^", "greedy-cap": "v", "maxbase": "x",
             "maxbase-half": "+"}
    for i, m in enumerate(("milp", "cpsat", *heur)):
        if f"{m}_gpus" in df:
            ax.plot([v + 0.08 * (i - 2) for v in x], df[f"{m}_gpus"], marks.get(m, "."),
                    label=m, alpha=0.8)
    ax.set_xticks(list(x))
    ax.set_xticklabels(df["instance"].str.replace("small-", "").str.slice(0, 14), rotation=70,
                       fontsize=7)
    ax.set_ylabel("GPUs")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.optimality_gap",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="12 instances, 20 s limit")
    ap.add_argument("--json", default=None)
    ap.add_argument("--time-limit", type=float, default=None, help="per solve (default 60, quick 20)")
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window in s (default 600)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--only", choices=("small", "paper"), default=None,
                    help="run one part: the small instances (with the medium bounds) or the "
                         "paper instances with <= 160 adapters (default: both)")
    ap.add_argument("--out-dir", default=str(REPO / "results" / "optimality_gap"))
    ap.add_argument("--store", default=None, metavar="ROWS.jsonl",
                    help="keep each instance's row as it finishes and reuse the rows stored "
                         "for the same instance, options and twin (default: "
                         "<out-dir>/points.jsonl; a stopped run continues there)")
    ap.add_argument("--no-store", action="store_true",
                    help="measure every instance again and store nothing")
    a = ap.parse_args(argv)
    tl = a.time_limit or (20.0 if a.quick else 60.0)
    dur = a.duration or 600.0
    if tl <= 0 or dur <= 0:
        print("error: --time-limit and --duration must be > 0", file=sys.stderr)
        return 2
    t0 = time.time()
    parts = (a.only,) if a.only else ("small", "paper")
    store = None if a.no_store else RowStore(Path(a.store) if a.store
                                             else Path(a.out_dir) / "points.jsonl")
    rc = run(a.quick, tl, dur, Path(a.out_dir), a.json, a.workers, parts, store)
    print(f"wall={time.time() - t0:.1f}s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
