"""Non-stationary workloads: time-varying rates, bursty arrivals, adapter arrival/retirement.

Rate shapes are multiplier functions of time ``m(t) >= 0`` (a request stream of base rate
``rate`` then has intensity ``rate * m(t)``):

* ``Diurnal(amplitude, period_s, phase_s)`` —
  ``1 + amplitude * sin(2 pi (t - phase_s) / period_s)``;
* ``StepDrift(at_s, multipliers)`` — piecewise constant: ``multipliers[k]`` from ``at_s[k-1]``
  (or 0) to ``at_s[k]``;
* ``FlashCrowd(start_s, peak, rise_s, hold_s, decay_s)`` — 1, a linear rise to ``peak``, a hold,
  a linear decay back to 1;
* ``ActiveWindow(t_on_s, t_off_s)`` — 1 in ``[t_on_s, t_off_s)``, else 0 (an adapter that
  arrives at ``t_on_s`` and retires at ``t_off_s``);
* ``ProductShape(shapes)`` — the product (a global shape x an adapter's own x its window).

Arrival processes (the ``ArrivalProcess`` protocol of :mod:`twin.workload`:
``sample_times(rate, duration, rng)``, ``describe()``):

* ``MarkovModulatedArrivals`` — a two-state Markov-modulated Poisson process (calm/burst with
  exponential sojourns), multipliers normalised so the long-run rate is ``rate``; simulated
  exactly (sojourns, then Poisson counts per sojourn), started from the stationary state
  distribution, so ``E[N(0, T)] = rate * T``;
* ``ShapedArrivals(base, shape)`` — any base process thinned by ``m(t) / max m``: the base is
  drawn at ``rate * max m`` and each arrival kept with probability ``m(t) / max m``, which gives
  the intensity ``rate * m(t)`` exactly (for a Poisson base, an exact inhomogeneous Poisson
  process).

A workload file (JSON, :func:`load_workload`) names all of this per adapter; see
:func:`workload_from_dict` for the schema. :class:`Workload` draws seeded requests and gives the
mean rate of every adapter over any window (what a re-planner needs per window).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .lengths import LengthModel
from .length_models import length_model_from_dict
from .workload import (Adapter, PoissonArrivals, Requests, _generator, load_adapters_csv,
                       load_trace_csv, merge_streams, stationary_process_from_dict)

__all__ = [
    "RateShape", "Diurnal", "StepDrift", "FlashCrowd", "ActiveWindow", "ProductShape",
    "shape_from_dict", "MarkovModulatedArrivals", "ShapedArrivals", "nonstationary_from_dict",
    "arrival_process_from_dict",
    "AdapterStream", "Workload", "workload_from_dict", "load_workload",
]


class WorkloadError(ValueError):
    """A workload file or dict is invalid; the message names the field."""


def _num(where: str, value: Any, *, minimum: float | None = None, strict: bool = False,
         maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise WorkloadError(f"{where}: expected a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise WorkloadError(f"{where}: must be finite, got {value!r}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        raise WorkloadError(f"{where}: must be {'>' if strict else '>='} {minimum:g}, got {v:g}")
    if maximum is not None and v > maximum:
        raise WorkloadError(f"{where}: must be <= {maximum:g}, got {v:g}")
    return v


# =========================================================================== rate shapes


class RateShape(Protocol):
    """A multiplier of time; ``bound`` is an upper bound of ``m`` on ``[0, duration)``."""

    def multiplier(self, t: np.ndarray) -> np.ndarray: ...
    def bound(self, duration: float) -> float: ...
    def integral(self, t0: float, t1: float) -> float: ...
    def describe(self) -> dict: ...


def _piecewise_linear_integral(xs: np.ndarray, ys: np.ndarray, t0: float, t1: float) -> float:
    """Exact integral over [t0, t1] of the piecewise-linear function through (xs, ys), constant
    beyond its ends."""
    if t1 <= t0:
        return 0.0
    inner = xs[(xs > t0) & (xs < t1)]
    pts = np.concatenate(([t0], inner, [t1]))
    vals = np.interp(pts, xs, ys)
    return float(np.sum((vals[1:] + vals[:-1]) * np.diff(pts)) / 2.0)


@dataclass(frozen=True)
class Diurnal:
    """``1 + amplitude * sin(2 pi (t - phase_s) / period_s)``, amplitude in [0, 1]."""

    amplitude: float
    period_s: float
    phase_s: float = 0.0
    kind = "diurnal"

    def __post_init__(self) -> None:
        _num("diurnal.amplitude", self.amplitude, minimum=0, maximum=1)
        _num("diurnal.period_s", self.period_s, minimum=0, strict=True)
        _num("diurnal.phase_s", self.phase_s)

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        w = 2 * math.pi / self.period_s
        return 1.0 + self.amplitude * np.sin(w * (np.asarray(t, np.float64) - self.phase_s))

    def bound(self, duration: float) -> float:
        return 1.0 + self.amplitude

    def integral(self, t0: float, t1: float) -> float:
        w = 2 * math.pi / self.period_s
        return (t1 - t0) - self.amplitude / w * (math.cos(w * (t1 - self.phase_s))
                                                 - math.cos(w * (t0 - self.phase_s)))

    def describe(self) -> dict:
        return {"kind": self.kind, "amplitude": self.amplitude, "period_s": self.period_s,
                "phase_s": self.phase_s}


@dataclass(frozen=True)
class StepDrift:
    """Piecewise-constant multiplier: ``multipliers[0]`` before ``at_s[0]``, ``multipliers[k]``
    in ``[at_s[k-1], at_s[k])``, the last one after the last step."""

    at_s: tuple[float, ...]
    multipliers: tuple[float, ...]
    kind = "step"

    def __post_init__(self) -> None:
        if not (isinstance(self.at_s, (list, tuple))
                and isinstance(self.multipliers, (list, tuple))):
            raise WorkloadError("step: at_s and multipliers must be lists of numbers")
        at = tuple(_num(f"step.at_s[{i}]", v, minimum=0) for i, v in enumerate(self.at_s))
        m = tuple(_num(f"step.multipliers[{i}]", v, minimum=0)
                  for i, v in enumerate(self.multipliers))
        if len(m) != len(at) + 1:
            raise WorkloadError(f"step.multipliers: needs len(at_s) + 1 = {len(at) + 1} values, "
                                f"got {len(m)}")
        if any(b <= a for a, b in zip(at, at[1:])):
            raise WorkloadError(f"step.at_s: must be strictly increasing, got {list(at)}")
        object.__setattr__(self, "at_s", at)
        object.__setattr__(self, "multipliers", m)

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(np.asarray(self.at_s), np.asarray(t, np.float64), side="right")
        return np.asarray(self.multipliers)[k]

    def bound(self, duration: float) -> float:
        k = int(np.searchsorted(np.asarray(self.at_s), duration, side="left"))
        return max(self.multipliers[: k + 1])

    def integral(self, t0: float, t1: float) -> float:
        edges = np.concatenate(([-np.inf], self.at_s, [np.inf]))
        lo = np.clip(edges[:-1], t0, t1)
        hi = np.clip(edges[1:], t0, t1)
        return float(np.sum(np.asarray(self.multipliers) * (hi - lo)))

    def describe(self) -> dict:
        return {"kind": self.kind, "at_s": list(self.at_s), "multipliers": list(self.multipliers)}


@dataclass(frozen=True)
class FlashCrowd:
    """1, then from ``start_s`` a linear rise over ``rise_s`` to ``peak``, ``hold_s`` at the
    peak, a linear decay over ``decay_s`` back to 1."""

    start_s: float
    peak: float
    rise_s: float = 0.0
    hold_s: float = 60.0
    decay_s: float = 0.0
    kind = "flash_crowd"

    def __post_init__(self) -> None:
        _num("flash_crowd.start_s", self.start_s, minimum=0)
        _num("flash_crowd.peak", self.peak, minimum=0)
        for f in ("rise_s", "hold_s", "decay_s"):
            _num(f"flash_crowd.{f}", getattr(self, f), minimum=0)

    def _knots(self) -> tuple[np.ndarray, np.ndarray]:
        e = 1e-9   # a zero-length ramp is a jump
        s, r, h, d = self.start_s, max(self.rise_s, e), self.hold_s, max(self.decay_s, e)
        return (np.array([s, s + r, s + r + h, s + r + h + d]),
                np.array([1.0, self.peak, self.peak, 1.0]))

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        xs, ys = self._knots()
        return np.interp(np.asarray(t, np.float64), xs, ys)

    def bound(self, duration: float) -> float:
        return max(1.0, self.peak) if duration > self.start_s else 1.0

    def integral(self, t0: float, t1: float) -> float:
        xs, ys = self._knots()
        return _piecewise_linear_integral(xs, ys, t0, t1)

    def describe(self) -> dict:
        return {"kind": self.kind, "start_s": self.start_s, "peak": self.peak,
                "rise_s": self.rise_s, "hold_s": self.hold_s, "decay_s": self.decay_s}


@dataclass(frozen=True)
class ActiveWindow:
    """1 in ``[t_on_s, t_off_s)`` (the adapter exists), 0 outside; ``t_off_s`` may be inf."""

    t_on_s: float = 0.0
    t_off_s: float = math.inf
    kind = "window"

    def __post_init__(self) -> None:
        on = _num("window.t_on_s", self.t_on_s, minimum=0)
        off = self.t_off_s
        if off is None:
            off = math.inf
        elif not (isinstance(off, (int, float)) and not isinstance(off, bool)
                  and (math.isinf(off) or math.isfinite(off))):
            raise WorkloadError(f"window.t_off_s: expected a number or null, got {off!r}")
        if not off > on:
            raise WorkloadError(f"window.t_off_s: must be > t_on_s ({on:g}), got {off!r}")
        object.__setattr__(self, "t_off_s", float(off))

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, np.float64)
        return ((t >= self.t_on_s) & (t < self.t_off_s)).astype(np.float64)

    def bound(self, duration: float) -> float:
        return 1.0 if duration > self.t_on_s else 0.0

    def integral(self, t0: float, t1: float) -> float:
        return max(0.0, min(t1, self.t_off_s) - max(t0, self.t_on_s))

    def describe(self) -> dict:
        return {"kind": self.kind, "t_on_s": self.t_on_s,
                "t_off_s": None if math.isinf(self.t_off_s) else self.t_off_s}


@dataclass(frozen=True)
class ProductShape:
    """The product of several shapes (its bound is the product of their bounds)."""

    shapes: tuple[Any, ...]
    kind = "product"

    def multiplier(self, t: np.ndarray) -> np.ndarray:
        out = np.ones_like(np.asarray(t, np.float64))
        for s in self.shapes:
            out = out * s.multiplier(t)
        return out

    def bound(self, duration: float) -> float:
        return float(np.prod([s.bound(duration) for s in self.shapes]))

    def integral(self, t0: float, t1: float) -> float:
        """Numerical (composite Simpson on 20,001 points, refined at every shape's kinks)."""
        if t1 <= t0:
            return 0.0
        if len(self.shapes) == 1:
            return self.shapes[0].integral(t0, t1)
        kinks: list[float] = [t0, t1]
        for s in self.shapes:
            for k in _kinks(s):
                if t0 < k < t1:
                    kinks.append(k)
        kinks = sorted(set(kinks))
        total = 0.0
        n = max(2, 20_000 // (len(kinks) - 1)) // 2 * 2
        for a, b in zip(kinks, kinks[1:]):
            x = np.linspace(a, b, n + 1)
            # ends nudged inside: a jump at a kink belongs to the neighbouring segment
            x[0], x[-1] = a + 1e-9 * (b - a), b - 1e-9 * (b - a)
            y = self.multiplier(x)
            total += (b - a) / (3 * n) * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())
        return float(total)

    def describe(self) -> dict:
        return {"kind": self.kind, "of": [s.describe() for s in self.shapes]}


def _kinks(s: Any) -> list[float]:
    if isinstance(s, StepDrift):
        return list(s.at_s)
    if isinstance(s, FlashCrowd):
        return list(s._knots()[0])
    if isinstance(s, ActiveWindow):
        return [s.t_on_s] + ([] if math.isinf(s.t_off_s) else [s.t_off_s])
    if isinstance(s, ProductShape):
        return [k for x in s.shapes for k in _kinks(x)]
    return []


_SHAPE_FIELDS: dict[str, tuple[type, set[str], set[str]]] = {
    "diurnal": (Diurnal, {"amplitude", "period_s"}, {"phase_s"}),
    "step": (StepDrift, {"at_s", "multipliers"}, set()),
    "flash_crowd": (FlashCrowd, {"start_s", "peak"}, {"rise_s", "hold_s", "decay_s"}),
    "window": (ActiveWindow, set(), {"t_on_s", "t_off_s"}),
}


def shape_from_dict(d: Any, where: str = "rate_shape") -> Any:
    """A rate shape from ``{"kind": "diurnal" | "step" | "flash_crowd" | "window" | "product",
    ...}`` (``product``: ``{"of": [shape, ...]}``); errors name ``where`` and the field."""
    if not isinstance(d, dict) or "kind" not in d:
        raise WorkloadError(f"{where}: expected an object with a 'kind' field, got {d!r}")
    kind = d["kind"]
    params = {k: v for k, v in d.items() if k != "kind"}
    if kind == "product":
        if set(params) != {"of"} or not isinstance(params["of"], list) or not params["of"]:
            raise WorkloadError(f"{where}: 'product' needs exactly one field 'of', a non-empty "
                                "list of shapes")
        return ProductShape(tuple(shape_from_dict(s, f"{where}.of[{i}]")
                                  for i, s in enumerate(params["of"])))
    if kind not in _SHAPE_FIELDS:
        raise WorkloadError(f"{where}.kind: unknown shape {kind!r} (expected one of "
                            f"{sorted([*_SHAPE_FIELDS, 'product'])})")
    cls, req, opt = _SHAPE_FIELDS[kind]
    missing = sorted(req - set(params))
    if missing:
        raise WorkloadError(f"{where}: shape '{kind}' is missing field(s) {missing}")
    unknown = sorted(set(params) - req - opt)
    if unknown:
        raise WorkloadError(f"{where}: shape '{kind}' has unknown field(s) {unknown}")
    try:
        return cls(**params)
    except WorkloadError as e:
        raise WorkloadError(f"{where}.{str(e).split('.', 1)[1]}") from None


# =========================================================================== arrival processes


@dataclass(frozen=True)
class MarkovModulatedArrivals:
    """Two-state Markov-modulated Poisson process (calm / burst).

    In the calm state the rate is ``rate * calm / mean``, in the burst state ``rate * burst /
    mean``, with ``mean`` the stationary mean of the multipliers, so the long-run rate is
    ``rate``. Sojourns are exponential with means ``calm_s`` and ``burst_s``.
    """

    calm: float
    burst: float
    calm_s: float
    burst_s: float
    kind = "markov_modulated"

    def __post_init__(self) -> None:
        _num("markov_modulated.calm", self.calm, minimum=0)
        _num("markov_modulated.burst", self.burst, minimum=0)
        _num("markov_modulated.calm_s", self.calm_s, minimum=0, strict=True)
        _num("markov_modulated.burst_s", self.burst_s, minimum=0, strict=True)
        if self.calm + self.burst <= 0:
            raise WorkloadError("markov_modulated: calm and burst must not both be 0")

    @property
    def burst_probability(self) -> float:
        """Stationary probability of the burst state."""
        return self.burst_s / (self.calm_s + self.burst_s)

    def state_rates(self, rate: float) -> tuple[float, float]:
        p = self.burst_probability
        mean = (1 - p) * self.calm + p * self.burst
        return rate * self.calm / mean, rate * self.burst / mean

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int
                     ) -> np.ndarray:
        rate = _num("MarkovModulatedArrivals rate", rate, minimum=0, strict=True)
        duration = _num("MarkovModulatedArrivals duration", duration, minimum=0)
        g = _generator(rng)
        rates = self.state_rates(rate)
        means = (self.calm_s, self.burst_s)
        state = int(g.random() < self.burst_probability)
        t, chunks = 0.0, []
        while t < duration:
            end = min(duration, t + g.exponential(means[state]))
            n = int(g.poisson(rates[state] * (end - t)))
            if n:
                chunks.append(t + g.random(n) * (end - t))
            t, state = end, 1 - state
        if not chunks:
            return np.empty(0, np.float64)
        return np.sort(np.concatenate(chunks))

    def describe(self) -> dict:
        return {"kind": self.kind, "calm": self.calm, "burst": self.burst, "calm_s": self.calm_s,
                "burst_s": self.burst_s}


@dataclass(frozen=True)
class ShapedArrivals:
    """``base`` thinned by ``shape``: intensity ``rate * shape.multiplier(t)`` (see module doc)."""

    base: Any
    shape: Any
    kind = "shaped"

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int
                     ) -> np.ndarray:
        rate = _num("ShapedArrivals rate", rate, minimum=0, strict=True)
        duration = _num("ShapedArrivals duration", duration, minimum=0)
        g = _generator(rng)
        top = float(self.shape.bound(duration))
        if top <= 0 or duration == 0:
            return np.empty(0, np.float64)
        t = self.base.sample_times(rate * top, duration, g)
        keep = g.random(len(t)) * top < self.shape.multiplier(t)
        return t[keep]

    def expected_count(self, rate: float, t0: float, t1: float) -> float:
        return rate * self.shape.integral(t0, t1)

    def describe(self) -> dict:
        return {"kind": self.kind, "base": self.base.describe(), "shape": self.shape.describe()}


def nonstationary_from_dict(d: Any, where: str = "arrivals") -> Any:
    """``{"kind": "markov_modulated", ...}`` or
    ``{"kind": "shaped", "base": {...}, "shape": {...}}``; any other kind goes to
    :func:`twin.workload.stationary_process_from_dict`."""
    if not isinstance(d, dict) or "kind" not in d:
        raise WorkloadError(f"{where}: expected an object with a 'kind' field, got {d!r}")
    kind, params = d["kind"], {k: v for k, v in d.items() if k != "kind"}
    if kind == "markov_modulated":
        req = {"calm", "burst", "calm_s", "burst_s"}
        if set(params) != req:
            raise WorkloadError(f"{where}: 'markov_modulated' needs exactly the fields "
                                f"{sorted(req)}, got {sorted(params)}")
        try:
            return MarkovModulatedArrivals(**params)
        except WorkloadError as e:
            raise WorkloadError(f"{where}.{str(e).split('.', 1)[1]}") from None
    if kind == "shaped":
        if set(params) != {"base", "shape"}:
            raise WorkloadError(f"{where}: 'shaped' needs exactly the fields ['base', 'shape'], "
                                f"got {sorted(params)}")
        return ShapedArrivals(nonstationary_from_dict(params["base"], f"{where}.base"),
                              shape_from_dict(params["shape"], f"{where}.shape"))
    try:
        return stationary_process_from_dict(d)
    except ValueError as e:
        raise WorkloadError(f"{where}: {e}") from None


def arrival_process_from_dict(d: Any) -> Any:
    """Inverse of ``describe()`` for every arrival process, stationary (``twin.workload``) or
    not (``markov_modulated``, ``shaped``)."""
    return nonstationary_from_dict(d, "arrival process")


# =========================================================================== workloads


@dataclass(frozen=True)
class AdapterStream:
    """One adapter of a workload: the adapter (``rate`` = base rate), its arrival process and
    its rate shape (global x own x active window)."""

    adapter: Adapter
    process: Any
    shape: Any

    def expected_count(self, t0: float, t1: float) -> float:
        return self.adapter.rate * self.shape.integral(t0, t1)


@dataclass(frozen=True)
class Workload:
    """A non-stationary workload over ``[0, duration_s)``: per-adapter streams, or a trace."""

    duration_s: float
    streams: tuple[AdapterStream, ...]
    lengths: Any = None
    trace: tuple[tuple[Adapter, ...], Requests] | None = field(default=None, compare=False)

    @property
    def adapters(self) -> list[Adapter]:
        if self.trace is not None:
            return list(self.trace[0])
        return [s.adapter for s in self.streams]

    def generate(self, seed: int) -> Requests:
        """Seeded requests (adapter index = position in :attr:`adapters`); adapter ``i`` uses
        child ``i`` of ``SeedSequence(seed)`` as :func:`twin.workload.generate_requests` does.
        A trace workload returns its trace."""
        if self.trace is not None:
            return self.trace[1]
        if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                or not 0 <= seed < 2**32):
            raise WorkloadError(f"seed: must be an integer in [0, 2^32), got {seed!r}")
        lengths = self.lengths
        if lengths is None:
            from .sharegpt import default_lengths
            lengths = default_lengths()
        children = np.random.SeedSequence(int(seed)).spawn(len(self.streams))
        return merge_streams([(ShapedArrivals(s.process, s.shape), s.adapter.rate)
                              for s in self.streams], self.duration_s, lengths, children)

    def mean_rates(self, t0: float, t1: float) -> list[Adapter]:
        """Adapters with their mean rate over ``[t0, t1)`` (req/s); adapters with no expected
        request in the window (retired or not yet arrived) are left out. For a trace, the
        observed counts. The instance a re-planner solves for that window."""
        t0 = _num("mean_rates t0", t0, minimum=0)
        t1 = _num("mean_rates t1", t1, minimum=0)
        if t1 <= t0:
            raise WorkloadError(f"mean_rates: t1 ({t1:g}) must be > t0 ({t0:g})")
        span = t1 - t0
        if self.trace is not None:
            ads, req = self.trace
            inside = (req.arrival_s >= t0) & (req.arrival_s < t1)
            counts = np.bincount(req.adapter[inside], minlength=len(ads))
            return [Adapter(a.id, a.rank, c / span) for a, c in zip(ads, counts) if c > 0]
        out = []
        for s in self.streams:
            r = s.expected_count(t0, t1) / span
            if r > 0:
                out.append(Adapter(s.adapter.id, s.adapter.rank, r))
        return out


def workload_from_dict(d: Any, base_dir: str | os.PathLike = ".", where: str = "workload"
                       ) -> Workload:
    """Build a :class:`Workload` from its JSON form. Schema (fields not listed are refused)::

        {
          "duration_s": 1200,                     # required, > 0
          "lengths": {"kind": "sharegpt"},        # optional length model (twin.lengths)
          "arrivals": {"kind": "poisson"},        # optional base process of every adapter:
                                                  #   poisson | gamma | lognormal |
                                                  #   rate_switching | markov_modulated
          "rate_shape": {"kind": "diurnal", ...}, # optional global multiplier of time
          "adapters": [                           # either a list ...
            {"id": "a0", "rank": 16, "rate": 0.5, # rate = base rate (req/s), times the shapes
             "rate_shape": {...},                 #   optional, this adapter's own shape
             "arrivals": {...},                   #   optional, overrides the base process
             "active_s": [0, 600]}                #   optional [t_on, t_off) (null: never retires)
          ],
          "adapters_csv": "adapters.csv",         # ... or a CSV id,rank,rate (relative to the file)
          "trace": "trace.csv"                    # ... or a trace (`twin run --trace`: arrival_s,
        }                                         #   adapter_id, input_tokens, output_tokens, rank)

    Shapes: ``diurnal`` {amplitude, period_s, phase_s}, ``step`` {at_s, multipliers},
    ``flash_crowd`` {start_s, peak, rise_s, hold_s, decay_s}, ``window`` {t_on_s, t_off_s},
    ``product`` {of: [...]}. ``markov_modulated``: {calm, burst, calm_s, burst_s}.
    """
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(d).__name__}")
    allowed = {"duration_s", "lengths", "arrivals", "rate_shape", "adapters", "adapters_csv",
               "trace"}
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {unknown} (allowed: {sorted(allowed)})")
    if "duration_s" not in d:
        raise WorkloadError(f"{where}: missing field 'duration_s'")
    duration = _num(f"{where}.duration_s", d["duration_s"], minimum=0, strict=True)
    sources = [k for k in ("adapters", "adapters_csv", "trace") if k in d]
    if len(sources) != 1:
        raise WorkloadError(f"{where}: give exactly one of 'adapters', 'adapters_csv', 'trace' "
                            f"(got {sources or 'none'})")
    lengths: LengthModel | None = None
    if "lengths" in d:
        try:
            lengths = length_model_from_dict(d["lengths"])
        except ValueError as e:
            raise WorkloadError(f"{where}.lengths: {e}") from None
    base_dir = Path(base_dir)
    if "trace" in d:
        extra = sorted(set(d) & {"arrivals", "rate_shape", "lengths"})
        if extra:
            raise WorkloadError(f"{where}: a trace workload replays the trace; drop {extra}")
        if not isinstance(d["trace"], str):
            raise WorkloadError(f"{where}.trace: expected a CSV path, got {d['trace']!r}")
        try:
            ads, req = load_trace_csv(base_dir / d["trace"], duration_s=duration)
        except ValueError as e:
            raise WorkloadError(f"{where}.trace: {e}") from None
        keep = req.arrival_s < duration
        req = Requests(req.arrival_s[keep], req.adapter[keep], req.input_len[keep],
                       req.output_len[keep])
        return Workload(duration, (), None, (tuple(ads), req))
    base = (nonstationary_from_dict(d["arrivals"], f"{where}.arrivals") if "arrivals" in d
            else PoissonArrivals())
    shape_global = (shape_from_dict(d["rate_shape"], f"{where}.rate_shape")
                    if "rate_shape" in d else None)
    if "adapters_csv" in d:
        if not isinstance(d["adapters_csv"], str):
            raise WorkloadError(f"{where}.adapters_csv: expected a CSV path, "
                                f"got {d['adapters_csv']!r}")
        try:
            items = [{"id": a.id, "rank": a.rank, "rate": a.rate}
                     for a in load_adapters_csv(base_dir / d["adapters_csv"])]
        except ValueError as e:
            raise WorkloadError(f"{where}.adapters_csv: {e}") from None
    else:
        items = d["adapters"]
        if not isinstance(items, list) or not items:
            raise WorkloadError(f"{where}.adapters: expected a non-empty list of adapters")
    streams, seen = [], set()
    for i, it in enumerate(items):
        w = f"{where}.adapters[{i}]"
        if not isinstance(it, dict):
            raise WorkloadError(f"{w}: expected an object, got {it!r}")
        bad = sorted(set(it) - {"id", "rank", "rate", "rate_shape", "arrivals", "active_s"})
        if bad:
            raise WorkloadError(f"{w}: unknown field(s) {bad}")
        for f in ("id", "rank", "rate"):
            if f not in it:
                raise WorkloadError(f"{w}: missing field '{f}'")
        try:
            a = Adapter(it["id"], it["rank"], it["rate"])
        except ValueError as e:
            raise WorkloadError(f"{w}: {e}") from None
        if a.id in seen:
            raise WorkloadError(f"{w}.id: duplicate adapter id '{a.id}'")
        seen.add(a.id)
        shapes = [] if shape_global is None else [shape_global]
        if "rate_shape" in it:
            shapes.append(shape_from_dict(it["rate_shape"], f"{w}.rate_shape"))
        if "active_s" in it:
            win = it["active_s"]
            if not isinstance(win, list) or len(win) != 2:
                raise WorkloadError(f"{w}.active_s: expected [t_on, t_off], got {win!r}")
            try:
                shapes.append(ActiveWindow(win[0], win[1]))
            except WorkloadError as e:
                raise WorkloadError(f"{w}.active_s: {str(e).split(': ', 1)[1]}") from None
        proc = (nonstationary_from_dict(it["arrivals"], f"{w}.arrivals") if "arrivals" in it
                else base)
        shape = ProductShape(tuple(shapes)) if shapes else StepDrift((), (1.0,))
        streams.append(AdapterStream(a, proc, shape))
    return Workload(duration, tuple(streams), lengths)


def load_workload(path: str | os.PathLike) -> Workload:
    """Read a workload JSON file (schema: :func:`workload_from_dict`); errors name the file."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WorkloadError(f"{p}: workload file not found") from None
    except OSError as e:
        raise WorkloadError(f"{p}: cannot read workload file ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{p}: invalid JSON ({e})") from None
    return workload_from_dict(d, p.parent, where=p.name)
