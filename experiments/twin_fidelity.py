"""Twin fidelity against real vLLM runs.

``python -m experiments.twin_fidelity --runs <validation.csv> [--json OUT] [--plot OUT.png]``
replays every ``status == ok`` run from its configuration columns only (model, max_loras,
served_adapters, max_lora_rank, adapter_rank_counts, rate_counts, total_time_s, pool mean
lengths, max_num_batched_tokens, max_num_seqs) and compares throughput and mean ITL.

``python -m experiments.twin_fidelity --maxsearch <maxsearch.csv>`` runs the twin's Maxpack search
per configuration with the real search rule and compares with ``maxsearch_optimum_<model>.csv``.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments.common import mape, require_file, smape
from twin.lengths import sharegpt_lengths
from twin.maxpack import maxpack_search
from twin.profile import load_profile
from twin.server import SHARED_BENCHMARK_CLIENT_MAX_WAITING, ServerConfig, simulate_server
from twin.workload import adapters_from_counts, parse_counts

# The shared runs' load generator kept at most ~25.5k requests waiting (a twin option, see
# twin.server.ServerConfig.client_max_waiting).
SHARED_CLIENT_MAX_WAITING = SHARED_BENCHMARK_CLIENT_MAX_WAITING

CONFIG_COLUMNS = ["model", "max_loras", "served_adapters", "max_lora_rank", "adapter_rank_counts",
                  "rate_counts", "total_time_s", "pool_mean_input_len", "pool_mean_output_len",
                  "max_num_batched_tokens", "max_num_seqs"]


def _int_or_none(v) -> int | None:
    return None if pd.isna(v) else int(v)


def replay_run(cfg: dict, seed: int = 0, io_correlation: float | None = None) -> dict:
    """Simulate one real run from its configuration columns; returns the twin's metrics.
    ``io_correlation`` overrides the ShareGPT model's prompt/answer length correlation."""
    profile = load_profile(cfg["model"])
    adapters = adapters_from_counts(parse_counts(cfg["adapter_rank_counts"], int),
                                    parse_counts(cfg["rate_counts"], float), seed=seed)
    lengths = sharegpt_lengths(mean_input=float(cfg["pool_mean_input_len"]),
                               mean_output=float(cfg["pool_mean_output_len"]),
                               correlation=io_correlation)
    sc = ServerConfig(max_loras=int(cfg["max_loras"]),
                      max_lora_rank=_int_or_none(cfg["max_lora_rank"]),
                      max_num_seqs=_int_or_none(cfg.get("max_num_seqs")),
                      max_num_batched_tokens=_int_or_none(cfg.get("max_num_batched_tokens")),
                      client_max_waiting=SHARED_CLIENT_MAX_WAITING)
    m = simulate_server(profile, adapters, sc, float(cfg["total_time_s"]), lengths=lengths,
                        seed=seed)
    return m.to_dict()


def run_validation(path: Path, workers: int, seed: int, io_correlation: float | None = None,
                   row_filter=None, progress: bool = True) -> pd.DataFrame:
    """Replay every ok run (``row_filter(df) -> mask`` selects a subset) and tabulate."""
    df = pd.read_csv(path)
    missing = [c for c in CONFIG_COLUMNS if c not in df.columns]
    if missing:
        raise SystemExit(f"error: {path}: missing configuration columns {missing}")
    ok = df[df["status"] == "ok"]
    if row_filter is not None:
        ok = ok[row_filter(ok)]
    ok = ok.reset_index(drop=True)
    cfgs = ok[CONFIG_COLUMNS].to_dict("records")
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(tqdm(pool.map(replay_run, cfgs, [seed] * len(cfgs),
                                     [io_correlation] * len(cfgs)),
                            total=len(cfgs), desc="replaying runs", disable=not progress))
    out = ok[["run_id" if "run_id" in ok else "max_loras", "max_loras", "served_adapters",
              "max_lora_rank", "rate_counts"]].copy()
    out["real_tps"] = ok["total_throughput_tps"]
    out["twin_tps"] = [r["throughput_tps"] for r in results]
    out["real_itl_ms"] = ok["mean_itl_ms"]
    out["twin_itl_ms"] = [r["mean_itl_ms"] for r in results]
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
    with ProcessPoolExecutor(max_workers=workers) as pool:
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
    a = p.parse_args(argv)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    if a.runs:
        df = run_validation(require_file(a.runs, "--runs"), a.workers, a.seed)
        print(df.drop(columns=["rate_counts"]).to_string(index=False,
                                                         float_format=lambda v: f"{v:.2f}"))
        t_s = smape(df["real_tps"], df["twin_tps"])
        i_s = smape(df["real_itl_ms"], df["twin_itl_ms"])
        summary = {"runs": len(df), "throughput_smape": t_s, "throughput_mape":
                   mape(df["real_tps"], df["twin_tps"]), "itl_smape": i_s,
                   "itl_mape": mape(df["real_itl_ms"], df["twin_itl_ms"])}
        if "real_starved" in df:
            summary["starvation_agreement"] = float((df["real_starved"] == df["twin_starved"]).mean())
        print(json.dumps(summary, indent=2))
        if a.plot:
            _plot(df, a.plot, [("real_tps", "twin_tps", "throughput (tok/s)"),
                               ("real_itl_ms", "twin_itl_ms", "mean ITL (ms)")])
        if a.json:
            Path(a.json).write_text(json.dumps({"summary": summary,
                                                "runs": df.to_dict("records")}, indent=2))
        if a.csv:
            df.to_csv(a.csv, index=False)
        print(f"throughput_smape={t_s:.3f} itl_smape={i_s:.3f} runs={len(df)}")
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
