"""Twin fidelity against real vLLM runs.

``python -m experiments.twin_fidelity --runs <validation.csv> [--json OUT] [--plot OUT.png]``
replays every ``status == ok`` run from its configuration columns only (model, max_loras,
served_adapters, max_lora_rank, adapter_rank_counts, rate_counts, total_time_s, pool mean
lengths, max_num_batched_tokens, max_num_seqs) and compares throughput and the latency metrics
people set SLOs on — mean, median and p99 TTFT, mean TPOT, mean and p99 ITL — with the real
runs, per run and as SMAPE (DESIGN.md §6: 100 * mean(|y - y'| / (|y| + |y'|)), no factor 2) with
MAPE beside it, overall and per ``max_lora_rank`` group, and lists the worst runs. The twin's
metrics use vLLM's benchmark definitions (over completed requests; see ``twin.metrics``), the
real ones are the benchmark's own summary columns.

``python -m experiments.twin_fidelity --maxsearch <maxsearch.csv>`` runs the twin's Maxpack search
per configuration with the real search rule and compares with ``maxsearch_optimum_<model>.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments.common import mape, require_file, smape
from twin.sharegpt import sharegpt_lengths
from twin.fleet import worker_pool
from twin.maxpack import maxpack_search
from twin.profile import load_profile
from twin.server import SHARED_BENCHMARK_CLIENT_MAX_WAITING
from twin.shared_runs import CONFIG_COLUMNS, replay_run
from twin.slot_fit import counts_agree

# The shared runs' load generator kept at most ~25.5k requests waiting (a twin option, see
# twin.server.ServerConfig.client_max_waiting).
SHARED_CLIENT_MAX_WAITING = SHARED_BENCHMARK_CLIENT_MAX_WAITING

# (table key, real column of the shared CSV, twin metric, label); real_<key> / twin_<key> columns
COMPARED: tuple[tuple[str, str, str, str], ...] = (
    ("tps", "total_throughput_tps", "throughput_tps", "throughput (tok/s)"),
    ("itl_ms", "mean_itl_ms", "mean_itl_ms", "mean ITL (ms)"),
    ("p99_itl_ms", "p99_itl_ms", "p99_itl_ms", "p99 ITL (ms)"),
    ("ttft_ms", "mean_ttft_ms", "mean_ttft_ms", "mean TTFT (ms)"),
    ("median_ttft_ms", "median_ttft_ms", "p50_ttft_ms", "median TTFT (ms)"),
    ("p99_ttft_ms", "p99_ttft_ms", "p99_ttft_ms", "p99 TTFT (ms)"),
    ("tpot_ms", "mean_tpot_ms", "mean_tpot_ms", "mean TPOT (ms)"),
)
WORST_RUNS = 8

def _consistent_counts(runs: pd.DataFrame, path: Path) -> pd.Series:
    """Rows whose adapter_rank_counts and rate_counts describe the same number of adapters; the
    others cannot be replayed and are skipped with a note on stderr naming them."""
    good = pd.Series([counts_agree(a, b) for a, b in zip(runs["adapter_rank_counts"],
                                                          runs["rate_counts"])],
                     index=runs.index, dtype=bool)
    for i in runs.index[~good]:
        name = runs.at[i, "run_id"] if "run_id" in runs else f"row {i}"
        print(f"note: {path}: skipped {name}: adapter_rank_counts "
              f"{runs.at[i, 'adapter_rank_counts']!r} and rate_counts "
              f"{runs.at[i, 'rate_counts']!r} do not describe the same adapters",
              file=sys.stderr)
    return good


def run_validation(path: Path, workers: int, seed: int, io_correlation: float | None = None,
                   row_filter=None, progress: bool = True,
                   client_latency: bool = True) -> pd.DataFrame:
    """Replay every ok run (``row_filter(df) -> mask`` selects a subset) and tabulate."""
    df = pd.read_csv(path)
    missing = [c for c in CONFIG_COLUMNS if c not in df.columns]
    if missing:
        raise SystemExit(f"error: {path}: missing configuration columns {missing}")
    ok = df[df["status"] == "ok"]
    if row_filter is not None:
        ok = ok[row_filter(ok)]
    ok = ok[_consistent_counts(ok, path)]
    ok = ok.reset_index(drop=True)
    cfgs = ok[CONFIG_COLUMNS].to_dict("records")
    with worker_pool(workers) as pool:
        results = list(tqdm(pool.map(replay_run, cfgs, [seed] * len(cfgs),
                                     [io_correlation] * len(cfgs),
                                     [client_latency] * len(cfgs)),
                            total=len(cfgs), desc="replaying runs", disable=not progress))
    out = ok[["run_id" if "run_id" in ok else "max_loras", "max_loras", "served_adapters",
              "max_lora_rank", "rate_counts"]].copy()
    for key, real_col, twin_key, _ in COMPARED:
        out[f"real_{key}"] = ok[real_col] if real_col in ok else np.nan
        out[f"twin_{key}"] = [r[twin_key] for r in results]
    out["twin_starved"] = [r["starved"] for r in results]
    if "starved_90" in ok:
        out["real_starved"] = ok["starved_90"].astype(str).str.lower() == "true"
    out["twin_wall_s"] = [r["wall_s"] for r in results]
    return out


def _walk(args: tuple) -> tuple:
    model, rates, ranks, amax, n_grid, lengths_means, seed = args
    prof = load_profile(model)
    lengths = sharegpt_lengths(*lengths_means)
    res = maxpack_search(prof, rates, ranks, lengths=lengths, n_grid=n_grid, amax_grid=(amax,),
                         seed=seed, client_max_waiting=SHARED_CLIENT_MAX_WAITING, rule="shared")
    return (model, tuple(rates), tuple(ranks), amax, res.served_adapters, res.throughput_tps,
            [(p.served_adapters, p.metrics.throughput_tps, p.metrics.starved) for p in res.points])


def run_maxsearch(path: Path, workers: int, seed: int) -> pd.DataFrame:
    df = pd.read_csv(path)
    ok = df[df["status"] == "ok"]
    model = ok["model"].iloc[0]
    opt_path = path.parent / f"maxsearch_optimum_{model.split('-')[0]}.csv"
    if not opt_path.exists():
        cands = sorted(path.parent.glob("maxsearch_optimum_*.csv"))
        if not cands:
            raise SystemExit(f"error: no maxsearch_optimum_*.csv beside {path}")
        opt_path = cands[0]
    opt = pd.read_csv(opt_path)
    n_grid = tuple(sorted(int(x) for x in ok["served_adapters"].unique()))
    amax_grid = tuple(sorted(int(x) for x in ok["max_loras"].unique()))
    jobs = []
    for (rates_s, sizes_s), g in ok.groupby(["config_rates", "config_sizes"]):
        rates = [float(x) for x in str(rates_s).split()]
        ranks = [int(x) for x in str(sizes_s).split()]
        means = (float(g["pool_mean_input_len"].mean()), float(g["pool_mean_output_len"].mean()))
        for amax in amax_grid:
            jobs.append((model, rates, ranks, amax, n_grid, means, seed))
    with worker_pool(workers) as pool:
        walks = list(tqdm(pool.map(_walk, jobs), total=len(jobs), desc="maxpack walks"))
    rows = []
    for (rates_s, sizes_s), _ in ok.groupby(["config_rates", "config_sizes"]):
        rates = tuple(float(x) for x in str(rates_s).split())
        ranks = tuple(int(x) for x in str(sizes_s).split())
        mine = [w for w in walks if w[1] == rates and w[2] == ranks and w[4] > 0]
        best = max(mine, key=lambda w: w[5]) if mine else None
        real = opt[(opt["config_rates"] == rates_s) & (opt["config_sizes"] == sizes_s)].iloc[0]
        rows.append({
            "config_rates": rates_s, "config_sizes": sizes_s,
            "real_served": int(real["max_served_adapters"]),
            "twin_served": best[4] if best else 0,
            "real_amax": int(real["max_adapter_slots"]),
            "twin_amax": best[3] if best else 0,
            "real_tps": float(real["max_total_throughput"]),
            "twin_tps": best[5] if best else 0.0,
        })
    return pd.DataFrame(rows)


def error_summary(df: pd.DataFrame) -> dict:
    """SMAPE and MAPE (%) of every compared metric, over all runs and per max_lora_rank group
    (runs where either side is missing, e.g. no completed request, are left out and counted)."""
    def scores(d: pd.DataFrame) -> dict:
        out = {"runs": int(len(d))}
        for key, _, _, _ in COMPARED:
            y, p = d[f"real_{key}"].to_numpy(float), d[f"twin_{key}"].to_numpy(float)
            ok = np.isfinite(y) & np.isfinite(p)
            out[key] = {"smape": smape(y[ok], p[ok]) if ok.any() else float("nan"),
                        "mape": mape(y[ok], p[ok]) if ok.any() else float("nan"),
                        "n": int(ok.sum())}
        return out
    res = {"all": scores(df)}
    for r, g in df.groupby("max_lora_rank"):
        res[f"max_lora_rank={int(r)}"] = scores(g)
    return res


def group_summary(df: pd.DataFrame) -> dict:
    """``error_summary``'s scores for the runs the real server starved / did not starve
    (``real_starved``) and per (max_lora_rank, max_loras) group."""
    res = {}
    if "real_starved" in df:
        for flag, name in ((False, "unstarved"), (True, "starved")):
            g = df[df["real_starved"] == flag]
            if len(g):
                res[name] = error_summary(g)["all"]
    for (r, a), g in df.groupby(["max_lora_rank", "max_loras"]):
        res[f"rank={int(r)} slots={int(a)}"] = error_summary(g)["all"]
    return res


def format_groups(groups: dict) -> str:
    """SMAPE of the latency metrics per group, with the mean signed error of p99 ITL and mean
    TTFT (twin vs real, %) when the rows carry it."""
    keys = ("tps", "itl_ms", "p99_itl_ms", "ttft_ms", "median_ttft_ms", "p99_ttft_ms")
    head = f"{'group':22s} {'runs':>4s} " + " ".join(f"{k:>14s}" for k in keys)
    lines = ["SMAPE % per group (real starved / unstarved; max_lora_rank x max_loras)", head]
    for g, sc in groups.items():
        lines.append(f"{g:22s} {sc['runs']:4d} " + " ".join(f"{sc[k]['smape']:14.2f}"
                                                             for k in keys))
    return "\n".join(lines)


def signed_bias(df: pd.DataFrame, key: str) -> float:
    """Mean signed error (twin vs real, %) of ``key`` over the runs where both are finite."""
    y, p = df[f"real_{key}"].to_numpy(float), df[f"twin_{key}"].to_numpy(float)
    ok = np.isfinite(y) & np.isfinite(p) & (y != 0)
    return float(100.0 * np.mean((p[ok] - y[ok]) / y[ok])) if ok.any() else float("nan")


def format_summary(summary: dict) -> str:
    """One row per group, SMAPE (MAPE) per metric."""
    keys = [k for k, _, _, _ in COMPARED]
    head = f"{'group':18s} {'runs':>4s} " + " ".join(f"{k:>17s}" for k in keys)
    lines = ["SMAPE % (MAPE %) per metric", head]
    for g, sc in summary.items():
        cells = " ".join(f"{sc[k]['smape']:7.2f} ({sc[k]['mape']:6.2f})" for k in keys)
        lines.append(f"{g:18s} {sc['runs']:4d} {cells}")
    return "\n".join(lines)


def worst_runs(df: pd.DataFrame, key: str, n: int = WORST_RUNS) -> pd.DataFrame:
    """The ``n`` runs with the largest relative error of metric ``key`` (signed, %)."""
    d = df.copy()
    d["err_pct"] = 100.0 * (d[f"twin_{key}"] - d[f"real_{key}"]) / d[f"real_{key}"]
    d = d[np.isfinite(d["err_pct"])]
    d = d.reindex(d["err_pct"].abs().sort_values(ascending=False).index).head(n)
    cols = ["max_loras", "served_adapters", "max_lora_rank", "rate_counts",
            f"real_{key}", f"twin_{key}", "err_pct"]
    return d[cols]


def bias_by_slots(df: pd.DataFrame, keys: tuple[str, ...] = ("tps", "itl_ms")) -> pd.DataFrame:
    """Mean signed error (twin vs real, %) of each metric per (max_lora_rank, max_loras), with
    the run count: a systematic trend with the slot count shows here, not in the SMAPE."""
    d = df.copy()
    cols = {}
    for key in keys:
        d[key] = 100.0 * (d[f"twin_{key}"] - d[f"real_{key}"]) / d[f"real_{key}"]
        cols[f"{key}_bias_pct"] = (key, "mean")
    cols["runs"] = (keys[0], "size")
    return d.groupby(["max_lora_rank", "max_loras"]).agg(**cols).reset_index()


def _plot_latency(df: pd.DataFrame, path: str) -> None:
    """Real vs twin for every compared metric (log axes for latencies), rank groups coloured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter
    n = len(COMPARED)
    cols = 4
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.0 * rows))
    axes = np.atleast_1d(axes).ravel()
    for ax, (key, _, _, label) in zip(axes, COMPARED):
        for (r, g), colour in zip(df.groupby("max_lora_rank"), ("tab:blue", "tab:orange",
                                                                 "tab:green", "tab:red")):
            ax.scatter(g[f"real_{key}"], g[f"twin_{key}"], s=12, color=colour,
                       label=f"max_lora_rank {int(r)}")
        x = df[f"real_{key}"].to_numpy(float)
        y = df[f"twin_{key}"].to_numpy(float)
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        lo, hi = min(x[ok].min(), y[ok].min()), max(x[ok].max(), y[ok].max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        if key != "tps":
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"real {label}")
        ax.set_ylabel(f"twin {label}")
        ax.set_title(f"{label}: SMAPE {smape(x[ok], y[ok]):.2f} %", fontsize=10)
    axes[0].legend(fontsize=8)
    for ax in axes[n:]:
        ax.axis("off")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot(df: pd.DataFrame, path: str, pairs: list[tuple[str, str, str]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(pairs), figsize=(5 * len(pairs), 4.5))
    axes = np.atleast_1d(axes)
    for ax, (real, twin, title) in zip(axes, pairs):
        x, y = df[real].to_numpy(float), df[twin].to_numpy(float)
        ax.scatter(x, y, s=14)
        lo, hi = np.nanmin([x.min(), y.min()]), np.nanmax([x.max(), y.max()])
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xlabel(f"real {title}")
        ax.set_ylabel(f"twin {title}")
        ax.set_title(f"{title}: SMAPE {smape(x, y):.2f} %")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.twin_fidelity")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--runs", help="validation CSV in the shared format")
    src.add_argument("--maxsearch", help="max-search CSV in the shared format")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--csv", default=None, help="write the per-run table here")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-latency", action="store_true",
                   help="--runs: compare the engine's TTFT / ITL (no twin.latency_tail model)")
    a = p.parse_args(argv)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    if a.runs:
        df = run_validation(require_file(a.runs, "--runs"), a.workers, a.seed,
                            client_latency=not a.engine_latency)
        show = ["max_loras", "served_adapters", "max_lora_rank"] + [
            c for k, _, _, _ in COMPARED for c in (f"real_{k}", f"twin_{k}")]
        print(df[show].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        summary = error_summary(df)
        print()
        print(format_summary(summary))
        print("\nmean signed error by server slots (twin vs real, %):")
        print(bias_by_slots(df).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        for key in ("tps", "itl_ms", "ttft_ms"):
            print(f"\nworst runs by {key} (err_pct = twin vs real, %):")
            print(worst_runs(df, key).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        groups = group_summary(df)
        print()
        print(format_groups(groups))
        if "real_starved" in df:
            for flag, name in ((False, "unstarved"), (True, "starved")):
                g = df[df["real_starved"] == flag]
                print(f"{name}: mean signed error p99 ITL {signed_bias(g, 'p99_itl_ms'):+.1f} %, "
                      f"mean TTFT {signed_bias(g, 'ttft_ms'):+.1f} %, "
                      f"p99 TTFT {signed_bias(g, 'p99_ttft_ms'):+.1f} %")
        extra = {"groups": groups}
        if "real_starved" in df:
            extra["starvation_agreement"] = float((df["real_starved"] == df["twin_starved"]).mean())
            print(f"\nstarvation agreement: {extra['starvation_agreement']:.3f}")
        if a.plot:
            _plot_latency(df, a.plot)
            print(f"plot: {a.plot}")
        if a.json:
            Path(a.json).write_text(json.dumps({"summary": summary, **extra,
                                                "runs": df.to_dict("records")}, indent=2))
        if a.csv:
            df.to_csv(a.csv, index=False)
        al = summary["all"]
        unst = groups.get("unstarved", {}).get("ttft_ms", {}).get("smape", float("nan"))
        print(f"throughput_smape={al['tps']['smape']:.3f} itl_smape={al['itl_ms']['smape']:.3f} "
              f"ttft_smape={al['ttft_ms']['smape']:.3f} "
              f"p99_itl_smape={al['p99_itl_ms']['smape']:.3f} runs={len(df)} "
              f"ttft_p99_smape={al['p99_ttft_ms']['smape']:.3f} unstarved_ttft_smape={unst:.3f}")
    else:
        df = run_maxsearch(require_file(a.maxsearch, "--maxsearch"), a.workers, a.seed)
        print(df.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        s = smape(df["real_tps"], df["twin_tps"])
        exact = int((df["real_served"] == df["twin_served"]).sum())
        if a.plot:
            _plot(df, a.plot, [("real_tps", "twin_tps", "Maxpack throughput (tok/s)"),
                               ("real_served", "twin_served", "served adapters")])
        if a.json:
            Path(a.json).write_text(json.dumps({"maxpack_throughput_smape": s,
                                                "served_exact": exact, "configs": len(df),
                                                "rows": df.to_dict("records")}, indent=2))
        print(f"maxpack_throughput_smape={s:.3f} served_exact={exact}/{len(df)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
