"""Fitting ``twin.latency_tail``'s constants on the shared max-search runs (never on the
validation runs): each run replayed in the twin from its configuration columns, then a least
SMAPE fit of the TTFT offsets, cold starts, delivery delays and stalls.

    python -m twin.latency_tail_fit --fit ../shared/data/vllm_h100 [--profile llama-3.1-8b-instruct]

Kept apart from the model it fits: the model is applied inside every twin run
(``twin.metrics``), while the fit replays runs with the twin (``twin.server``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import kernel as K
from .latency_tail import (CONSTANTS_FILE, GapPoints, LatencyTail, arrival_rate,
                           batch_adapters, cold_start_waits_ms, forget_constants,
                           gap_quantiles, hist_mean_ms, own_blocks, run_features)
from .profile import load_profile
from .server import run_kernel
from .slot_fit import counts_agree, shared_run_setup
from .workload import generate_requests

MAXSEARCH_CSV = Path("validation_llama") / "maxsearch_llama.csv"
FIT_PROFILE = "llama-3.1-8b-instruct"


@dataclass
class ReplaySample:
    """One real max-search run and the twin's replay of it, reduced to what the fit needs."""

    run_id: str
    starved: bool                   # the real run's 90 % verdict (starved_90)
    ttft_ms: np.ndarray             # the twin's engine TTFT of each completed request
    arrival_s: np.ndarray           # ... and its arrival (s)
    block_starts: np.ndarray        # sorted first arrivals of the adapters (s): cold starts
    own: np.ndarray                 # per completed request, its own block's index (-1: none)
    running: float                  # the twin's mean running requests
    adapters: float                 # adapters with arrivals
    itl_hist: np.ndarray            # the twin's engine ITL histogram
    real: dict                      # mean_ttft_ms, median_ttft_ms, p99_ttft_ms, p99_itl_ms
    active: float = 0.0             # the twin's mean distinct adapters per batch
    waiting: float = 0.0            # the twin's longest waiting queue
    arrival_rate: float = 0.0       # requests arriving per second in the window


def _replay_one(args: tuple) -> ReplaySample | None:
    profile_name, cfg, real = args
    profile = load_profile(profile_name)
    adapters, lengths, sc = shared_run_setup(cfg, 0)
    dur = float(cfg["total_time_s"])
    reqs = generate_requests(adapters, dur, lengths, seed=0)
    run = run_kernel(profile, adapters, reqs, sc, dur)
    if run is None:
        return None
    running, n_adapters, first = run_features(reqs.arrival_s, reqs.adapter, run.stats, dur)
    done = (run.finish_t >= 0) & (run.finish_t <= dur)
    starts, own = own_blocks(reqs.arrival_s, first)
    return ReplaySample(str(cfg.get("run_id", "")), bool(real.pop("starved")),
                        (run.first_t[done] - reqs.arrival_s[done]) * 1000.0,
                        reqs.arrival_s[done].copy(), starts, own[done],
                        running, n_adapters, run.itl_hist.copy(), real,
                        batch_adapters(run.stats), float(run.stats[K.ST_MAX_WAITING]),
                        arrival_rate(reqs.arrival_s, dur))


def replay_maxsearch(data_dir: str | Path, profile_name: str = FIT_PROFILE,
                     progress: bool = True, workers: int = 1) -> list[ReplaySample]:
    """Replay every ok max-search run (``<data_dir>/validation_llama/maxsearch_llama.csv``)
    in the twin from its configuration columns, seed 0, on ``workers`` processes (a few
    minutes on one); the samples come back in the runs' order whatever ``workers`` is."""
    import pandas as pd
    from tqdm import tqdm

    path = Path(data_dir) / MAXSEARCH_CSV
    if not path.exists():
        raise FileNotFoundError(f"{path}: the max-search runs are needed for the fit")
    df = pd.read_csv(path)
    ok = df[(df["status"] == "ok") & df["p99_itl_ms"].notna() & df["p99_ttft_ms"].notna()]
    ok = ok[[counts_agree(a, b) for a, b in zip(ok["adapter_rank_counts"], ok["rate_counts"])]]
    cols = ["run_id", "model", "max_loras", "served_adapters", "max_lora_rank",
            "adapter_rank_counts", "rate_counts", "total_time_s", "pool_mean_input_len",
            "pool_mean_output_len", "max_num_batched_tokens", "max_num_seqs"]
    jobs = []
    for _, r in ok.iterrows():
        real = {k: float(r[k]) for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                                         "p99_itl_ms")}
        real["starved"] = str(r["starved_90"]).lower() == "true"
        jobs.append((profile_name, r[cols].to_dict(), real))
    if workers > 1:
        from .fleet import worker_pool
        with worker_pool(workers) as pool:
            out = list(tqdm(pool.map(_replay_one, jobs, chunksize=4), total=len(jobs),
                            desc="replaying max-search runs", disable=not progress))
    else:
        out = [_replay_one(j) for j in tqdm(jobs, desc="replaying max-search runs",
                                            disable=not progress)]
    return [s for s in out if s is not None]


def _smape(y: np.ndarray, p: np.ndarray) -> float:
    return float(100.0 * np.mean(np.abs(y - p) / (np.abs(y) + np.abs(p))))


def _ttft_stats(s: ReplaySample, base: float, cold: float) -> tuple[float, float, float]:
    """Mean, median and p99 client TTFT (ms) of a replayed run."""
    t = s.ttft_ms + base + cold_start_waits_ms(cold, s.arrival_s, s.ttft_ms / 1000.0,
                                               s.block_starts, s.own)
    return float(t.mean()), *(float(v) for v in np.percentile(t, [50, 99]))


DELAY_TERMS = ("itl_delay_prob", "itl_delay_ms", "itl_delay_half_running",
               "itl_delay_adapter_exp", "itl_delay_active_exp", "itl_delay_queue_exp",
               "itl_delay_running_exp")
STALL_TERMS = ("stall_per_request", "stall_ms", "stall_step_exp")
ITL_STARTS = ((0.067, 134.0, 19.0, 0.78, 0.23, 0.1, 1.0),      # frequent, short delivery delays
              (0.023, 1156.0, 164.0, 0.69, 0.08, 0.32, 1.0))   # rare, long ones
STALL_STARTS = ((2e-4, 2000.0, 0.0), (2e-4, 600.0, 3.0),   # stalls per arriving request,
                (3e-4, 1000.0, 2.0))                          # mean ms, per-step exponent


def fit_latency_tail(samples: list[ReplaySample]) -> tuple[LatencyTail, dict]:
    """Least SMAPE fit (Nelder-Mead, deterministic starts): the TTFT terms on the mean, median
    and p99 TTFT of the runs the real server did not starve, the delivery delays on the p99 ITL
    of every run. The p99 ITL objective has separate basins (frequent short delays, rare long
    ones), so the delays are started from each of ``ITL_STARTS`` and the least SMAPE wins (the
    same data give the same constants whatever was fitted before); then the stall terms alone
    from each of ``STALL_STARTS``, then all ten together from the best. Returns the constants
    and a report of the SMAPE before / after."""
    from scipy.optimize import minimize

    unst = [s for s in samples if not s.starved]
    y_t = np.array([[s.real["mean_ttft_ms"], s.real["median_ttft_ms"], s.real["p99_ttft_ms"]]
                    for s in unst])

    def ttft_pred(x) -> np.ndarray:
        a0, ar, an, c = x
        return np.array([_ttft_stats(s, a0 + ar * s.running + an * s.adapters, c)
                         for s in unst])

    def ttft_obj(x) -> float:
        if min(x) < 0:
            return 1e9
        p = ttft_pred(x)
        return sum(_smape(y_t[:, k], p[:, k]) for k in range(3))

    r1 = minimize(ttft_obj, [5.0, 0.1, 0.02, 300.0], method="Nelder-Mead",
                  options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-4})
    y_i = np.array([s.real["p99_itl_ms"] for s in samples])

    gaps = [hist_mean_ms(s.itl_hist) for s in samples]
    points = GapPoints.of([s.itl_hist for s in samples])

    def itl_pred(x) -> np.ndarray:
        # only the delay and stall terms are used
        tail = LatencyTail(0, 0, 0, 0, **dict(zip(DELAY_TERMS + STALL_TERMS, map(float, x))))
        mus = [tail.delay_mean_ms(s.running, s.adapters, s.active, s.waiting) for s in samples]
        rates = [tail.stall_rate(s.arrival_rate, g) for s, g in zip(samples, gaps)]
        return gap_quantiles(points, 0.99, tail.itl_delay_prob, mus, rates, tail.stall_ms)

    def itl_obj(x) -> float:
        if not (0.0 < x[0] <= 1.0 and x[1] > 0 and x[2] > 0 and x[6] > 0):
            return 1e9
        if len(x) > 7 and (x[7] < 0 or x[8] <= 0 or x[9] < 0):
            return 1e9
        return _smape(y_i, itl_pred(x))

    def nm(x0, iters: int, f=itl_obj):
        return minimize(f, list(x0), method="Nelder-Mead",
                        options={"maxiter": iters, "xatol": 1e-4, "fatol": 1e-3})

    r2 = min((nm(x0, 600) for x0 in ITL_STARTS), key=lambda r: float(r.fun))
    delays = [float(v) for v in r2.x]
    r3 = min((nm(z0, 150, lambda z: itl_obj(delays + list(z))) for z0 in STALL_STARTS),
             key=lambda r: float(r.fun))
    r4 = nm(delays + [float(v) for v in r3.x], 600)
    a0, ar, an, c = (float(v) for v in r1.x)
    tail = LatencyTail(ttft_base_ms=a0, ttft_per_running_ms=ar, ttft_per_adapter_ms=an,
                       cold_start_ms=c,
                       **dict(zip(DELAY_TERMS + STALL_TERMS, (float(v) for v in r4.x))))
    t0, t1 = ttft_pred([0, 0, 0, 0]), ttft_pred(r1.x)
    i0, i1 = itl_pred([0, 0, 1, 0, 0, 0, 1]), itl_pred(r4.x)
    report = {"runs": len(samples), "unstarved_runs": len(unst)}
    for k, name in enumerate(("mean_ttft", "median_ttft", "p99_ttft")):
        report[f"{name}_smape_unstarved"] = [_smape(y_t[:, k], t0[:, k]),
                                             _smape(y_t[:, k], t1[:, k])]
    report["p99_itl_smape"] = [_smape(y_i, i0), _smape(y_i, i1)]
    report["p99_itl_smape_delays_only"] = float(r2.fun)
    return tail, report


def write_constants(tail: LatencyTail, profile_name: str, report: dict, data_dir: str | Path,
                    path: Path = CONSTANTS_FILE) -> None:
    """Put ``tail`` under ``profile_name`` in the constants file (other profiles kept)."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault("about", "twin.latency_tail constants per profile, fitted on the shared "
                   "max-search runs; refit: python -m twin.latency_tail_fit --fit <data dir>")
    doc.setdefault("profiles", {})[profile_name] = {
        "constants": tail.to_dict(),
        "fit": {"data": f"{Path(data_dir).name}/{MAXSEARCH_CSV.as_posix()}",
                **{k: ([round(x, 3) for x in v] if isinstance(v, list) else v)
                   for k, v in report.items()}},
    }
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    forget_constants()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m twin.latency_tail_fit",
                                description="Fit the client-side latency model (TTFT offsets, "
                                "cold starts, token delivery delays) on the shared max-search "
                                "runs and write its constants beside the profiles.")
    p.add_argument("--fit", required=True, metavar="DATA_DIR",
                   help="the shared data folder (…/vllm_h100)")
    p.add_argument("--profile", default=FIT_PROFILE,
                   help=f"the profile the runs are replayed on and the constants are for "
                        f"({FIT_PROFILE})")
    p.add_argument("--out", default=str(CONSTANTS_FILE), help="constants file (%(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print, do not write")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--workers", type=int, default=1, help="replay processes (%(default)s)")
    a = p.parse_args(argv)
    try:
        samples = replay_maxsearch(a.fit, a.profile, progress=not a.quiet,
                                   workers=max(1, a.workers))
    except FileNotFoundError as e:
        print(f"error: --fit: {e}", file=sys.stderr)
        return 2
    tail, report = fit_latency_tail(samples)
    print(json.dumps({"constants": tail.to_dict(), "fit": report}, indent=2))
    if not a.dry_run:
        write_constants(tail, a.profile, report, a.fit, Path(a.out))
        print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
