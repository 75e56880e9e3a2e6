"""Latency service-level objectives (SLOs) and how one simulated server meets them.

An operator states bounds on what the clients see — time to first token (TTFT), inter-token
latency (ITL) and end-to-end latency (E2E) — usually at a high percentile, and a GPU counts as
feasible only when it meets every bound *and* the 90 % throughput rule. :class:`Slo` holds the
bounds; :func:`evaluate_slo` judges one run from the kernel's per-request times.

Definitions (what a client would measure over the window):

- The requests judged are those that arrive in ``[warmup_s, duration)``: the first
  ``warmup_s`` seconds start from an empty server and would flatter it.
- A request without a first token (or not finished, for E2E) at the window's end has an
  unbounded TTFT (E2E): it counts as missing its bound. So a server that leaves more than
  ``1 - attainment`` of its requests unserved violates every percentile bound, as a client
  waiting for them would see.
- ``ttft_p99_ms`` / ``e2e_p99_ms``: the ``attainment`` quantile (0.99: the p99) of the judged
  requests' TTFT / E2E must be at most the bound, i.e. at least ``attainment`` of them meet it.
- ``itl_p99_ms``: the ``attainment`` quantile of every inter-token gap of the window (the
  kernel's log-spaced gap histogram, read at a bin's upper edge, so never below the true
  value) must be at most the bound.
- ``ttft_mean_ms``: the mean TTFT of the judged requests, an unserved one counted with the time
  it has waited until the window's end (a lower bound on its TTFT: the mean is then a lower
  bound too, and any unserved request already fails the percentile bounds).

Whose latencies: by default (``latency="client"``) a bound is judged on what a benchmark client
sees — the engine's times plus the profile's fitted client-side latency
(``twin.latency_tail``: the API server's per-request TTFT latency, each adapter's cold start on
its first request, token delivery delays on the gaps), the same model whose p99 TTFT / ITL
``experiments.twin_fidelity`` validates against the real runs; a profile without fitted constants
is judged on the engine's times. ``latency="engine"`` judges the scheduler's step times alone.
With the client view TTFT and E2E gain each request's client-side offset, and the ITL quantile
is that of the observed gaps (``latency_tail.ClientView``, at the attainment level).

``score`` is the smallest bound / observed ratio over the stated bounds (>= 1: met; where a
quantile falls on unserved requests, the share of requests within the bound over the share
required), which an Amax search maximises together with the throughput score. ``goodput_rps``: judged requests
that meet every per-request bound (TTFT and E2E) per second of the judged window;
``attainment``: their share of the judged requests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from . import kernel as K

SLO_BOUNDS: tuple[str, ...] = ("ttft_p99_ms", "itl_p99_ms", "ttft_mean_ms", "e2e_p99_ms")
DEFAULT_ATTAINMENT = 0.99
DEFAULT_WARMUP_S = 60.0
LATENCY_VIEWS = ("client", "engine")    # Slo.latency: a benchmark client's view, or the engine's


@dataclass(frozen=True)
class Slo:
    """Latency bounds (ms; ``None``: not bounded), the attainment level the ``*_p99_ms``
    bounds apply at (0.99 = the p99) and the warm-up excluded from judgement (s)."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    ttft_mean_ms: float | None = None
    e2e_p99_ms: float | None = None
    attainment: float = DEFAULT_ATTAINMENT
    warmup_s: float = DEFAULT_WARMUP_S
    latency: str = "client"

    def __post_init__(self) -> None:
        if self.latency not in LATENCY_VIEWS:
            raise ValueError(f"slo.latency: one of {', '.join(LATENCY_VIEWS)} (whose latencies "
                             f"are judged), got {self.latency!r}")
        for name in SLO_BOUNDS:
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"slo.{name}: must be a number of milliseconds, got {v!r}")
            if not (math.isfinite(float(v)) and float(v) > 0):
                raise ValueError(f"slo.{name}: must be a finite number of milliseconds > 0, "
                                 f"got {v!r}")
            object.__setattr__(self, name, float(v))
        a = self.attainment
        if isinstance(a, bool) or not isinstance(a, (int, float, np.integer, np.floating)) \
                or not (0.0 < float(a) < 1.0):
            raise ValueError(f"slo.attainment: must be a fraction in (0, 1) (0.99 = p99), "
                             f"got {a!r}")
        object.__setattr__(self, "attainment", float(a))
        w = self.warmup_s
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)) \
                or not (math.isfinite(float(w)) and float(w) >= 0):
            raise ValueError(f"slo.warmup_s: must be a finite number of seconds >= 0, got {w!r}")
        object.__setattr__(self, "warmup_s", float(w))
        if not self.bounds():
            raise ValueError(f"slo: state at least one bound ({', '.join(SLO_BOUNDS)})")

    def bounds(self) -> dict[str, float]:
        """The stated bounds, name -> ms."""
        return {n: getattr(self, n) for n in SLO_BOUNDS if getattr(self, n) is not None}

    def describe(self) -> str:
        """``ttft_p99<=500ms itl_p99<=100ms (99 % of requests, after a 60 s warm-up)``."""
        q = f"{100 * self.attainment:g}"
        parts = [f"{n[:-3].replace('_p99', f'_p{q}')}<={v:g}ms" for n, v in self.bounds().items()]
        view = "" if self.latency == "client" else ", engine latencies"
        return f"{' '.join(parts)} (after a {self.warmup_s:g} s warm-up{view})"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "slo") -> "Slo":
        """An SLO from its JSON object; unknown keys and bad values name the field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: must be an object with any of {', '.join(SLO_BOUNDS)}, "
                             f"attainment, warmup_s, latency; got {d!r}")
        known = set(SLO_BOUNDS) | {"attainment", "warmup_s", "latency"}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"{where}: unknown field(s) {bad} (known: {', '.join(sorted(known))})")
        try:
            return cls(**dict(d))
        except ValueError as e:
            msg = str(e)
            raise ValueError(msg.replace("slo.", f"{where}.", 1) if where != "slo" else msg) \
                from None

    @classmethod
    def parse(cls, text: str, where: str = "--slo") -> "Slo":
        """``ttft_p99_ms=500,itl_p99_ms=100[,attainment=0.99][,warmup_s=60][,latency=engine]``
        (a CLI value)."""
        d: dict[str, Any] = {}
        for part in (p.strip() for p in str(text).split(",")):
            if not part:
                continue
            name, eq, value = part.partition("=")
            if not eq:
                raise ValueError(f"{where}: '{part}' is not NAME=VALUE (e.g. ttft_p99_ms=500)")
            if name.strip() == "latency":
                d["latency"] = value.strip()
                continue
            try:
                d[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"{where}: {name.strip()}: '{value}' is not a number") from None
        return cls.from_dict(d, where)


@dataclass(frozen=True)
class SloResult:
    """How one run meets an :class:`Slo`: the observed value of each bound (ms; inf when the
    quantile falls on unserved requests), whether each is met, the share of judged requests
    within each per-request bound, and the goodput."""

    observed: dict[str, float] = field(default_factory=dict)
    met: dict[str, bool] = field(default_factory=dict)
    within: dict[str, float] = field(default_factory=dict)
    judged_requests: int = 0
    goodput_rps: float = float("nan")
    score: float = float("inf")
    attainment: float = float("nan")    # share of judged requests within every per-request bound
    # per adapter (the run's adapter order): judged requests and the share within every
    # per-request bound (NaN: none judged); empty when the run's adapters were not given
    adapter_judged: tuple[int, ...] = ()
    adapter_attainment: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        return all(self.met.values())

    def violations(self) -> list[str]:
        return [n for n, ok in self.met.items() if not ok]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "observed": dict(self.observed), "met": dict(self.met),
                "within": dict(self.within), "judged_requests": self.judged_requests,
                "goodput_rps": self.goodput_rps, "score": self.score,
                "attainment": self.attainment, "adapter_judged": list(self.adapter_judged),
                "adapter_attainment": list(self.adapter_attainment)}


def _quantile_with_unserved(values_ms: np.ndarray, n_unserved: int, q: float) -> float:
    """The q quantile (nearest rank, upper) of ``values_ms`` plus ``n_unserved`` infinite ones."""
    n = len(values_ms) + n_unserved
    if n == 0:
        return float("nan")
    k = int(math.ceil(q * n)) - 1          # 0-based rank of the q quantile
    if k >= len(values_ms):
        return float("inf")
    return float(np.partition(values_ms, k)[k])


def hist_quantile_upper(hist: np.ndarray, q: float) -> float:
    """The q quantile of the kernel's log-spaced gap histogram at its bin's upper edge."""
    return K.itl_hist_quantile(hist, q, upper=True)


def evaluate_slo(slo: Slo, arrival: np.ndarray, first_t: np.ndarray, finish_t: np.ndarray,
                 itl_hist: np.ndarray, duration_s: float, adapter: np.ndarray | None = None,
                 n_adapters: int | None = None, client=None) -> SloResult:
    """Judge one run (the kernel's per-request first-token and finish times, -1 when none);
    with ``adapter`` (each request's adapter index, < ``n_adapters``) also per adapter. With
    ``client`` (the run's ``twin.latency_tail.ClientView``) and ``slo.latency == "client"``,
    the client's latencies (module docstring)."""
    offset = np.zeros(len(arrival))
    itl_q = None
    if client is not None and slo.latency == "client":
        offset = client.offsets_ms / 1000.0
        if slo.itl_p99_ms is not None:
            itl_q = client.itl_quantiles_ms(itl_hist, (slo.attainment,))[0]
    judged = (arrival >= slo.warmup_s) & (arrival < duration_s)
    n = int(judged.sum())
    a = arrival[judged]
    # a client sees the first and the last token later by the request's offset
    f = np.where(first_t[judged] >= 0, first_t[judged] + offset[judged], first_t[judged])
    e = np.where(finish_t[judged] >= 0, finish_t[judged] + offset[judged], finish_t[judged])
    has_first = (f >= 0) & (f <= duration_s)
    done = (e >= 0) & (e <= duration_s)
    ttft = (f[has_first] - a[has_first]) * 1000.0
    e2e = (e[done] - a[done]) * 1000.0
    observed: dict[str, float] = {}
    within: dict[str, float] = {}
    ok_req = np.ones(n, bool)
    per_request = {"ttft_p99_ms": (ttft, has_first), "e2e_p99_ms": (e2e, done)}
    bounds = slo.bounds()
    for name, bound in bounds.items():
        if name in per_request:         # a quantile over the judged requests, unserved = inf
            lat, served = per_request[name]
            observed[name] = _quantile_with_unserved(lat, n - len(lat), slo.attainment)
            good = np.zeros(n, bool)
            good[np.flatnonzero(served)] = lat <= bound
            within[name] = float(good.mean()) if n else float("nan")
            ok_req &= good
        elif name == "ttft_mean_ms":
            waited = np.where(has_first, (f - a) * 1000.0, (duration_s - a) * 1000.0)
            observed[name] = float(waited.mean()) if n else float("nan")
        elif name == "itl_p99_ms":
            observed[name] = (hist_quantile_upper(itl_hist, slo.attainment) if itl_q is None
                              else float(itl_q))
    # a bound with nothing to judge (no request, no gap) is met: there is no client to disappoint
    met = {k: math.isnan(v) or v <= bounds[k] for k, v in observed.items()}
    # bound / observed; where the quantile falls on unserved requests (inf), the share within
    # the bound over the share required (< 1 too, and still ordered for a search)
    ratios = [(bounds[k] / v if v > 0 else float("inf")) if math.isfinite(v)
              else within.get(k, 0.0) / slo.attainment
              for k, v in observed.items() if not math.isnan(v)]
    span = duration_s - slo.warmup_s
    per_n: tuple[int, ...] = ()
    per_ok: tuple[float, ...] = ()
    if adapter is not None:
        k = int(n_adapters if n_adapters is not None else (adapter.max() + 1 if len(adapter) else 0))
        idx = np.asarray(adapter)[judged].astype(np.int64)
        cnt = np.bincount(idx, minlength=k)
        good_cnt = np.bincount(idx, weights=ok_req.astype(float), minlength=k)
        per_n = tuple(int(c) for c in cnt)
        per_ok = tuple(float(g / c) if c else float("nan") for g, c in zip(good_cnt, cnt))
    return SloResult(observed, met, within, n,
                     float(ok_req.sum()) / span if span > 0 else float("nan"),
                     float(min(ratios)) if ratios else float("inf"),
                     float(ok_req.mean()) if n else float("nan"), per_n, per_ok)


__all__ = ["SLO_BOUNDS", "Slo", "SloResult", "evaluate_slo", "hist_quantile_upper"]
