"""How well does the twin itself (the surrogates' teacher) match the real max-search runs?

The surrogates learn the twin, so their error against real runs cannot be expected to fall
below the twin's own. This replays every ``ok`` run of a max-search CSV with the twin (same
configuration columns as ``python -m surrogates evaluate --real``: config_rates / config_sizes
cycled over served_adapters, max_loras, pool mean lengths, the benchmark client's waiting cap)
and prints throughput SMAPE / MAPE and starvation F1 of the twin.

    python -m experiments.surrogate_twin_reference --real <maxsearch.csv> [--workers 2]
        [--out results/surrogates/twin_on_maxsearch.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from surrogates.dataset import DEFAULT_CLIENT_MAX_WAITING
from surrogates.metrics import f1, mape, smape
from twin.fleet import worker_pool


def _run(cfg: dict) -> dict:
    from twin.sharegpt import sharegpt_lengths
    from twin.profile import load_profile
    from twin.server import ServerConfig, simulate_server
    from twin.workload import Adapter
    n = int(cfg["served_adapters"])
    cr = [float(v) for v in str(cfg["config_rates"]).split()]
    cs = [int(v) for v in str(cfg["config_sizes"]).split()]
    ads = [Adapter(f"a{i}", cs[i % len(cs)], cr[i % len(cr)]) for i in range(n)]
    m = simulate_server(load_profile(cfg["model"]), ads,
                        ServerConfig(int(cfg["max_loras"]), max(cs),
                                     client_max_waiting=DEFAULT_CLIENT_MAX_WAITING),
                        3600.0, lengths=sharegpt_lengths(float(cfg["pool_mean_input_len"]),
                                                         float(cfg["pool_mean_output_len"])),
                        seed=0)
    return {"twin_tps": m.throughput_tps, "twin_starved": m.starved}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="results/surrogates/twin_on_maxsearch.csv")
    a = ap.parse_args(argv)
    df = pd.read_csv(a.real)
    ok = df[df["status"] == "ok"].reset_index(drop=True)
    cols = ["model", "served_adapters", "config_rates", "config_sizes", "max_loras",
            "pool_mean_input_len", "pool_mean_output_len"]
    with worker_pool(a.workers) as pool:
        res = list(pool.map(_run, ok[cols].to_dict("records"), chunksize=4))
    out = ok[cols + ["total_throughput_tps", "starved_90"]].copy()
    out["twin_tps"] = [r["twin_tps"] for r in res]
    out["twin_starved"] = [r["twin_starved"] for r in res]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(a.out, index=False)
    y = out["total_throughput_tps"].to_numpy(float)
    st = out["starved_90"].astype(str).str.lower().eq("true").to_numpy()
    print(f"twin vs real ({len(out)} runs): throughput SMAPE {smape(y, out.twin_tps):.3f} % "
          f"MAPE {mape(y, out.twin_tps):.3f} %, starvation F1 {f1(st, out.twin_starved):.4f} "
          f"accuracy {np.mean(st == out.twin_starved.to_numpy()):.4f}")
    print(f"twin_real_throughput_smape={smape(y, out.twin_tps):.3f} "
          f"twin_real_starvation_f1={f1(st, out.twin_starved):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
