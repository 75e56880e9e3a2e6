"""Evaluate a model directory on held-out twin scenarios or on real max-search runs.

Twin evaluation (``--data``) uses the rows without a memory error (those are exact by
construction: every model reads the profile's KV table) of the held-out split recorded in the
manifest. Real evaluation (``--real``) builds each run's GPU features from its configuration
columns only (``config_rates`` / ``config_sizes`` cycled over ``served_adapters``,
``max_loras``, pool mean lengths) and compares with ``total_throughput_tps`` and
``starved_90`` of the runs with status ``ok``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from .dataset import load_dataset
from .domain import validate
from .features import FEATURES, gpu_features
from .metrics import accuracy, f1, mape, smape
from .train import load_bundle, test_mask


def _us_per_pred(fn, M: np.ndarray, min_rows: int = 200_000, repeat: int = 3) -> float:
    reps = max(1, int(np.ceil(min_rows / len(M))))
    big = np.ascontiguousarray(np.tile(M, (reps, 1)))
    fn(big[:10])  # warm up / compile
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(big)
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / len(big)


def _table(rows: list[dict]) -> str:
    return pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}")


def evaluate_twin(model_dir, data, split: str = "test", log=print) -> dict:
    b = load_bundle(model_dir)
    df = load_dataset(data)
    meta = df.attrs.get("meta", {})
    if meta.get("profile") != b.manifest["profile"]:
        raise ValueError(f"data: profile {meta.get('profile')!r} differs from the model's "
                         f"{b.manifest['profile']!r}")
    if meta.get("profile_hash") != b.manifest.get("profile_hash"):
        log(f"warning: dataset profile hash {meta.get('profile_hash')} differs from the model's "
            f"{b.manifest.get('profile_hash')} (profile recalibrated since training?)")
    if split == "test":
        sp = b.manifest["split"]
        sel = test_mask(df, sp["seed"], sp["test_frac"])
    else:
        sel = np.ones(len(df), bool)
    df = df[sel & ~df["memory_error"].to_numpy()].reset_index(drop=True)
    if len(df) == 0:
        raise ValueError("data: no evaluation rows (empty split)")
    M = validate(df)
    y = df["throughput_tps"].to_numpy()
    st = df["starved"].to_numpy().astype(bool)
    itl = df["mean_itl_ms"].to_numpy()
    rows, res = [], {}

    thr, ood = b.throughput.predict_with_flags(M)
    stp, _ = b.starvation.predict_with_flags(M)
    itp, _ = b.itl.predict_with_flags(M)
    fthr, fst, _ = b.fast.predict_with_flags(M)
    cthr, cfeas, cood = b.capacity.predict_with_flags(M)
    ok_itl = np.isfinite(itl) & (itl > 0)

    us_full = _us_per_pred(lambda X: (b.throughput.predict_with_flags(X), b.starvation.predict_with_flags(X)), M, 50_000, 2)
    us_itl = _us_per_pred(lambda X: b.itl.predict_with_flags(X), M, 50_000, 2)
    us_fast = _us_per_pred(lambda X: b.fast.predict_unchecked(X), M)
    us_fast_checked = _us_per_pred(lambda X: b.fast.predict_with_flags(X), M, 100_000, 2)
    us_cap = _us_per_pred(lambda X: b.capacity.predict_with_flags(X), M, 100_000, 2)

    rows.append({"model": "full (throughput+starvation)", "thr_smape": smape(y, thr),
                 "thr_mape": mape(y, thr), "starv_f1": f1(st, stp), "starv_acc": accuracy(st, stp),
                 "starv_f1_from_thr": f1(st, thr < 0.9 * df["f_load"].to_numpy()),
                 "us_per_pred": us_full})
    rows.append({"model": "itl", "itl_smape": smape(itl[ok_itl], itp[ok_itl]),
                 "itl_mape": mape(itl[ok_itl], itp[ok_itl]), "us_per_pred": us_itl})
    rows.append({"model": "fast (distilled, numba)", "thr_smape": smape(y, fthr),
                 "thr_mape": mape(y, fthr), "starv_f1": f1(st, fst), "starv_acc": accuracy(st, fst),
                 "us_per_pred": us_fast, "us_per_pred_checked": us_fast_checked})
    inn = ~cood
    rows.append({"model": f"encodable (x={b.capacity.x_feature})", "thr_smape": smape(y[inn], cthr[inn]),
                 "thr_mape": mape(y[inn], cthr[inn]), "starv_f1": f1(st[inn], ~cfeas[inn]),
                 "starv_acc": accuracy(st[inn], ~cfeas[inn]), "us_per_pred": us_cap,
                 "rows_in_domain": int(inn.sum())})
    feas_true = ~st
    rows.append({"model": "encodable, truly feasible rows", "thr_smape": smape(y[inn & feas_true], cthr[inn & feas_true]),
                 "starv_acc": accuracy(st[inn & feas_true], ~cfeas[inn & feas_true]),
                 "rows_in_domain": int((inn & feas_true).sum())})
    # conservativeness of the encodable model: predicted feasible but actually starved
    false_feas = float(np.mean(cfeas[inn] & st[inn])) if inn.any() else float("nan")
    log(f"evaluate: {len(df)} held-out rows without memory error ({split}), profile "
        f"{b.manifest['profile']}; rows outside the trained box: {int(ood.sum())}; "
        f"encodable out of domain: {int(cood.sum())}; encodable false-feasible rate "
        f"{100 * false_feas:.2f} %")
    log(_table(rows))
    res = {"throughput_smape": smape(y, thr), "starvation_f1": f1(st, stp),
           "fast_throughput_smape": smape(y, fthr), "fast_us": us_fast,
           "fast_starvation_f1": f1(st, fst), "itl_smape": smape(itl[ok_itl], itp[ok_itl]),
           "encodable_smape": smape(y[inn], cthr[inn]), "encodable_f1": f1(st[inn], ~cfeas[inn])}
    log(f"throughput_smape={res['throughput_smape']:.3f} starvation_f1={res['starvation_f1']:.4f} "
        f"fast_throughput_smape={res['fast_throughput_smape']:.3f} fast_us={res['fast_us']:.3f}")
    return res


def _counts(text: str, key=float) -> dict:
    out = {}
    for tok in str(text).replace(",", " ").split():
        k, c = tok.split(":")
        out[key(k)] = int(c)
    return out


def real_features(df: pd.DataFrame) -> np.ndarray:
    """GPU features of real runs from configuration columns only: ``config_rates`` and
    ``config_sizes`` cycled over ``served_adapters`` (as the benchmark assigns them),
    ``max_loras``, max rank = the largest size, pool mean input/output lengths."""
    for c in ("config_rates", "config_sizes"):
        if c not in df.columns:
            raise ValueError(f"real: missing column {c!r}")
    rows = []
    for r in df.itertuples(index=False):
        n = int(r.served_adapters)
        try:
            cr = [float(v) for v in str(r.config_rates).split()]
            cs = [int(v) for v in str(r.config_sizes).split()]
        except ValueError:
            raise ValueError(f"real: run {getattr(r, 'run_id', '?')}: cannot parse config_rates "
                             f"{r.config_rates!r} / config_sizes {r.config_sizes!r}") from None
        if not cr or not cs:
            raise ValueError(f"real: run {getattr(r, 'run_id', '?')}: empty config_rates/sizes")
        rates = [cr[i % len(cr)] for i in range(n)]
        ranks = [cs[i % len(cs)] for i in range(n)]
        rows.append(gpu_features(ranks, rates, int(r.max_loras),
                                 (float(r.pool_mean_input_len), float(r.pool_mean_output_len))))
    return np.asarray(rows)


def evaluate_real(model_dir, csv, log=print) -> dict:
    b = load_bundle(model_dir)
    path = Path(csv)
    if not path.is_file():
        raise ValueError(f"real: file not found: {path}")
    df = pd.read_csv(path)
    need = ["status", "served_adapters", "max_loras", "pool_mean_input_len",
            "pool_mean_output_len", "total_throughput_tps", "starved_90"]
    miss = [c for c in need if c not in df.columns]
    if miss:
        raise ValueError(f"real: {path.name}: missing column {miss[0]!r}")
    if "model" in df.columns and set(df["model"]) != {b.manifest["profile"]}:
        log(f"warning: real runs of {sorted(set(df['model']))} evaluated with a model of "
            f"{b.manifest['profile']}")
    ok = df[df["status"] == "ok"].reset_index(drop=True)
    M = real_features(ok)
    y = ok["total_throughput_tps"].to_numpy(float)
    st = ok["starved_90"].astype(str).str.lower().eq("true").to_numpy()
    thr, ood = b.throughput.predict_with_flags(M)
    stp, _ = b.starvation.predict_with_flags(M)
    fthr, fst, _ = b.fast.predict_with_flags(M)
    cthr, cfeas, cood = b.capacity.predict_with_flags(M)
    itl_ok = ok["mean_itl_ms"].to_numpy(float) if "mean_itl_ms" in ok else None
    rows = [{"model": "full", "thr_smape": smape(y, thr), "thr_mape": mape(y, thr),
             "starv_f1": f1(st, stp), "starv_acc": accuracy(st, stp),
             "starv_f1_from_thr": f1(st, thr < 0.9 * M[:, FEATURES.index("load")])},
            {"model": "fast", "thr_smape": smape(y, fthr), "thr_mape": mape(y, fthr),
             "starv_f1": f1(st, fst), "starv_acc": accuracy(st, fst)}]
    inn = ~cood
    rows.append({"model": f"encodable (x={b.capacity.x_feature})", "thr_smape": smape(y[inn], cthr[inn]),
                 "thr_mape": mape(y[inn], cthr[inn]), "starv_f1": f1(st[inn], ~cfeas[inn]),
                 "starv_acc": accuracy(st[inn], ~cfeas[inn]), "rows": int(inn.sum())})
    if itl_ok is not None:
        itp, _ = b.itl.predict_with_flags(M)
        good = np.isfinite(itl_ok) & np.isfinite(itp)
        rows.append({"model": "itl", "itl_smape": smape(itl_ok[good], itp[good]),
                     "itl_mape": mape(itl_ok[good], itp[good])})
    # memory errors among failed runs
    mem_fail = df["failure_reason"].isin(["kv_cache_below_max_model_len", "gpu_oom"]) if "failure_reason" in df else None
    log(f"real: {len(ok)} ok runs of {len(df)} in {path.name}; outside the trained box: "
        f"{int(ood.sum())} (flagged, predictions still scored); encodable out of domain: "
        f"{int(cood.sum())}")
    if mem_fail is not None and mem_fail.any():
        failed = df[mem_fail].reset_index(drop=True)
        mr = failed["config_sizes"].map(lambda t: max(int(v) for v in str(t).split())).to_numpy()
        kvt = b.throughput.kv_.tokens_array(failed["max_loras"].to_numpy(), mr)
        log(f"real: memory-error runs predicted as memory errors by the KV table: "
            f"{int((kvt <= 0).sum())}/{len(failed)}")
    log(_table(rows))
    res = {"real_throughput_smape": smape(y, thr), "real_starvation_f1": f1(st, stp)}
    log(f"real_throughput_smape={res['real_throughput_smape']:.3f} "
        f"real_starvation_f1={res['real_starvation_f1']:.4f}")
    return res
