"""Re-planning over a drifting day: static plan vs full re-solve every window vs churn-aware
re-plan.

``python -m experiments.replan [--quick] [--seed S] [--adapters N] [--windows W] [--duration S]
[--churn-weight X] [--plot PNG] [--json OUT] [--force]``

The day (``drifting_day``, all random choices from ``--seed``): ``N`` Llama-3.1-8B adapters
(ranks 8/16, Zipf-like rates scaled so the peak window needs about four GPUs), ``W`` windows of
``24 / W`` hours each. Rates follow a diurnal curve (x0.45 at night to x1.0 at the peak), every
adapter's rate also drifts by a log-normal factor per window (sigma 0.15), one window has a
flash crowd (three adapters of median popularity at x5), and from the second window on
about 6 % new adapters arrive and 5 % retire per window.

Methods, each verified in the twin every window (``--duration`` seconds of simulated traffic
per GPU):

- **static** — window 0's plan kept: retired adapters leave, new ones go to new GPUs by the
  greedy fill, nothing else changes;
- **resolve** — ``optim solve --method greedy`` from scratch every window (twin repair and
  compaction); its moves are counted after relabelling its GPUs onto the previous window's
  (``optim.replan.relabel``), the labelling most favourable to it;
- **replan** — ``optim.replan.replan`` from the previous window's re-plan (window 0 starts from
  the same plan as resolve), with the resolve plan offered as its second candidate.

Moves = loads of adapters that already existed onto a GPU that did not hold them (a relocation;
``optim.replan.Churn``), summed over windows 1..W-1; GPU-hours = GPUs x window hours; a starved
window = the twin rejected that window's plan. The switch-over into each window (1..W-1) is
replayed in the routed fleet twin for resolve and replan (``optim.replan.replay_transition``:
the previous plan serves the previous window's rates for 120 s, then the window's rates and
the new plan take over for 300 s, gently: a moved adapter stays on its old homes until its new
home has loaded it, a restarting server's adapters are bridged to other serving GPUs, restarts
go one at a time or, when that does more damage, all at once; the re-plan also prefers a
candidate whose switch-over does not starve, and says on stderr when every candidate's
starves); a starved switch-over = some GPU's completed / offered tokens of the requests
arriving after the switch below the starvation threshold (and below the new plan's own in
steady state on the same requests), or more late requests (first token after > 30 s) than in
that steady state. Prints a per-window table
(``*_switch_late`` / ``*_steady_late``: late requests after the switch / in steady state,
``*_switch_ok``: not starved, ``replan_drain_s``: the longest an old home drained,
``replan_restarts``: servers restarted, ``replan_schedule``: staggered or parallel restarts,
``replan_bridged``: requests bridged to another GPU
during a restart, ``replan_on_old_s``: the longest a moved adapter stayed on its old homes,
``replan_min_gpu_tput``: the lowest GPU's completed / offered tokens of the requests arriving
after the switch), the starved switch-overs,
writes a plot (GPUs and moves per window, three methods) and ends with
``replan_moves_vs_resolve=<r> replan_gpu_hours_vs_resolve=<g> starved_windows=<k>`` (k: the
re-plan's starved windows). ``--quick``: 48 adapters, 8 windows, 600 s twin windows.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.common import REPO, markdown_table

PROFILE = "llama-3.1-8b-instruct"
DIURNAL = (0.45, 0.6, 0.8, 0.95, 1.0, 0.85, 0.65, 0.5)   # 8 windows; resampled for other W
DRIFT_SIGMA = 0.15
FLASH_FACTOR = 5.0
FLASH_ADAPTERS = 3
ARRIVE_FRAC, RETIRE_FRAC = 0.06, 0.05
PEAK_GPUS = 4.0


@dataclass(frozen=True)
class Window:
    """One window of the day: its instance and what changed."""

    index: int
    hours: float
    multiplier: float
    flash: bool
    arrived: int
    retired: int
    instance: object


def drifting_day(n_adapters: int, windows: int, seed: int, duration_s: float) -> list[Window]:
    """The windows of a drifting day (module docstring), generated from ``seed``."""
    from optim.capacity import backbone_max_throughput
    from optim.instance import instance_from_dict
    from twin.sharegpt import sharegpt_lengths

    rng = np.random.default_rng(seed)
    lengths = sharegpt_lengths(223.0, 196.3)
    mean_tokens = lengths.mean_input + lengths.mean_output
    cap = backbone_max_throughput(PROFILE, lengths)
    # LoRA serving at the shared benchmark's scale carries roughly 0.5-0.6 of the backbone
    peak_rate_total = PEAK_GPUS * 0.5 * cap / mean_tokens
    curve = np.interp(np.linspace(0, len(DIURNAL) - 1, windows), np.arange(len(DIURNAL)),
                      DIURNAL)
    flash_w = int(np.argmax(curve)) + 1 if windows > 2 else windows - 1
    flash_w = min(flash_w, windows - 1)

    next_id = 0

    def new_adapter() -> dict:
        nonlocal next_id
        a = {"id": f"d{next_id}", "rank": int(rng.choice([8, 16])),
             "base": float(1.0 / (1 + rng.integers(0, n_adapters)) ** 0.8)}
        next_id += 1
        return a

    pool = [new_adapter() for _ in range(n_adapters)]
    scale = peak_rate_total / sum(a["base"] for a in pool)
    out = []
    for w in range(windows):
        arrived = retired = 0
        if w > 0:
            retired = max(1, round(RETIRE_FRAC * len(pool)))
            gone = set(rng.choice(len(pool), size=retired, replace=False).tolist())
            pool = [a for i, a in enumerate(pool) if i not in gone]
            arrived = max(1, round(ARRIVE_FRAC * n_adapters))
            pool += [new_adapter() for _ in range(arrived)]
            for a in pool:
                a["base"] *= float(np.exp(rng.normal(0.0, DRIFT_SIGMA)))
        flash = w == flash_w
        # the flash crowd hits adapters of median popularity (a hot adapter at x5 would need
        # more than one GPU, which whole-adapter placements cannot serve)
        mid = np.argsort([a["base"] for a in pool])[len(pool) // 2:][:FLASH_ADAPTERS]
        hot = set(mid.tolist()) if flash else set()
        ads = [{"id": a["id"], "rank": a["rank"],
                "rate": round(scale * a["base"] * curve[w] * (FLASH_FACTOR if i in hot else 1.0),
                              6)}
               for i, a in enumerate(pool)]
        d = {"name": f"drift-s{seed}-w{w}", "adapters": ads,
             "gpus": [{"name": "h100", "profile": PROFILE, "count": 64}],
             "lengths": {"mean_input": 223.0, "mean_output": 196.3},
             "duration_s": float(duration_s), "seed": int(seed)}
        out.append(Window(w, 24.0 / windows, float(curve[w]), flash, arrived, retired,
                          instance_from_dict(d, source=d["name"])))
    return out


def static_plan(prev, inst, duration_s: float):
    """Window 0's plan carried over: retired adapters leave, new ones on new greedy GPUs."""
    from optim.greedy import greedy_plans
    from optim.placement import Placement
    from optim.replan import carry_over
    from optim.verify import verify
    gpus, _, homeless, _ = carry_over(prev, inst)
    if homeless:
        new, _, _ = greedy_plans(inst, homeless, "gpus")
        gpus += new
    return verify(Placement(inst.name, "static", "solved", tuple(gpus)), inst, duration_s)


def run(args: argparse.Namespace) -> dict:
    from optim.methods import solve
    from optim.replan import ReplanOptions, churn_between, relabel, replan, replay_transition

    days = drifting_day(args.adapters, args.windows, args.seed, args.duration)
    rows = []
    prev_static = prev_resolve = prev_replan = None
    opts = ReplanOptions(churn_weight=args.churn_weight, duration_s=args.duration)
    from tqdm import tqdm
    for win in tqdm(days, desc="windows", unit="window", file=sys.stderr):
        inst = win.instance
        t0 = time.perf_counter()
        resolve = solve(inst, "greedy", verify=True, duration_s=args.duration)
        t_resolve = time.perf_counter() - t0
        row = {"window": win.index, "load_x": win.multiplier, "flash": win.flash,
               "adapters": len(inst.adapters), "arrived": win.arrived, "retired": win.retired}
        if prev_resolve is None:
            static, rp, rp_moves, rs_moves, st_moves, cand, t_replan = (
                resolve, resolve, 0, 0, 0, "start", 0.0)
            row.update({"incr_gpus": resolve.n_gpus, "incr_moves": 0})
            rp_tr = rs_tr = None
        else:
            rs_origin = relabel(prev_resolve, resolve.gpus)
            rs_moves = churn_between(prev_resolve, resolve.gpus, rs_origin).moves
            rs_tr = replay_transition(prev_resolve, resolve.gpus, rs_origin, inst).to_dict()
            t0 = time.perf_counter()
            res = replan(prev_replan, inst, opts, fresh=resolve)
            t_replan = time.perf_counter() - t0
            rp, rp_moves, cand = res.placement, res.churn.moves, res.candidate
            rp_tr = rp.params["replan"]["transition"]
            if rp.params["replan"]["transition_choice"]:
                print(f"window {win.index}: {rp.params['replan']['transition_choice']}",
                      file=sys.stderr)
            inc = rp.params["replan"]["candidates"]["incremental"]
            row.update({"incr_gpus": inc["gpus"], "incr_moves": inc["moves"]})
            static = static_plan(prev_static, inst, args.duration)
            st_moves = 0
        for k, tr in (("replan", rp_tr), ("resolve", rs_tr)):
            # the switch-over replayed in the routed fleet twin (window 0 has none)
            row.update({f"{k}_switch_ok": tr is None or not tr["starved"],
                        f"{k}_switch_late": 0 if tr is None else tr["late"],
                        f"{k}_steady_late": 0 if tr is None else tr["late_steady"],
                        f"{k}_switch_p99_s": math.nan if tr is None else tr["p99_ttft_s"],
                        f"{k}_before_p99_s": math.nan if tr is None else tr["p99_ttft_s_before"],
                        f"{k}_drain_s": 0.0 if tr is None else tr["max_drain_s"],
                        f"{k}_restarts": 0 if tr is None else tr["restarts"],
                        f"{k}_bridged": 0 if tr is None else tr["bridged"],
                        f"{k}_on_old_s": 0.0 if tr is None else tr["max_on_old_homes_s"],
                        f"{k}_schedule": "" if tr is None else tr["schedule"],
                        f"{k}_min_gpu_tput": 1.0 if tr is None else
                        tr["min_gpu_throughput_over_offered"],
                        f"{k}_min_gpu_tput_steady": 1.0 if tr is None else
                        tr["min_gpu_throughput_over_offered_steady"]})
        row.update({"static_gpus": static.n_gpus, "static_ok": static.verdict == "accepted",
                    "resolve_gpus": resolve.n_gpus, "resolve_moves": rs_moves,
                    "resolve_ok": resolve.verdict == "accepted",
                    "replan_gpus": rp.n_gpus, "replan_moves": rp_moves,
                    "replan_ok": rp.verdict == "accepted", "replan_from": cand,
                    "resolve_s": round(t_resolve, 1), "replan_s": round(t_replan, 1),
                    "hours": win.hours, "static_moves": st_moves})
        rows.append(row)
        prev_resolve, prev_replan = resolve, rp
        prev_static = static if prev_static is not None else resolve
    return summarise(rows)


def summarise(rows: list[dict]) -> dict:
    def hours(k: str) -> float:
        return sum(r[f"{k}_gpus"] * r["hours"] for r in rows)
    rs_moves = sum(r["resolve_moves"] for r in rows)
    rp_moves = sum(r["replan_moves"] for r in rows)
    out = {"rows": rows,
           "gpu_hours": {k: hours(k) for k in ("static", "resolve", "replan")},
           "moves": {"resolve": rs_moves, "replan": rp_moves},
           "starved_windows": {k: sum(not r[f"{k}_ok"] for r in rows)
                               for k in ("static", "resolve", "replan")},
           "starved_switches": {k: sum(not r[f"{k}_switch_ok"] for r in rows)
                                for k in ("resolve", "replan")}}
    out["replan_moves_vs_resolve"] = rp_moves / rs_moves if rs_moves else math.nan
    out["replan_gpu_hours_vs_resolve"] = out["gpu_hours"]["replan"] / out["gpu_hours"]["resolve"]
    return out


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = summary["rows"]
    w = [r["window"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for k, style in (("static", ":o"), ("resolve", "--s"), ("replan", "-^")):
        ax1.plot(w, [r[f"{k}_gpus"] for r in rows], style, label=k)
        bad = [r["window"] for r in rows if not r[f"{k}_ok"]]
        ax1.plot(bad, [r[f"{k}_gpus"] for r in rows if not r[f"{k}_ok"]], "x", color="red",
                 ms=10, label=f"{k}: twin rejected" if bad else None)
    ax1b = ax1.twinx()
    ax1b.plot(w, [r["load_x"] for r in rows], color="grey", alpha=0.4)
    ax1b.set_ylabel("diurnal load multiplier", color="grey")
    ax1.set_ylabel("GPUs")
    ax1.legend(fontsize=8)
    x = np.arange(len(w))
    ax2.bar(x - 0.2, [r["resolve_moves"] for r in rows], 0.4, label="resolve (relabelled)")
    ax2.bar(x + 0.2, [r["replan_moves"] for r in rows], 0.4, label="replan")
    ax2.set_ylabel("adapter moves")
    ax2.set_xlabel("window")
    ax2.legend(fontsize=8)
    fig.suptitle(f"drifting day: replan moves {summary['replan_moves_vs_resolve']:.2f}x, "
                 f"GPU-hours {summary['replan_gpu_hours_vs_resolve']:.3f}x of resolve")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.replan",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="48 adapters, 8 windows, 600 s windows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapters", type=int, default=None, help="default 150 (quick: 48)")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window per GPU in s (default 1800; quick: 600)")
    ap.add_argument("--churn-weight", type=float, default=0.02)
    ap.add_argument("--plot", default=str(REPO / "results" / "replan.png"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--force", action="store_true", help="overwrite --plot / --json")
    a = ap.parse_args(argv)
    a.adapters = a.adapters or (48 if a.quick else 150)
    a.duration = a.duration or (600.0 if a.quick else 1800.0)
    if a.windows < 2 or a.adapters < 4 or not 0 <= a.seed < 2 ** 32 or a.duration <= 0 \
            or a.churn_weight < 0:
        ap.error("--windows >= 2, --adapters >= 4, --seed in [0, 2^32), --duration > 0, "
                 "--churn-weight >= 0")
    for opt, path in (("--plot", a.plot), ("--json", a.json)):
        if path and Path(path).exists() and not a.force:
            ap.error(f"{opt}: {path} exists; pass --force to overwrite it")
    s = run(a)
    cols = ["window", "load_x", "flash", "adapters", "arrived", "retired", "static_gpus",
            "static_ok", "resolve_gpus", "resolve_moves", "resolve_ok", "replan_gpus",
            "replan_moves", "replan_ok", "replan_from", "incr_gpus", "incr_moves",
            "resolve_switch_late", "resolve_steady_late", "resolve_switch_ok",
            "replan_switch_late", "replan_steady_late", "replan_switch_ok", "replan_drain_s",
            "replan_restarts", "replan_schedule", "replan_bridged", "replan_on_old_s",
            "replan_min_gpu_tput",
            "resolve_s", "replan_s"]
    import pandas as pd
    print(markdown_table(pd.DataFrame(s["rows"])[cols]))
    print(f"GPU-hours: static {s['gpu_hours']['static']:.0f}, resolve "
          f"{s['gpu_hours']['resolve']:.0f}, replan {s['gpu_hours']['replan']:.0f}; moves: "
          f"resolve {s['moves']['resolve']}, replan {s['moves']['replan']}; starved windows: "
          + ", ".join(f"{k} {v}" for k, v in s["starved_windows"].items()))
    print("switch-overs replayed in the routed fleet twin (windows 1..W-1): starved "
          + ", ".join(f"{k} {v}" for k, v in s["starved_switches"].items())
          + "; late requests after the switch (steady new plan) " + ", ".join(
              f"{k} {sum(r[f'{k}_switch_late'] for r in s['rows'])} "
              f"({sum(r[f'{k}_steady_late'] for r in s['rows'])})"
              for k in ("resolve", "replan")))
    plot(s, Path(a.plot))
    print(f"wrote {a.plot}")
    if a.json:
        Path(a.json).write_text(json.dumps(s, indent=1, default=float) + "\n")
        print(f"wrote {a.json}")
    print(f"replan_moves_vs_resolve={s['replan_moves_vs_resolve']:.3f} "
          f"replan_gpu_hours_vs_resolve={s['replan_gpu_hours_vs_resolve']:.3f} "
          f"starved_windows={s['starved_windows']['replan']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
