"""Serving metrics of one server (or a pool of servers) over a window, defined as the twin does.

Throughput = input + output tokens of requests completed inside the window / window; offered =
the same over every request sent in the window; starved = throughput < threshold x offered
(``twin.metrics.is_starved``). Latencies over completed requests as vLLM's
``benchmark_serving.py``: TTFT = first token - send; TPOT = (finish - first token) / (output
tokens - 1); ITL = gaps between consecutive tokens (mean = total decode time / gaps, p99 over the
pooled gaps). All times in twin seconds (wall x time scale; 1 for a real GPU).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from twin.metrics import is_starved

COMPARED = ("throughput_tps", "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "mean_itl_ms", "p99_itl_ms")


@dataclass(frozen=True)
class ServingMetrics:
    """Metrics of one server or of several pooled (see the module docstring)."""

    window_s: float
    sent: int
    completed: int
    failed: int
    throughput_tps: float
    offered_tps: float
    starved: bool
    mean_ttft_ms: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    p50_tpot_ms: float
    p99_tpot_ms: float
    mean_itl_ms: float
    p99_itl_ms: float

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}


def _stats(x: np.ndarray) -> tuple[float, float, float]:
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    p50, p99 = np.percentile(x, [50, 99])
    return float(x.mean()), float(p50), float(p99)


def serving_metrics(arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray,
                    first_s: np.ndarray, finish_s: np.ndarray, window_s: float,
                    threshold: float = 0.9, itl_gaps_ms: np.ndarray | None = None,
                    p99_itl_ms: float | None = None, failed: int = 0) -> ServingMetrics:
    """Metrics of the requests sent in ``[0, window_s)``; ``first_s`` / ``finish_s`` are NaN
    (or negative) for requests that did not produce a first token / finish. The p99 ITL comes
    from ``itl_gaps_ms`` (every gap of the completed requests) or is given."""
    arrival_s = np.asarray(arrival_s, float)
    inl = np.asarray(input_len, float)
    outl = np.asarray(output_len, float)
    first_s = np.asarray(first_s, float)
    finish_s = np.asarray(finish_s, float)
    sent = arrival_s < window_s
    done = sent & np.isfinite(finish_s) & (finish_s >= 0) & (finish_s <= window_s)
    throughput = float(inl[done].sum() + outl[done].sum()) / window_s
    offered = float(inl[sent].sum() + outl[sent].sum()) / window_s
    ttft = (first_s[done] - arrival_s[done]) * 1000.0
    multi = done & (outl > 1)
    span = finish_s[multi] - first_s[multi]
    tpot = span * 1000.0 / (outl[multi] - 1)
    n_gaps = float((outl[multi] - 1).sum())
    mean_itl = float(span.sum() * 1000.0 / n_gaps) if n_gaps > 0 else float("nan")
    if p99_itl_ms is None:
        gaps = np.asarray(itl_gaps_ms if itl_gaps_ms is not None else [], float)
        p99_itl_ms = float(np.percentile(gaps, 99)) if len(gaps) else float("nan")
    return ServingMetrics(float(window_s), int(sent.sum()), int(done.sum()), int(failed),
                          throughput, offered, bool(is_starved(throughput, offered, threshold)),
                          *_stats(ttft), *_stats(tpot), mean_itl, float(p99_itl_ms))


def relative_differences(measured: ServingMetrics, twin: ServingMetrics) -> dict[str, float | None]:
    """(measured - twin) / twin for every compared metric (None when undefined)."""
    out: dict[str, float | None] = {}
    for k in COMPARED:
        m, t = getattr(measured, k), getattr(twin, k)
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (m, t)) and t != 0
        out[k] = (m - t) / t if ok else None
    return out
