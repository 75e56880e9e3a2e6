"""Mixed GPU types, power caps and energy: best homogeneous plan vs mixed greedy vs exact.

``python -m experiments.hetero [--quick] [--instances DIR] [--time-limit S] [--out PNG]
[--json OUT] [--force]``; ``python -m experiments.hetero --write-instances DIR [--force]``
writes the ``instances/hetero/`` set (seeded, ``hetero_instances``).

For every instance of the set (``--quick``: the ones marked quick), with the configuration index
of ``optim.gpu_configs`` (twin-measured capacity and power line of each (type, cap, Amax, rank);
cached on disk, so only a first run measures):

* **homogeneous**: the cheapest single-type plan that fits the type's availability (the greedy
  over configurations restricted to each type in turn, best by the instance's objective);
* **mixed greedy**: ``optim solve --method greedy`` on the whole pool (``optim.config_greedy``);
* **exact**: ``optim solve --method cpsat`` (``optim.exact.templates``), on the instances marked
  small, with ``--time-limit`` (default 60 s); **exact milp**: the same model solved by HiGHS
  (``--method milp``), a cross-check.

Every placement is replayed in the twin, each GPU with its own profile and cap. Printed: a table
(cost $/h, energy kJ/h measured by the twin, GPUs by type, twin verdict, proven), the plot
(default ``results/hetero.png``) and the last line ``mixed_vs_homogeneous_cost_reduction=<pct>
exact_proven=<k>/<n> twin_failures=<f> derived_qwen_maxpack_smape=<x>``: the mean over the
cost-objective instances of 100 x (1 - mixed cost / homogeneous cost); exact proven optimal
within the limit; placements (all methods) the twin rejected; and the derived-Qwen Maxpack
SMAPE of ``experiments.derived_profile_check --quick`` (its own function).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

LLAMA = "llama-3.1-8b-instruct"
MAX_ADAPTER_TPS = 9_000.0
BUDGET_W = 950.0       # every adapter fits an H100 or H200 configuration alone
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "instances" / "hetero"
# Illustrative on-demand prices ($ per GPU-hour; instance inputs, not quotes) and caps (W).
TYPES = {
    "h100": {"gpu": "H100-64GB", "price_per_hour": 2.49, "power_caps_w": [400, 700]},
    "h200": {"gpu": "H200", "price_per_hour": 3.59, "power_caps_w": [450, 700]},
    "a100": {"gpu": "A100-80GB", "price_per_hour": 1.29, "power_caps_w": [250, 400]},
    "l40s": {"gpu": "L40S", "price_per_hour": 0.86, "power_caps_w": [250, 350]},
}
# name: (adapters, total offered load tok/s, {type: availability}, price overrides, objective,
#        power budget W, small (exact), quick, description)
SPECS = [
    ("hetero-mixed-n12", 12, 30_000, {"h100": 4, "a100": 4, "l40s": 4}, {}, "cost", None,
     True, True, "mixed pool at list prices"),
    ("hetero-scarce-n12", 12, 40_000, {"h100": 1, "h200": 3, "a100": 2}, {}, "cost", None,
     True, True, "the best load-per-$ type (h100) is scarce"),
    ("hetero-priceflip-n12", 12, 30_000, {"h100": 4, "a100": 4, "l40s": 4},
     {"h100": 1.49, "a100": 1.79, "l40s": 1.19}, "cost", None, True, True,
     "the mixed pool with prices flipped (h100 discounted, a100/l40s dearer)"),
    ("hetero-budget-n12", 12, 36_000, {"h100": 2, "h200": 2, "a100": 4, "l40s": 4}, {},
     "cost", BUDGET_W, True, True,
     "four types under a cluster power budget that rules out the cheapest plan"),
    ("hetero-energy-slack-n8", 8, 9_000, {"h100": 3, "a100": 3}, {}, "energy", None, True,
     False, "energy objective, slack demand (a fraction of one GPU per adapter group)"),
    ("hetero-energy-tight-n12", 12, 48_000, {"h100": 3, "a100": 1}, {}, "energy", None, True,
     False, "energy objective, demand close to the pool's capacity"),
    ("hetero-mixed-n16-r8", 16, 45_000, {"h100": 4, "h200": 2, "a100": 4, "l40s": 4}, {},
     "cost", None, True, False, "four types, ranks 8 and 16"),
    ("hetero-mixed-n48", 48, 90_000, {"h100": 8, "h200": 4, "a100": 8, "l40s": 8}, {}, "cost",
     None, False, False, "larger mixed pool (greedy only)"),
]


def _adapters(n: int, load_tps: float, seed: int, ranks: tuple[int, ...]) -> list[dict]:
    from twin.sharegpt import default_lengths
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 0.8, n)
    lengths = default_lengths()
    rate = load_tps / (lengths.mean_input + lengths.mean_output)
    for _ in range(50):           # no adapter above MAX_ADAPTER_TPS: it must fit one GPU
        w = np.minimum(w / w.sum(), MAX_ADAPTER_TPS / load_tps)
    rates = w / w.sum() * rate
    return [{"id": f"a{i:02d}", "rank": int(ranks[i % len(ranks)]), "rate": round(float(r), 6)}
            for i, r in enumerate(rates)]


def hetero_instances(seed: int = 0) -> list[tuple[dict, bool, bool]]:
    """(instance dict, small, quick) of every instance of the set, seeded."""
    out = []
    for k, (name, n, load, avail, prices, obj, budget, small, quick, desc) in enumerate(SPECS):
        ranks = (8, 16) if name.endswith("-r8") else (16,)
        gpus = [{"name": t, "gpu": TYPES[t]["gpu"], "model": LLAMA, "availability": c,
                 "price_per_hour": prices.get(t, TYPES[t]["price_per_hour"]),
                 "power_caps_w": TYPES[t]["power_caps_w"]} for t, c in avail.items()]
        d = {"schema_version": 1, "name": name, "description": desc,
             "adapters": _adapters(n, load, seed + k, ranks), "gpus": gpus,
             "objective": obj, "solver": {"time_limit_s": 60}, "duration_s": 600, "seed": 0}
        if budget is not None:
            d["power_budget_w"] = budget
        out.append((d, small, quick))
    return out


def write_instances(out_dir: Path, force: bool) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for d, _, _ in hetero_instances():
        p = out_dir / f"{d['name']}.json"
        if p.exists() and not force:
            raise FileExistsError(f"{p} exists (use --force to overwrite)")
        p.write_text(json.dumps(d, indent=1) + "\n")
        written.append(p)
    return written


# ----------------------------------------------------------------------------- the study
METHODS = ("homogeneous", "mixed greedy", "exact")     # plotted ("exact milp" in the table)


def _row(inst, name: str, p, configs_by_label: dict) -> dict:
    from optim.objectives import make_objective
    ok = p.verdict == "accepted"
    cost = make_objective(inst, "cost").value(p) if p.gpus else float("nan")
    energy = make_objective(inst, "energy").value(p) if p.gpus else float("nan")
    kinds = {}
    for g in p.gpus:
        cap = "" if g.power_cap_w is None else f"@{g.power_cap_w:g}W"
        kinds[g.gpu_type + cap] = kinds.get(g.gpu_type + cap, 0) + 1
    twin_power = sum(g.verified.avg_power_w for g in p.gpus
                     if g.verified is not None and g.verified.avg_power_w is not None)
    return {"instance": inst.name, "objective": inst.objective.kind, "method": name,
            "status": p.status, "verdict": p.verdict or "-", "gpus": p.n_gpus,
            "by_type": " ".join(f"{k}x{v}" for k, v in sorted(kinds.items())),
            "cost_per_h": cost, "energy_kj_per_h": energy / 1e3,
            "twin_power_w": twin_power if p.gpus else float("nan"),
            "power_budget_w": inst.power_budget_w,
            "proven": p.status == "optimal", "wall_s": p.wall_time_s,
            "twin_failure": bool(p.gpus) and not ok}


def run_instance(path: Path, small: bool, time_limit: float, workers: int | None) -> list[dict]:
    from optim.config_greedy import solve_configurations
    from optim.exact.templates import solve_templates
    from optim.gpu_configs import config_index
    from optim.instance import load_instance
    inst = load_instance(path)
    kind = inst.objective.kind
    configs = config_index(inst, workers=workers, quiet=False)
    rows = []
    homo = solve_configurations(inst, kind, True, None, workers, method="homogeneous",
                                homogeneous_only=True, configs=configs)
    rows.append(_row(inst, "homogeneous", homo, {}))
    mixed = solve_configurations(inst, kind, True, None, workers, configs=configs)
    rows.append(_row(inst, "mixed greedy", mixed, {}))
    if small:
        for name, solver in (("exact", "cpsat"), ("exact milp", "milp")):
            t0 = time.perf_counter()
            ex = solve_templates(inst, kind, time_limit, True, None, workers, method=name,
                                 solver=solver)
            r = _row(inst, name, ex, {})
            r["wall_s"] = time.perf_counter() - t0
            r["model_value"] = ex.params.get("model_value")
            rows.append(r)
    return rows


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["instance"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.27
    for ax, key, label in ((axes[0], "cost_per_h", "cost ($/h)"),
                           (axes[1], "energy_kj_per_h", "energy (kJ/h, twin power)")):
        for j, m in enumerate(METHODS):
            vals = [next((r[key] for r in rows if r["instance"] == n and r["method"] == m),
                         np.nan) for n in names]
            bad = [next((r["twin_failure"] for r in rows if r["instance"] == n
                         and r["method"] == m), False) for n in names]
            bars = ax.bar(np.arange(len(names)) + (j - 1) * width, vals, width, label=m)
            for b, f in zip(bars, bad):
                if f:
                    b.set_hatch("xx")
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels([n.replace("hetero-", "") for n in names], rotation=30, ha="right",
                           fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Mixed GPU types and power caps: homogeneous vs mixed greedy vs exact "
                 "(hatched: twin rejected)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def derived_qwen_maxpack_smape(quiet: bool) -> float:
    """``experiments.derived_profile_check --quick``'s Maxpack SMAPE (its functions)."""
    from twin.derive import derive_profile
    from twin.gpu_catalog import gpu_spec
    from twin.model_configs import model_config
    from twin.profile import load_profile

    from . import derived_profile_check as dpc
    from .common import smape
    source, calibrated = load_profile(dpc.SOURCE), load_profile(dpc.TARGET)
    derived = derive_profile(source, gpu_spec(calibrated.gpu), model_config(dpc.TARGET))
    mp = dpc.compare_maxpack(derived, calibrated, dpc.QUICK_MIXES, 1200.0, quiet)
    return float(smape(mp.calibrated_tps, mp.derived_tps))


def main(argv=None) -> int:
    from twin.cli_support import CliError, check_output
    from .common import REPO, markdown_table
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the instances marked quick only")
    ap.add_argument("--instances", default=str(DEFAULT_DIR), help="instance directory")
    ap.add_argument("--time-limit", type=float, default=60.0, help="exact method limit (s)")
    ap.add_argument("--workers", type=int, default=None, help="twin processes (default: cores)")
    ap.add_argument("--out", default=None, help="plot (PNG; default results/hetero.png, rewritten on every run)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
    ap.add_argument("--write-instances", default=None, metavar="DIR",
                    help="write the instance set to DIR and exit")
    ap.add_argument("--force", action="store_true", help="overwrite existing output files")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    try:
        if a.write_instances is not None:
            files = write_instances(Path(a.write_instances), a.force)
            print(f"wrote {len(files)} instances to {a.write_instances}")
            return 0
        if not (a.time_limit > 0 and np.isfinite(a.time_limit)):
            raise CliError(f"--time-limit: must be a finite number of seconds > 0, got "
                           f"{a.time_limit}")
        if a.workers is not None and a.workers < 1:
            raise CliError(f"--workers: must be >= 1, got {a.workers}")
        out = (check_output(a.out, "--out", a.force) if a.out is not None
                    else REPO / "results" / "hetero.png")  # the study's own default
        json_out = check_output(a.json, "--json", a.force)
        inst_dir = Path(a.instances)
        if not inst_dir.is_dir():
            raise CliError(f"--instances: {inst_dir} is not a directory")
    except (CliError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows: list[dict] = []
    t0 = time.perf_counter()
    for d, small, quick in hetero_instances():
        if a.quick and not quick:
            continue
        path = inst_dir / f"{d['name']}.json"
        if not path.is_file():
            print(f"error: --instances: {path} not found (write the set with "
                  f"--write-instances)", file=sys.stderr)
            return 2
        print(f"{d['name']} ...", file=sys.stderr)
        rows.extend(run_instance(path, small, a.time_limit, a.workers))
    import pandas as pd
    df = pd.DataFrame(rows)
    print(markdown_table(df[["instance", "objective", "method", "status", "verdict", "gpus",
                             "by_type", "cost_per_h", "energy_kj_per_h", "twin_power_w",
                             "power_budget_w", "wall_s"]]))
    reductions = []
    for name in dict.fromkeys(df.instance):
        sub = df[df.instance == name].set_index("method")
        if sub.objective.iloc[0] != "cost" or "homogeneous" not in sub.index:
            continue
        h, m = sub.loc["homogeneous"], sub.loc["mixed greedy"]
        if h.gpus and m.gpus:
            reductions.append(100 * (1 - m.cost_per_h / h.cost_per_h))
            print(f"{name}: mixed {m.cost_per_h:.2f} $/h vs homogeneous {h.cost_per_h:.2f} $/h "
                  f"({reductions[-1]:+.1f} %)")
    worse = [n for n in dict.fromkeys(df.instance)
             if {"homogeneous", "mixed greedy"} <= set(df[df.instance == n].method)
             and _obj(df, n, "mixed greedy") > _obj(df, n, "homogeneous") + 1e-9]
    ex = df[df.method == "exact"]
    proven = int(ex.proven.sum())
    over = ex[ex.wall_s > a.time_limit]
    mi = df[df.method == "exact milp"].set_index("instance")
    agree = sum(1 for _, r in ex.iterrows() if r.instance in mi.index and r.proven
                and mi.loc[r.instance].proven and abs(r.model_value - mi.loc[r.instance]
                                                      .model_value) <= 1e-6 * abs(r.model_value))
    print(f"exact (cpsat) proven optimal for the configuration model on {proven}/{len(ex)}; "
          f"milp (HiGHS, same model) proven on {int(mi.proven.sum())}/{len(mi)}, same optimum "
          f"as cpsat on {agree}")
    print(f"mixed costlier (instance objective) than homogeneous on: {worse or 'none'}; exact "
          f"runs over the {a.time_limit:g} s limit: {len(over)}; study wall "
          f"{time.perf_counter() - t0:.0f} s")
    plot(rows, out)
    print(f"wrote {out}")
    if json_out is not None:
        json_out.write_text(json.dumps(rows, indent=1, default=float))
        print(f"wrote {json_out}")
    smape_x = derived_qwen_maxpack_smape(a.quiet)
    red = float(np.mean(reductions)) if reductions else float("nan")
    print(f"mixed_vs_homogeneous_cost_reduction={red:.1f} exact_proven={proven}/{len(ex)} "
          f"twin_failures={int(df.twin_failure.sum())} derived_qwen_maxpack_smape={smape_x:.2f}")
    return 0


def _obj(df, name: str, method: str) -> float:
    r = df[(df.instance == name) & (df.method == method)].iloc[0]
    if not r.gpus:
        return float("inf")
    return r.cost_per_h if r.objective == "cost" else (
        r.energy_kj_per_h if r.objective == "energy" else r.gpus)


if __name__ == "__main__":
    raise SystemExit(main())
