"""What the client sees beyond the engine: TTFT and inter-token-gap tails of a vLLM server.

The twin's kernel times the *engine* (scheduler steps). vLLM's benchmark client times tokens as
they reach it through the OpenAI API server, and the shared max-search runs
(``validation_llama/maxsearch_llama.csv``, 361 runs with mean/median/p99 TTFT and ITL) show three
things the engine alone does not have (measured against the twin's replays of those runs; the
fit command below prints the SMAPE before and after):

1. **A per-request latency on TTFT** outside the engine (HTTP, tokenisation, handing the first
   token back through the API server), which grows with the streams the API server is serving:
   on the lightly loaded runs the real median TTFT is 5-7 ms above the twin's, 20-35 ms at 40-80
   running requests. Modelled as ``ttft_base_ms + ttft_per_running_ms * R + ttft_per_adapter_ms
   * N`` on every completed request (R: the twin's mean running requests, N: adapters with
   requests in the run).
2. **A cold start for the first request of each adapter.** The shared runs do not pre-load
   adapters (``lora_pre_loading`` False), so the first request of an adapter waits for it to be
   read from disk and set up (calibration/adapter_loading_samples.csv: disk->CPU loads of 70-885
   ms). Whenever first requests are more than 1 % of the requests (served adapters / arrivals >
   1 %: every low-rate max-search configuration), the real p99 TTFT of an idle server is
   330-400 ms while its median is 33-45 ms; where they are fewer than 0.2 %, p99 is 60-100 ms.
   The load runs inside the engine's step (vLLM reads an adapter that is not in CPU memory
   from disk when it first schedules it), so it holds back every request waiting for its
   first token then, not only the adapter's own: on the shared no-swap runs with 32-128
   adapters at 2-8 requests/s the real p99 TTFT is 170-1230 ms where cold starts are only
   0.2-0.5 % of the requests. The loads run one after another, so adapters first asked for
   close together queue: the low-rate rank-32 runs with 64-128 adapters have a real mean TTFT
   5-12 times their median and a p99 of 10-14 s, the backlog of the loads asked for in the
   first seconds. Modelled as a block of ``cold_start_ms`` per adapter, queued from its first
   arrival behind the blocks before it (:class:`ColdStartSchedule`): a request gets its first
   token once its engine wait has passed outside blocks, so it waits out the block it arrives
   in and every block that begins before its first token, and an adapter's first request waits
   at least until its own block ends; the blocks' gap in running requests' tokens is not
   modelled (as delivery stalls of every stream it raised the fit's p99 ITL SMAPE, 10.04 ->
   10.11 %). Against blocks that overlap instead of queueing, the fit (mean + median + p99
   TTFT SMAPE on the unstarved max-search runs) drops from 42.5 to 35.7 (mean TTFT 12.2 -> 9.7
   %, p99 20.3 -> 17.3 %), and on the unstarved validation runs, never used by the fit, the
   mean TTFT SMAPE from 8.38 to 7.69 %.
3. **Token delivery jitter.** The API server hands tokens to the client late now and then,
   more often and longer the more streams it serves; a late token is followed by a short gap
   (the next token catches up), so the mean inter-token gap is unchanged while the tail widens
   (the real p99 ITL keeps growing with running requests and adapters where the engine's
   saturates per ``max_loras``; on the most loaded real servers the median gap is 0.01 ms:
   tokens arriving in bursts). Modelled as an independent delay per token: none with
   probability ``1 - itl_delay_prob``, else exponential with mean
   ``mu = itl_delay_ms * R^h / (R^h + itl_delay_half_running^h) * (N / 100) **
   itl_delay_adapter_exp * (D / N) ** itl_delay_active_exp * (1 + W / 100) **
   -itl_delay_queue_exp`` with ``h = itl_delay_running_exp`` (the delay saturates once the API
   server is busy all the time, and with h > 1 it stays small while few streams run: the real
   16-adapter servers at 80-100 running requests show p99 ITL about twice their mean ITL, the
   32-adapter ones at 400-700 four to eight times it; fitted h = 1.34, the fit's p99 ITL SMAPE
   10.43 -> 10.04 %, on the validation runs 12.62 -> 12.16 %; D: the mean distinct adapters of the
   twin's batches, so a server whose slots hold few of its adapters at once delays less than one
   that runs them all; W: the twin's longest waiting queue, so a server far past its capacity,
   whose engine gaps are long already, adds less: on the shared max-search runs the two terms
   take the p99 ITL SMAPE of the fit from 18.3 to 14.1 %, and on the validation runs, never used
   by the fit, from 20.0 to 14.5 %);
   an observed gap is ``g + J_i - J_{i-1}`` (g: the engine's gap from the twin's histogram,
   J: the delivery delays of the token and of the one before), clipped at zero.
4. **Stalls that grow with the arrival rate.** On the starved shared max-search and validation
   runs the median ratio of p99 to mean ITL is 1.5-4 up to 30 requests arriving per engine step
   (arrival rate x mean ITL), 5-7 at 30-60 and 10-14 beyond (p99 up to 2.7 s), at any
   ``max_loras`` — many slots make steps long, so a high-rate server with many slots gets
   there first, while the same arrivals on 8 slots do not. Modelled as stalls of the whole
   server's token delivery arriving at ``stall_per_request`` x the arrival rate (per second),
   each exponential of mean ``stall_ms``: an engine gap ``g`` holds a stall with probability
   ``min(1, stall_per_request x rate x g x (A / A_REF) ** stall_step_exp)`` and is then seen
   as ``g + stall``, with A = rate x the mean engine gap: the requests arriving per engine
   step, A_REF = 30. The real p99 / mean ITL ratio stays at 1.4-2.7 from 5 to 30 arrivals per
   step and climbs steeply beyond (4-5 at 30-45, 7-11 at 45-60, 12-16 above), at any
   ``max_loras``: a rate-proportional stall alone put stalls into the 8-16-slot servers at
   240-300 requests/s (10-20 per step) that the real ones do not show. The tokens held
   back reach the client together afterwards, which leaves the mean ITL as it was; those
   near-zero gaps are not modelled (they move low quantiles only; the SLOs judge upper ones).
   Fitted after the delivery delays (the stall terms alone, then all ten together): on the
   shared validation runs, never used by the fit, p99 ITL SMAPE 14.0 % without stalls, 13.1 %
   with rate-proportional ones (``stall_step_exp`` 0), 12.6 % with the per-step term, 12.2 %
   with the running exponent of item 3 as well (``experiments.twin_fidelity --runs``).

The median and p99 of the observed gaps are computed exactly from the histogram (no sampling).

None of it touches the kernel: throughput, step counts, mean ITL and mean TPOT are those of the
engine (a constant delivery offset and a delivery delay of the first token move first and last
token alike, so TPOT is unchanged; a delay followed by a catch-up leaves the total decode time,
hence the mean ITL, as it was). The model is opt-in: ``twin.metrics.compute_metrics(...,
adapter=, latency_tail=)`` applies it (``experiments.twin_fidelity`` does, with
:func:`latency_tail_for`); ``simulate_server`` reports the engine's latencies, while an SLO is
judged on the client's by default (``twin.slo``, ``Slo.latency``). Profiles without fitted constants (``latency_tail.json`` beside the
profiles has no entry for them) give ``None`` and the plain computation.

Refit (``twin.latency_tail_fit``; writes ``twin/profiles/latency_tail.json``)::

    python -m twin.latency_tail_fit --fit ../shared/data/vllm_h100 [--profile llama-3.1-8b-instruct]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

import numpy as np
from numba import njit, prange

from . import kernel as K

CONSTANTS_FILE = Path(__file__).resolve().parent / "profiles" / "latency_tail.json"
N_REF = 100.0       # adapters at which the saturated mean delivery delay is itl_delay_ms
W_REF = 100.0       # waiting requests at which the queue term halves the delay at exponent 1
GAP_EPS_S = 1e-9    # cold-start blocks closer than this (s) are back to back
A_REF = 30.0        # arrivals per engine step at which the stall term is stall_per_request x rate
OPTIONAL_TERMS = frozenset({"itl_delay_active_exp", "itl_delay_queue_exp",
                            "stall_per_request", "stall_ms", "stall_step_exp",
                            "itl_delay_running_exp"})


@dataclass(frozen=True)
class LatencyTail:
    """Fitted constants of the client-side latency model (module docstring)."""

    ttft_base_ms: float
    ttft_per_running_ms: float
    ttft_per_adapter_ms: float
    cold_start_ms: float
    itl_delay_prob: float
    itl_delay_ms: float
    itl_delay_half_running: float
    itl_delay_adapter_exp: float
    itl_delay_active_exp: float = 0.0
    itl_delay_queue_exp: float = 0.0
    stall_per_request: float = 0.0
    stall_ms: float = 0.0
    stall_step_exp: float = 0.0
    itl_delay_running_exp: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"latency tail: {f.name} must be a finite number, got {v!r}")
        if not 0.0 <= self.itl_delay_prob <= 1.0:
            raise ValueError(f"latency tail: itl_delay_prob must be in [0, 1], got "
                             f"{self.itl_delay_prob!r}")
        for name in ("ttft_base_ms", "ttft_per_running_ms", "ttft_per_adapter_ms",
                     "cold_start_ms", "itl_delay_ms", "itl_delay_half_running",
                     "stall_per_request", "stall_ms", "stall_step_exp"):
            if getattr(self, name) < 0:
                raise ValueError(f"latency tail: {name} must be >= 0, got {getattr(self, name)!r}")
        if self.itl_delay_running_exp <= 0:
            raise ValueError(f"latency tail: itl_delay_running_exp must be > 0, got "
                             f"{self.itl_delay_running_exp!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LatencyTail":
        names = {f.name for f in fields(cls)}
        missing = names - set(d) - OPTIONAL_TERMS       # (0: constants fitted without them)
        if missing:
            raise ValueError(f"latency tail: missing constants {sorted(missing)}")
        return cls(**{k: float(d[k]) for k in names if k in d})

    def stall_rate(self, arrival_rate: float, mean_gap_ms: float) -> float:
        """Stalls per second of a server receiving ``arrival_rate`` requests/s whose engine
        gaps average ``mean_gap_ms`` (module docstring, item 4)."""
        if self.stall_per_request <= 0 or arrival_rate <= 0:
            return 0.0
        per_step = max(arrival_rate * mean_gap_ms / 1000.0, 1e-9) / A_REF
        return float(self.stall_per_request * arrival_rate * per_step ** self.stall_step_exp)

    def delay_mean_ms(self, running: float, adapters: float, active: float | None = None,
                      waiting: float | None = None) -> float:
        """Mean delivery delay (ms) of a delayed token at ``running`` streams, ``adapters``
        served, ``active`` distinct adapters per batch (None: all of them) and a longest
        waiting queue of ``waiting`` requests (None: none)."""
        if running <= 0 or adapters <= 0:
            return 0.0
        share = 1.0 if active is None else min(max(active / adapters, 1e-9), 1.0)
        queue = 1.0 + max(float(waiting or 0.0), 0.0) / W_REF
        h = self.itl_delay_running_exp
        busy = 1.0 / (1.0 + (self.itl_delay_half_running / running) ** h)    # R^h/(R^h+R0^h)
        return float(self.itl_delay_ms * busy
                     * (adapters / N_REF) ** self.itl_delay_adapter_exp
                     * share ** self.itl_delay_active_exp
                     * queue ** -self.itl_delay_queue_exp)


# ---------------------------------------------------------------------------------------------
# the constants shipped beside the profiles

_loaded: dict[str, dict] | None = None


def _constants_file_entries(path: Path = CONSTANTS_FILE) -> dict[str, dict]:
    global _loaded
    if path != CONSTANTS_FILE:
        return json.loads(path.read_text()).get("profiles", {})
    if _loaded is None:
        _loaded = json.loads(path.read_text()).get("profiles", {}) if path.exists() else {}
    return _loaded


def latency_tail_for(profile) -> LatencyTail | None:
    """The fitted constants of ``profile`` (a ``GpuProfile`` or its name); None when none were
    fitted for it (its latencies are then the engine's, as before this model)."""
    name = profile if isinstance(profile, str) else getattr(profile, "name", None)
    entry = _constants_file_entries().get(name) if name else None
    return None if entry is None else LatencyTail.from_dict(entry["constants"])


# ---------------------------------------------------------------------------------------------
# the model applied to one run's kernel outputs

def run_features(arrival: np.ndarray, adapter: np.ndarray | None, stats: np.ndarray,
                 duration_s: float) -> tuple[float, float, np.ndarray]:
    """(mean running requests R, adapters with arrivals N, mask of each adapter's first
    arrival) of one run; without ``adapter`` N is 0 and no request is a first one."""
    running = float(stats[K.ST_RUNNING_S]) / duration_s
    first = np.zeros(len(arrival), bool)
    if adapter is None or len(arrival) == 0:
        return running, 0.0, first
    win = np.flatnonzero(arrival < duration_s)
    if len(win) == 0:
        return running, 0.0, first
    order = win[np.lexsort((arrival[win], adapter[win]))]        # by adapter, then arrival
    a = adapter[order]
    head = np.ones(len(order), bool)
    head[1:] = a[1:] != a[:-1]
    first[order[head]] = True
    return running, float(head.sum()), first


def batch_adapters(stats: np.ndarray) -> float:
    """The mean distinct adapters of one run's batches (weighted by step time)."""
    busy = float(stats[K.ST_BUSY_S])
    return float(stats[K.ST_DISTINCT_S]) / busy if busy > 0 else 0.0


def cold_start_waits_ms(cold_start_ms: float, arrival: np.ndarray, wait_s: np.ndarray,
                        starts: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
    """What each request waits (ms) on the cold-start blocks (module docstring, item 2): one
    block of ``cold_start_ms`` per adapter, queued from its first arrival (``starts``, sorted)
    behind the blocks before it, since the loads run one after another; a request arriving at
    ``arrival`` whose first token needs ``wait_s`` of the engine's time gets it once that much
    time outside blocks has passed (so it waits out the block it arrives in and every block
    that begins before its first token is out). ``own``: per request, the index in
    ``starts`` of the block it is the first request of (-1: none); such a request gets its
    first token no earlier than its block's end (:func:`own_blocks`)."""
    if cold_start_ms <= 0 or len(starts) == 0 or len(arrival) == 0:
        return np.zeros(len(arrival))
    return ColdStartSchedule.of(starts, cold_start_ms).waits_ms(arrival, wait_s, own)


def own_blocks(arrival: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted block starts, each request's own block index or -1) for the first requests
    ``first`` (a mask over ``arrival``)."""
    idx = np.flatnonzero(first)
    order = np.argsort(np.asarray(arrival, np.float64)[idx], kind="stable")
    own = np.full(len(arrival), -1, np.int64)
    own[idx[order]] = np.arange(len(idx))
    return np.asarray(arrival, np.float64)[idx[order]], own


@dataclass(frozen=True)
class ColdStartSchedule:
    """The queued cold-start blocks of one run: block k begins at ``max(s_k, end_{k-1})``
    (s: the adapters' sorted first arrivals) and lasts its load. ``level`` is the time outside
    blocks up to each block (``end_k - (total block time up to and including k)``), the clock
    a request's engine wait runs on."""

    begin: np.ndarray            # s
    end: np.ndarray              # s
    level: np.ndarray            # s, non-decreasing

    @classmethod
    def of(cls, starts: np.ndarray, cold_start_ms: float) -> "ColdStartSchedule":
        """The blocks of ``cold_start_ms`` each from the sorted first arrivals ``starts``."""
        s = np.asarray(starts, np.float64)
        length = np.full(len(s), cold_start_ms / 1000.0)
        cum = np.cumsum(length)
        # end_k = max over j <= k of (s_j + length_j + ... + length_k): the queue's recursion
        end = cum + np.maximum.accumulate(s - (cum - length))
        begin = end - length
        # one level per busy period (blocks back to back share it; computed once per period so
        # that rounding cannot split a period)
        new = np.ones(len(s), bool)
        new[1:] = begin[1:] > end[:-1] + GAP_EPS_S
        head = np.flatnonzero(new)
        level = (begin - (cum - length))[head][np.cumsum(new) - 1]
        return cls(begin, end, level)

    def waits_ms(self, arrival: np.ndarray, wait_s: np.ndarray,
                 own: np.ndarray | None = None) -> np.ndarray:
        """Each request's wait (ms) on the blocks: its first token comes at the latest time
        ``T`` whose time outside blocks since ``arrival`` is ``wait_s`` (``T = sup{x : u(x) <=
        u(arrival) + wait}``, u(x) = x minus the block time before x), and not before the end
        of its adapter's own block (``own``: that block's index, -1 for none)."""
        a = np.asarray(arrival, np.float64)
        t = np.maximum(np.asarray(wait_s, np.float64), 0.0)
        k = np.searchsorted(self.begin, a, "right")          # blocks begun at or before a
        prev = np.maximum(k - 1, 0)
        # u(a): after block k-1 the clock runs from its level; inside it, it stands still
        u_a = np.where(k > 0, self.level[prev] + np.maximum(a - self.end[prev], 0.0), a)
        v = u_a + t
        m = np.searchsorted(self.level, v, "right")          # blocks whose level is <= v
        last = np.maximum(m - 1, 0)
        first_token = np.where(m > 0, self.end[last] + (v - self.level[last]), v)
        if own is not None and len(self.end):
            first_token = np.where(own >= 0, np.maximum(first_token, self.end[own]), first_token)
        return 1000.0 * np.maximum(first_token - a - t, 0.0)


def cold_start_waits_py(cold_start_ms: float, arrival: np.ndarray, wait_s: np.ndarray,
                        starts: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
    """Plain-Python reference of :func:`cold_start_waits_ms`: the blocks queued one by one,
    then each request walked through them (``tests/test_latency_tail.py`` checks the two)."""
    out = np.zeros(len(arrival))
    if cold_start_ms <= 0:
        return out
    c = cold_start_ms / 1000.0
    blocks, free = [], -np.inf
    for s in sorted(float(x) for x in starts):
        b = max(s, free)
        free = b + c
        blocks.append((b, free))
    for i, (a, t) in enumerate(zip(arrival, wait_s)):
        x, left = float(a), max(float(t), 0.0)
        for b, e in blocks:
            if e <= x:
                continue
            if b <= x:                   # inside a block: wait for its end
                x = e
            elif b - x > left:           # the first token is out before this block
                break
            else:
                left -= b - x
                x = e
        x += left
        if own is not None and own[i] >= 0:          # not before its own adapter is loaded
            x = max(x, blocks[int(own[i])][1])
        out[i] = 1000.0 * (x - a - max(float(t), 0.0))
    return out


def ttft_offsets_ms(tail: LatencyTail, running: float, adapters: float, first: np.ndarray,
                    arrival: np.ndarray, wait_s: np.ndarray | None = None) -> np.ndarray:
    """Client-side TTFT added to each request (ms): the per-request latency, plus its wait on
    the cold-start blocks that begin at each adapter's first arrival (``first``, the mask over
    ``arrival``), given each request's engine wait for its first token ``wait_s`` (zero when
    not given, so only requests arriving inside a block wait)."""
    base = tail.ttft_base_ms + tail.ttft_per_running_ms * running \
        + tail.ttft_per_adapter_ms * adapters
    wait = np.zeros(len(arrival)) if wait_s is None else wait_s
    starts, own = own_blocks(arrival, first)
    return base + cold_start_waits_ms(tail.cold_start_ms, arrival, wait, starts, own)


def _hist_points(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bin centres (ms, geometric) and weights of the non-empty bins of an ITL histogram."""
    idx = np.flatnonzero(hist)
    g = K.ITL_HIST_LO_MS * 10 ** ((idx + 0.5) / K.ITL_HIST_BINS * K.ITL_HIST_DECADES)
    w = hist[idx].astype(np.float64)
    return g, w / w.sum()


def hist_mean_ms(hist: np.ndarray) -> float:
    """Mean engine gap (ms) of an ITL histogram, from its bin centres (0 when empty)."""
    if hist.sum() == 0:
        return 0.0
    g, w = _hist_points(hist)
    return float(g @ w)


def observed_gap_survival(x: float, g: np.ndarray, w: np.ndarray, p: float,
                          mu: float, stall_rate: float = 0.0, stall_ms: float = 0.0) -> float:
    """P(observed gap > x) for engine gaps ``g`` (weights ``w``), delivery delays that are 0
    with probability 1 - p and exponential of mean ``mu`` otherwise, and stalls arriving at
    ``stall_rate`` per second, each exponential of mean ``stall_ms`` (module docstring)."""
    jit = _jitter_survival(x, g, w, p, mu)
    if stall_rate <= 0 or stall_ms <= 0:
        return float(w @ jit)
    held = np.minimum(1.0, stall_rate * g / 1000.0)        # P(a stall falls in the gap)
    stalled = np.where(x < g, 1.0, np.exp(-np.maximum(x - g, 0.0) / stall_ms))
    return float(w @ ((1.0 - held) * jit + held * stalled))


def _jitter_survival(x: float, g: np.ndarray, w: np.ndarray, p: float, mu: float) -> np.ndarray:
    """Per engine gap, P(g + J_i - J_{i-1} > x) (module docstring, item 3)."""
    base = (g > x).astype(np.float64)
    if p <= 0 or mu <= 0:
        return base
    y = (x - g) / mu                     # how far above each engine gap x lies, in delay means
    plus = np.where(y < 0, 1.0, np.exp(-np.maximum(y, 0.0)))             # P(g + D > x)
    minus = np.where(y < 0, 1.0 - np.exp(np.minimum(y, 0.0)), 0.0)        # P(g - D' > x)
    lap = np.where(y < 0, 1.0 - 0.5 * np.exp(np.minimum(y, 0.0)),
                   0.5 * np.exp(-np.maximum(y, 0.0)))                     # P(g + D - D' > x)
    q = 1.0 - p
    return q * q * base + p * q * (plus + minus) + p * p * lap


def observed_gap_quantile(hist: np.ndarray, q: float, p: float, mu: float,
                          stall_rate: float = 0.0, stall_ms: float = 0.0) -> float:
    """The ``q`` quantile (ms) of the observed inter-token gaps (bisection on the survival
    function in log space; 1e-4 relative). Compiled (:func:`_gap_quantile_nb`); the plain
    NumPy computation is :func:`observed_gap_quantile_py`."""
    if hist.sum() == 0:
        return float("nan")
    g, w = _hist_points(hist)
    return gap_quantile(g, w, q, p, mu, stall_rate, stall_ms)


def gap_quantile(g: np.ndarray, w: np.ndarray, q: float, p: float, mu: float,
                 stall_rate: float = 0.0, stall_ms: float = 0.0) -> float:
    """:func:`observed_gap_quantile` from a histogram's points (``_hist_points``), for callers
    that ask one histogram many times (the fit)."""
    return float(_gap_quantile_nb(g, w, float(q), float(p), float(mu), float(stall_rate),
                                  float(stall_ms)))


def gap_quantiles(points: "GapPoints", q: float, p: float, mus: np.ndarray,
                  stall_rates: np.ndarray, stall_ms: float) -> np.ndarray:
    """:func:`gap_quantile` of many histograms at once (their points packed by
    :class:`GapPoints`; ``mus`` and ``stall_rates`` one per histogram), in parallel over the
    histograms; NaN for an empty one. Each is computed exactly as alone."""
    return _gap_quantiles_nb(points.g, points.w, points.offsets, float(q), float(p),
                             np.asarray(mus, np.float64), np.asarray(stall_rates, np.float64),
                             float(stall_ms))


@dataclass(frozen=True)
class GapPoints:
    """The points (``_hist_points``) of several ITL histograms, packed end to end."""

    g: np.ndarray
    w: np.ndarray
    offsets: np.ndarray          # histogram i's points are [offsets[i], offsets[i + 1])

    @classmethod
    def of(cls, hists: Sequence[np.ndarray]) -> "GapPoints":
        pts = [_hist_points(h) if h.sum() else (np.zeros(0), np.zeros(0)) for h in hists]
        offsets = np.zeros(len(pts) + 1, np.int64)
        offsets[1:] = np.cumsum([len(g) for g, _ in pts])
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))
        return cls(cat([g for g, _ in pts]), cat([w for _, w in pts]), offsets)


def observed_gap_quantile_py(hist: np.ndarray, q: float, p: float, mu: float,
                             stall_rate: float = 0.0, stall_ms: float = 0.0) -> float:
    """Plain NumPy reference of :func:`observed_gap_quantile` (same bisection, same
    arithmetic; ``tests/test_latency_tail.py`` checks the two agree)."""
    if hist.sum() == 0:
        return float("nan")
    g, w = _hist_points(hist)
    target = 1.0 - q
    lo = 1e-3
    hi = max(float(g.max()), 1.0) + 50.0 * (max(mu, 0.0) + max(stall_ms, 0.0)) + 1.0
    if observed_gap_survival(lo, g, w, p, mu, stall_rate, stall_ms) <= target:
        return lo
    for _ in range(60):
        mid = np.sqrt(lo * hi)
        if observed_gap_survival(mid, g, w, p, mu, stall_rate, stall_ms) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-4:
            break
    return float(np.sqrt(lo * hi))


@njit(cache=True)
def _gap_survival_nb(x: float, g: np.ndarray, w: np.ndarray, p: float, mu: float,
                     stall_rate: float, stall_ms: float) -> float:
    """:func:`observed_gap_survival` in one pass over the gaps (no temporaries)."""
    jitter = p > 0 and mu > 0
    stalls = stall_rate > 0 and stall_ms > 0
    qq = 1.0 - p
    total = 0.0
    for i in range(g.shape[0]):
        gi = g[i]
        base = 1.0 if gi > x else 0.0
        v = base
        if jitter:
            y = (x - gi) / mu
            if y < 0:
                e = np.exp(y)
                plus, minus, lap = 1.0, 1.0 - e, 1.0 - 0.5 * e
            else:
                e = np.exp(-y)
                plus, minus, lap = e, 0.0, 0.5 * e
            v = qq * qq * base + p * qq * (plus + minus) + p * p * lap
        if stalls:
            held = min(1.0, stall_rate * gi / 1000.0)
            stalled = 1.0 if x < gi else np.exp(-(x - gi) / stall_ms)
            v = (1.0 - held) * v + held * stalled
        total += w[i] * v
    return total


@njit(cache=True)
def _gap_quantile_nb(g: np.ndarray, w: np.ndarray, q: float, p: float, mu: float,
                     stall_rate: float, stall_ms: float) -> float:
    target = 1.0 - q
    lo = 1e-3
    hi = max(g.max(), 1.0) + 50.0 * (max(mu, 0.0) + max(stall_ms, 0.0)) + 1.0
    if _gap_survival_nb(lo, g, w, p, mu, stall_rate, stall_ms) <= target:
        return lo
    for _ in range(60):
        mid = np.sqrt(lo * hi)
        if _gap_survival_nb(mid, g, w, p, mu, stall_rate, stall_ms) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-4:
            break
    return np.sqrt(lo * hi)


@njit(cache=True, parallel=True)
def _gap_quantiles_nb(g: np.ndarray, w: np.ndarray, offsets: np.ndarray, q: float, p: float,
                      mus: np.ndarray, stall_rates: np.ndarray, stall_ms: float) -> np.ndarray:
    n = offsets.shape[0] - 1
    out = np.empty(n)
    for i in prange(n):
        lo, hi = offsets[i], offsets[i + 1]
        if hi == lo:
            out[i] = np.nan
        else:
            out[i] = _gap_quantile_nb(g[lo:hi], w[lo:hi], q, p, mus[i], stall_rates[i], stall_ms)
    return out


@dataclass(frozen=True)
class ClientView:
    """One run as a benchmark client sees it: each request's client-side TTFT offset (ms, also
    moving its last token) and the mean delivery delay of a delayed token."""

    tail: LatencyTail
    offsets_ms: np.ndarray
    delay_mean_ms: float
    arrival_rate: float = 0.0           # requests arriving per second (the stalls' rate)

    def itl_quantiles_ms(self, hist: np.ndarray, qs=(0.5, 0.99)) -> tuple[float, ...]:
        """Quantiles of the gaps the client sees, from the engine's ITL histogram."""
        stall_rate = self.tail.stall_rate(self.arrival_rate, hist_mean_ms(hist))
        return tuple(observed_gap_quantile(hist, q, self.tail.itl_delay_prob, self.delay_mean_ms,
                                           stall_rate, self.tail.stall_ms) for q in qs)


def client_view(tail: LatencyTail, arrival: np.ndarray, adapter: np.ndarray | None,
                stats: np.ndarray, duration_s: float,
                first_t: np.ndarray | None = None) -> ClientView:
    """The :class:`ClientView` of one run from the kernel's outputs (module docstring);
    ``first_t``: each request's engine first-token time (-1: none), for the cold-start
    blocks a request waits on before its first token (None: only those it arrives in)."""
    running, n_adapters, first = run_features(arrival, adapter, stats, duration_s)
    wait = None
    if first_t is not None:
        wait = np.where(first_t >= 0, first_t - arrival, duration_s - arrival)
    return ClientView(tail, ttft_offsets_ms(tail, running, n_adapters, first, arrival, wait),
                      tail.delay_mean_ms(running, n_adapters, batch_adapters(stats),
                                         float(stats[K.ST_MAX_WAITING])),
                      arrival_rate(arrival, duration_s))


def arrival_rate(arrival: np.ndarray, duration_s: float) -> float:
    """Requests arriving in the window per second."""
    return float(np.count_nonzero(arrival < duration_s)) / duration_s if duration_s > 0 else 0.0


def forget_constants() -> None:
    """Read the constants file again at the next lookup (after a refit wrote it)."""
    global _loaded
    _loaded = None
