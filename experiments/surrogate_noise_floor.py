"""The twin's own seed-to-seed noise on dataset rows: the error floor of any surrogate.

Re-simulates a random subset of a dataset's rows (scenario, Amax) with a different simulation
seed and reports throughput SMAPE / MAPE between the two runs, the starvation-label agreement
and the F1 of one run's labels against the other's — no deterministic function of the features
can beat these on average.

    python -m experiments.surrogate_noise_floor --data results/surrogates/<profile>.parquet
        [--rows 150] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np

from surrogates.dataset import load_dataset, run_scenario, sample_scenario
from surrogates.metrics import f1, mape, smape


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--rows", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    df = load_dataset(a.data)
    meta = df.attrs["meta"]
    from surrogates.dataset import profile_hash
    if profile_hash(meta["profile"]) != meta["profile_hash"]:
        raise SystemExit(f"error: {a.data} was built with another calibration of profile "
                         f"{meta['profile']!r} (hash {meta['profile_hash']} vs current "
                         f"{profile_hash(meta['profile'])}); rebuild it")
    df = df[~df.memory_error].reset_index(drop=True)
    rng = np.random.default_rng(a.seed)
    pick = df.iloc[rng.choice(len(df), size=min(a.rows, len(df)), replace=False)]
    y0, y1, s0, s1, load = [], [], [], [], []
    for r in pick.itertuples(index=False):
        sc = sample_scenario(meta["seed"], int(r.scenario_id), meta["supported_ranks"])
        sc = sc.__class__(**{**sc.__dict__, "amaxes": (int(r.amax),), "sim_seed": sc.sim_seed + 1})
        row = run_scenario(sc, meta["profile"], meta["duration_s"], meta["client_max_waiting"])[0]
        y0.append(r.throughput_tps), y1.append(row["throughput_tps"])
        s0.append(r.starved), s1.append(row["starved"]), load.append(r.f_load)
    y0, y1, s0, s1, load = map(np.asarray, (y0, y1, s0, s1, load))
    print(f"noise floor on {len(y0)} rows of {a.data} (twin seed vs seed+1): throughput SMAPE "
          f"{smape(y0, y1):.3f} % MAPE {mape(y0, y1):.3f} %; starvation agreement "
          f"{np.mean(s0 == s1):.4f}, F1 {f1(s0, s1):.4f}")
    for lo, hi in ((0, 1000), (1000, 5000), (5000, 1e9)):
        m = (load >= lo) & (load < hi)
        if m.any():
            print(f"  load [{lo:g}, {hi:g}) tok/s: {int(m.sum())} rows, SMAPE {smape(y0[m], y1[m]):.3f} %")
    print(f"noise_smape={smape(y0, y1):.3f} noise_starvation_f1={f1(s0, s1):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
