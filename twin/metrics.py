"""Run metrics of one simulated server, computed from the kernel's raw outputs.

Definitions follow DESIGN.md section 1 and the shared data README:
- throughput = input + output tokens of requests completed inside the window / window;
- offered token rate = sum_i rate_i x (mean input + mean output) of the length model (the
  *expected* load; ``offered_realised_tps`` counts the arrivals actually drawn);
- starved = throughput < threshold x offered, the offered load being, as in the shared data
  README ("offered = input+output tokens of all *arrived* requests / duration"), the realised
  one (threshold 0.9; ``is_starved``). Against the expected load instead, a lightly loaded GPU
  (a few dozen requests an hour) "starves" whenever Poisson arrivals fall 10 % short of their
  mean — a third of the time for one adapter at 0.005 req/s;
- ITL mean = mean over all inter-token gaps of completed requests (exact); ITL p50/p99 come from
  a log-spaced histogram of every generated gap (1.2 % bin width);
- TTFT over completed requests, and ``ttft_paper_ms`` counting each unfinished request that
  arrived in the window as the full window.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from . import kernel as K


@dataclass(frozen=True)
class RunMetrics:
    """Outcome of one simulated run of one server."""

    duration_s: float
    throughput_tps: float
    offered_tps: float
    offered_realised_tps: float
    starved: bool
    memory_error: bool
    arrived_requests: int
    finished_requests: int
    unfinished_requests: int
    rejected_requests: int
    mean_itl_ms: float
    p50_itl_ms: float
    p99_itl_ms: float
    mean_ttft_ms: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    ttft_paper_ms: float
    preemptions: int
    adapter_loads: int
    adapter_load_s: float
    steps: int
    mean_batch_size: float
    max_batch_size: int
    mean_distinct_adapters: float
    mean_kv_usage_frac: float
    max_waiting: int
    kv_capacity_tokens: int
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _hist_quantile(hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if total == 0:
        return float("nan")
    idx = int(np.searchsorted(np.cumsum(hist), q * total))
    lo = K.ITL_HIST_LO_MS * 10 ** (idx / K.ITL_HIST_BINS * K.ITL_HIST_DECADES)
    hi = K.ITL_HIST_LO_MS * 10 ** ((idx + 1) / K.ITL_HIST_BINS * K.ITL_HIST_DECADES)
    return float(np.sqrt(lo * hi))


def memory_error_metrics(duration_s: float, offered_tps: float) -> RunMetrics:
    """Metrics of a configuration that cannot start (no KV-capacity entry)."""
    nan = float("nan")
    return RunMetrics(duration_s, 0.0, offered_tps, 0.0, True, True, 0, 0, 0, 0, nan, nan, nan, nan,
                      nan, nan, nan, 0, 0, 0.0, 0, 0.0, 0, 0.0, 0.0, 0, 0)


def realised_offered_tps(arrival: np.ndarray, in_len: np.ndarray, out_len: np.ndarray,
                         duration_s: float) -> float:
    """Input + output tokens of the requests arriving in ``[0, duration_s)``, per second."""
    win = arrival < duration_s
    return float(in_len[win].sum() + out_len[win].sum()) / duration_s


def is_starved(throughput_tps, offered_realised_tps, threshold: float = 0.9):
    """The 90 % rule (module docstring); works on scalars and arrays."""
    return np.asarray(throughput_tps) < threshold * np.asarray(offered_realised_tps)


def compute_metrics(arrival: np.ndarray, in_len: np.ndarray, out_len: np.ndarray,
                    first_t: np.ndarray, finish_t: np.ndarray, stats: np.ndarray,
                    itl_hist: np.ndarray, duration_s: float, offered_tps: float,
                    kv_blocks: int, block_size: int, starvation_threshold: float = 0.9
                    ) -> RunMetrics:
    """Summarise one kernel run over the window ``[0, duration_s]``."""
    in_window = arrival < duration_s
    done = (finish_t >= 0) & (finish_t <= duration_s)
    n_arrived = int(in_window.sum())
    n_done = int(done.sum())
    tokens_done = float(in_len[done].sum() + out_len[done].sum())
    throughput = tokens_done / duration_s
    realised = realised_offered_tps(arrival, in_len, out_len, duration_s)

    multi = done & (out_len > 1)
    gaps = float((finish_t[multi] - first_t[multi]).sum())
    n_gaps = float((out_len[multi] - 1).sum())
    mean_itl = 1000.0 * gaps / n_gaps if n_gaps > 0 else float("nan")
    ttft = (first_t[done] - arrival[done]) * 1000.0
    if n_done:
        mean_ttft = float(ttft.mean())
        p50_ttft, p99_ttft = (float(x) for x in np.percentile(ttft, [50, 99]))
    else:
        mean_ttft = p50_ttft = p99_ttft = float("nan")
    n_unfinished = n_arrived - n_done
    ttft_paper = ((float(ttft.sum()) + n_unfinished * duration_s * 1000.0) / n_arrived
                  if n_arrived else float("nan"))
    return RunMetrics(
        duration_s=duration_s,
        throughput_tps=throughput,
        offered_tps=offered_tps,
        offered_realised_tps=realised,
        starved=bool(is_starved(throughput, realised, starvation_threshold)),
        memory_error=False,
        arrived_requests=n_arrived,
        finished_requests=n_done,
        unfinished_requests=n_unfinished,
        rejected_requests=int(stats[K.ST_REJECTED]),
        mean_itl_ms=mean_itl,
        p50_itl_ms=_hist_quantile(itl_hist, 0.5),
        p99_itl_ms=_hist_quantile(itl_hist, 0.99),
        mean_ttft_ms=mean_ttft,
        p50_ttft_ms=p50_ttft,
        p99_ttft_ms=p99_ttft,
        ttft_paper_ms=ttft_paper,
        preemptions=int(stats[K.ST_PREEMPTIONS]),
        adapter_loads=int(stats[K.ST_LOADS]),
        adapter_load_s=float(stats[K.ST_LOAD_S]),
        steps=int(stats[K.ST_STEPS]),
        mean_batch_size=float(stats[K.ST_RUNNING_S]) / duration_s,
        max_batch_size=int(stats[K.ST_MAX_RUNNING]),
        mean_distinct_adapters=(float(stats[K.ST_DISTINCT_S]) / float(stats[K.ST_BUSY_S])
                                if stats[K.ST_BUSY_S] > 0 else 0.0),
        mean_kv_usage_frac=float(stats[K.ST_KV_BLOCKS_S]) / duration_s / kv_blocks,
        max_waiting=int(stats[K.ST_MAX_WAITING]),
        kv_capacity_tokens=kv_blocks * block_size,
    )
