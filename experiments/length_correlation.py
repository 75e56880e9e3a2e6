"""Estimate the prompt/answer length correlation of the ShareGPT-like workload, with a hold-out.

``python -m experiments.length_correlation [--runs CSV] [--grid -0.5,-0.4,...,0]``

The shared data give the two marginal length histograms only, yet under overload the KV tokens a
running request holds depend on how prompt and answer lengths co-vary. The twin's GPU model is
fixed (fitted on profiling data); this study varies only the workload's Gaussian-copula
correlation, picks the value with the lowest throughput SMAPE on the *fit* half of the Llama
validation runs (the ``rank_16_*`` groups) and reports the *held-out* half (``rank_32_*``), whose
runs played no part in the choice. The chosen value is the constant
``twin.sharegpt.SHAREGPT_IO_CORRELATION``. Last line:
``best_correlation=<r> fit_throughput_smape=<x> heldout_throughput_smape=<y>
heldout_throughput_smape_independent=<z>``.
"""

from __future__ import annotations

import argparse
import os

from experiments.common import require_file, shared_data_dir, smape
from experiments.twin_fidelity import run_validation


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.length_correlation")
    p.add_argument("--runs", default=str(shared_data_dir() / "validation_llama" /
                                         "validation_llama.csv"))
    p.add_argument("--grid", default="-0.5,-0.4,-0.35,-0.3,-0.2,-0.1,0")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    path = require_file(a.runs, "--runs")
    try:
        grid = [float(x) for x in a.grid.split(",")]
    except ValueError:
        raise SystemExit(f"error: --grid: expected comma-separated numbers, got {a.grid!r}")
    if any(not -1 < r < 1 for r in grid):
        raise SystemExit("error: --grid: every correlation must be in (-1, 1)")

    def fit_half(df):
        return df["group"].str.startswith("rank_16")

    def held_half(df):
        return ~df["group"].str.startswith("rank_16")

    scores = {}
    for rho in grid:
        d = run_validation(path, a.workers, 0, io_correlation=rho, row_filter=fit_half,
                           progress=False)
        scores[rho] = smape(d["real_tps"], d["twin_tps"])
        print(f"fit half (rank_16, {len(d)} runs): correlation={rho:+.2f} "
              f"throughput_smape={scores[rho]:.3f}")
    best = min(scores, key=scores.get)
    held = run_validation(path, a.workers, 0, io_correlation=best, row_filter=held_half,
                          progress=False)
    held0 = run_validation(path, a.workers, 0, io_correlation=0.0, row_filter=held_half,
                           progress=False)
    h, h0 = smape(held["real_tps"], held["twin_tps"]), smape(held0["real_tps"], held0["twin_tps"])
    print(f"held-out half (rank_32, {len(held)} runs): correlation={best:+.2f} "
          f"throughput_smape={h:.3f} (independent lengths: {h0:.3f})")
    print(f"best_correlation={best} fit_throughput_smape={scores[best]:.3f} "
          f"heldout_throughput_smape={h:.3f} heldout_throughput_smape_independent={h0:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
