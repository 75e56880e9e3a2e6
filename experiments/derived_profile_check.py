"""Check derived profiles where data exist: Qwen-2.5-7B on the H100 derived from the Llama profile.

``python -m experiments.derived_profile_check [--quick] [--out PNG] [--json OUT] [--force]``

Derives the Qwen-2.5-7B / H100-64GB profile from the measured Llama-3.1-8B / H100-64GB profile
and the two public model configs (``twin.derive``: nothing of the Qwen measurements enters),
then compares it with the calibrated Qwen profile (``twin/profiles/qwen-2.5-7b-instruct.json``):

* step times on a grid of engine steps (decode batches of 1-1024 requests with and without
  LoRA, and mixed steps with a 2048-token prefill chunk): SMAPE (DESIGN.md section 6, no
  factor 2) and the largest relative error;
* the KV-capacity table: mean |derived - calibrated| / calibrated over the calibrated
  (max_loras, max_lora_rank) entries (an entry the derived profile would not start counts as
  100 %), and the backbone capacity;
* Maxpack (``twin.maxpack``, strict rule) on the paper's nine rate mixes (ranks low [8], high
  [32], mixed [8,16,32] x rates high, low, mixed; ``optim.generate``): best throughput, served
  adapters and Amax of each profile (``--quick``: three mixes and a 1200 s window).

Prints a table per part, saves a plot (default ``results/derived_profile_check.png``) and ends
with ``derived_qwen_maxpack_smape=<x> derived_qwen_kv_error_pct=<y> derived_qwen_step_smape=<z>``
(Maxpack throughput SMAPE in %, KV error in %, step-time SMAPE in %). The target is Maxpack
throughput within 8 % of the calibrated-Qwen result on every mix.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from optim.generate import PAPER_RANKS, PAPER_RATES
from twin.cli_support import CliError, check_output
from twin.derive import derive_profile
from twin.gpu_catalog import gpu_spec
from twin.maxpack import maxpack_search
from twin.model_configs import model_config
from twin.profile import GpuProfile, load_profile
from twin.step_time import step_time_ms_py

from .common import REPO, markdown_table, smape

SOURCE = "llama-3.1-8b-instruct"
TARGET = "qwen-2.5-7b-instruct"
QUICK_MIXES = (("low", "high"), ("high", "high"), ("mixed", "mixed"))
MEAN_CTX_PER_SEQ = 400          # tokens of context per running request in the step grid


def step_grid() -> pd.DataFrame:
    """Engine steps spanning the twin's operating range (features of ``step_time_ms``)."""
    rows = []
    for lora in (False, True):
        for b in (1, 4, 16, 64, 128, 256, 512, 1024):
            k = min(b, 32) if lora else 0
            a = 32 if lora else 0
            rows.append(dict(kind="decode", lora=lora, n_seqs=b, n_prefill_tokens=0,
                             n_decode_tokens=b, ctx_tokens=b * MEAN_CTX_PER_SEQ, n_distinct=k,
                             max_loras=a, max_rank=16, n_waiting=0, n_tiles=k))
            if b < 2048:
                pre = 2048 - b
                rows.append(dict(kind="decode+prefill", lora=lora, n_seqs=b + 1,
                                 n_prefill_tokens=pre, n_decode_tokens=b,
                                 ctx_tokens=b * MEAN_CTX_PER_SEQ + pre,
                                 n_distinct=min(b + 1, 32) if lora else 0, max_loras=a,
                                 max_rank=16, n_waiting=0,
                                 n_tiles=(k + math.ceil(pre / 16)) if lora else 0))
    return pd.DataFrame(rows)


def compare_steps(derived: GpuProfile, calibrated: GpuProfile) -> pd.DataFrame:
    g = step_grid()
    cols = ["n_seqs", "n_prefill_tokens", "n_decode_tokens", "ctx_tokens", "n_distinct",
            "max_loras", "max_rank", "n_waiting", "n_tiles"]
    for name, prof in (("calibrated_ms", calibrated), ("derived_ms", derived)):
        g[name] = [step_time_ms_py(prof.step_coef, *(int(r[c]) for c in cols))
                   for _, r in g.iterrows()]
    g["rel_err_pct"] = 100 * (g.derived_ms / g.calibrated_ms - 1)
    return g


def compare_kv(derived: GpuProfile, calibrated: GpuProfile) -> pd.DataFrame:
    rows = []
    for (a, r), v in sorted(calibrated.kv_capacity.items(), key=lambda x: (x[0][1], x[0][0])):
        d = derived.kv_capacity.get((a, r))
        err = 100.0 if d is None else 100 * abs(d - v) / v
        rows.append(dict(max_loras=a, max_lora_rank=r, calibrated=v, derived=d,
                         abs_err_pct=err))
    return pd.DataFrame(rows)


def compare_maxpack(derived: GpuProfile, calibrated: GpuProfile, mixes, duration_s: float,
                    quiet: bool) -> pd.DataFrame:
    rows = []
    bar = tqdm(total=2 * len(mixes), desc="maxpack", unit="search", file=sys.stderr,
               disable=quiet)
    for rk, rt in mixes:
        ranks, rates = list(PAPER_RANKS[rk]), list(PAPER_RATES[rt])
        res = {}
        for name, prof in (("calibrated", calibrated), ("derived", derived)):
            res[name] = maxpack_search(prof, rates, ranks, duration_s=duration_s, seed=0)
            bar.update(1)
        c, d = res["calibrated"], res["derived"]
        rows.append(dict(ranks=rk, rates=rt, calibrated_tps=c.throughput_tps,
                         derived_tps=d.throughput_tps,
                         rel_err_pct=(100 * (d.throughput_tps / c.throughput_tps - 1)
                                      if c.throughput_tps > 0 else float("nan")),
                         calibrated_n=c.served_adapters, derived_n=d.served_adapters,
                         calibrated_amax=c.max_loras, derived_amax=d.max_loras))
    bar.close()
    return pd.DataFrame(rows)


def plot(steps: pd.DataFrame, kv: pd.DataFrame, mp: pd.DataFrame, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.8))
    for (kind, lora), g in steps.groupby(["kind", "lora"]):
        lab = f"{kind}{' +LoRA' if lora else ''}"
        line, = ax[0].plot(g.n_decode_tokens, g.calibrated_ms, "o-", label=f"{lab} calibrated")
        ax[0].plot(g.n_decode_tokens, g.derived_ms, "x--", color=line.get_color(),
                   label=f"{lab} derived")
    ax[0].set(xscale="log", yscale="log", xlabel="decode requests in the step",
              ylabel="step time (ms)", title="step time: derived vs calibrated Qwen")
    ax[0].legend(fontsize=7)
    for r, g in kv.groupby("max_lora_rank"):
        line, = ax[1].plot(g.max_loras, g.calibrated / 1e3, "o-", label=f"rank {r} calibrated")
        ax[1].plot(g.max_loras, g.derived.astype(float) / 1e3, "x--", color=line.get_color(),
                   label=f"rank {r} derived")
    ax[1].set(xlabel="max_loras", ylabel="KV capacity (k tokens)", title="KV-capacity table")
    ax[1].legend(fontsize=7)
    x = np.arange(len(mp))
    ax[2].bar(x - 0.2, mp.calibrated_tps, 0.4, label="calibrated Qwen")
    ax[2].bar(x + 0.2, mp.derived_tps, 0.4, label="derived Qwen")
    ax[2].set_xticks(x, [f"r{a}\nq{b}" for a, b in zip(mp.ranks, mp.rates)], fontsize=8)
    ax[2].set(ylabel="Maxpack throughput (tok/s)", title="Maxpack on the paper mixes")
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="three mixes and a 1200 s window instead of nine and 3600 s")
    ap.add_argument("--duration", type=float, default=None,
                    help="twin window of each Maxpack run in seconds (default 3600, quick 1200)")
    ap.add_argument("--out", default=str(REPO / "results" / "derived_profile_check.png"),
                    help="plot file (PNG)")
    ap.add_argument("--json", default=None, help="also write every table as JSON")
    ap.add_argument("--force", action="store_true", help="overwrite existing output files")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    try:
        out = check_output(a.out, "--out", a.force)
        json_out = check_output(a.json, "--json", a.force)
        duration = a.duration if a.duration is not None else (1200.0 if a.quick else 3600.0)
        if not (math.isfinite(duration) and duration > 0):
            raise CliError(f"--duration: must be a finite number of seconds > 0, got {duration}")
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    source, calibrated = load_profile(SOURCE), load_profile(TARGET)
    derived = derive_profile(source, gpu_spec(calibrated.gpu), model_config(TARGET))
    print(f"derived {derived.name} from {source.name} + public configs of {SOURCE} and {TARGET} "
          f"(GPU {calibrated.gpu}); compared with the calibrated profile {calibrated.name}\n")

    steps = compare_steps(derived, calibrated)
    step_smape = smape(steps.calibrated_ms, steps.derived_ms)
    print("step times (ms) on the grid:")
    print(markdown_table(steps[["kind", "lora", "n_seqs", "n_prefill_tokens", "calibrated_ms",
                                "derived_ms", "rel_err_pct"]]))
    print(f"step-time SMAPE {step_smape:.2f} %, largest |relative error| "
          f"{steps.rel_err_pct.abs().max():.1f} %\n")

    kv = compare_kv(derived, calibrated)
    kv_err = float(kv.abs_err_pct.mean())
    bb = 100 * (derived.backbone_kv_tokens / calibrated.backbone_kv_tokens - 1)
    print("KV capacity (tokens):")
    print(markdown_table(kv))
    print(f"KV table mean |error| {kv_err:.2f} % over {len(kv)} entries "
          f"({int(kv.derived.isna().sum())} would not start in the derived profile); backbone "
          f"{derived.backbone_kv_tokens:,} derived vs {calibrated.backbone_kv_tokens:,} "
          f"calibrated ({bb:+.1f} %)\n")

    mixes = QUICK_MIXES if a.quick else tuple((r, q) for r in PAPER_RANKS for q in PAPER_RATES)
    mp = compare_maxpack(derived, calibrated, mixes, duration, a.quiet)
    mp_smape = smape(mp.calibrated_tps, mp.derived_tps)
    within = int((mp.rel_err_pct.abs() <= 8.0).sum())
    print(f"Maxpack (strict rule, {duration:g} s window, seed 0):")
    print(markdown_table(mp))
    print(f"Maxpack throughput SMAPE {mp_smape:.2f} %, largest |relative error| "
          f"{mp.rel_err_pct.abs().max():.1f} %, within 8 %: {within}/{len(mp)} mixes; served "
          f"adapters equal on {int((mp.calibrated_n == mp.derived_n).sum())}/{len(mp)}\n")

    plot(steps, kv, mp, out)
    print(f"wrote {out}")
    if json_out is not None:
        json_out.write_text(json.dumps({
            "steps": steps.to_dict(orient="records"), "kv": kv.to_dict(orient="records"),
            "maxpack": mp.to_dict(orient="records"), "duration_s": duration,
            "derived_from": derived.derived_from}, indent=1, default=float))
        print(f"wrote {json_out}")
    print(f"derived_qwen_maxpack_smape={mp_smape:.2f} derived_qwen_kv_error_pct={kv_err:.2f} "
          f"derived_qwen_step_smape={step_smape:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
