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

Per adapter class (``Slo.classes``, :class:`SloClass`): a class names its adapters and overrides
any of the four bounds; its requests are judged by the class's bounds, every other request by
the top-level ones (which may state none: best-effort tenants beside a premium class). The
attainment level, warm-up and latency view are the SLO's, shared by every class. Per-request
bounds (TTFT, E2E, mean TTFT) are judged over each class's own requests; the ITL quantile is the
server's (every running request shares the engine's steps), held against each class's ITL
bound. Observed values and verdicts of a class are keyed ``<class>:<bound>``.

``score`` is the smallest bound / observed ratio over the stated bounds (>= 1: met; where a
quantile falls on unserved requests, the share of requests within the bound over the share
required), which an Amax search maximises together with the throughput score. ``goodput_rps``: judged requests
that meet every per-request bound (TTFT and E2E) per second of the judged window;
``attainment``: their share of the judged requests.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from . import kernel as K

SLO_BOUNDS: tuple[str, ...] = ("ttft_p99_ms", "itl_p99_ms", "ttft_mean_ms", "e2e_p99_ms")
DEFAULT_ATTAINMENT = 0.99
DEFAULT_WARMUP_S = 60.0
LATENCY_VIEWS = ("client", "engine")    # Slo.latency: a benchmark client's view, or the engine's


def _bound_ms(where: str, v: Any) -> float:
    """A bound's value: a finite number of milliseconds > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{where}: must be a number of milliseconds, got {v!r}")
    if not (math.isfinite(float(v)) and float(v) > 0):
        raise ValueError(f"{where}: must be a finite number of milliseconds > 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class SloClass:
    """An adapter class: its ``adapters`` (ids) are judged by the SLO's bounds with these
    ``bounds`` (name -> ms, any of ``SLO_BOUNDS``) in place of the top-level ones."""

    name: str
    bounds: tuple[tuple[str, float], ...]
    adapters: tuple[str, ...]

    def __post_init__(self) -> None:
        where = f"slo.classes.{self.name}"
        if not isinstance(self.name, str) or not self.name.strip() or ":" in self.name:
            raise ValueError(f"slo.classes: a class name must be a non-empty string without "
                             f"':', got {self.name!r}")
        b = dict(self.bounds)
        bad = sorted(set(b) - set(SLO_BOUNDS))
        if bad:
            raise ValueError(f"{where}: unknown bound(s) {bad} (known: {', '.join(SLO_BOUNDS)}, "
                             "adapters)")
        if not b:
            raise ValueError(f"{where}: state at least one bound ({', '.join(SLO_BOUNDS)})")
        object.__setattr__(self, "bounds", tuple(sorted(
            (n, _bound_ms(f"{where}.{n}", v)) for n, v in b.items())))
        ids = self.adapters
        if isinstance(ids, str) or not all(isinstance(i, str) and i for i in ids) or not ids:
            raise ValueError(f"{where}.adapters: must be a non-empty list of adapter ids, "
                             f"got {ids!r}")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"{where}.adapters: adapter(s) {dup[:5]} listed twice")
        object.__setattr__(self, "adapters", tuple(sorted(ids)))


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
    classes: tuple[SloClass, ...] = ()

    def __post_init__(self) -> None:
        if self.latency not in LATENCY_VIEWS:
            raise ValueError(f"slo.latency: one of {', '.join(LATENCY_VIEWS)} (whose latencies "
                             f"are judged), got {self.latency!r}")
        for name in SLO_BOUNDS:
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _bound_ms(f"slo.{name}", v))
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
        classes = tuple(self.classes)
        if not all(isinstance(c, SloClass) for c in classes):
            raise ValueError("slo.classes: expected twin.slo.SloClass objects")
        seen: dict[str, str] = {}
        for c in classes:
            if c.name in {d.name for d in classes if d is not c}:
                raise ValueError(f"slo.classes: class '{c.name}' stated twice")
            for i in c.adapters:
                if i in seen:
                    raise ValueError(f"slo.classes.{c.name}.adapters: adapter '{i}' is already "
                                     f"in class '{seen[i]}' (an adapter has one class)")
                seen[i] = c.name
        object.__setattr__(self, "classes", tuple(sorted(classes, key=lambda c: c.name)))
        if not self.bounds() and not classes:
            raise ValueError(f"slo: state at least one bound ({', '.join(SLO_BOUNDS)})")

    def bounds(self) -> dict[str, float]:
        """The stated top-level bounds, name -> ms."""
        return {n: getattr(self, n) for n in SLO_BOUNDS if getattr(self, n) is not None}

    def _with_bounds(self, bounds: Mapping[str, float]) -> "Slo | None":
        if not bounds:
            return None
        return Slo(**{n: bounds.get(n) for n in SLO_BOUNDS}, attainment=self.attainment,
                   warmup_s=self.warmup_s, latency=self.latency)

    def class_slo(self, name: str | None) -> "Slo | None":
        """The bounds class ``name`` is judged by (``None``: the top-level ones) as a plain SLO
        without classes; None when nothing bounds it."""
        if name is None:
            return self._with_bounds(self.bounds())
        c = next((c for c in self.classes if c.name == name), None)
        if c is None:
            raise KeyError(f"slo: no class named '{name}'")
        return self._with_bounds({**self.bounds(), **dict(c.bounds)})

    def judged_bounds(self) -> dict[str, float]:
        """Every bound a run is judged by, keyed as ``SloResult.observed``: the top-level ones
        by name, each class's (its own and those it inherits) as ``<class>:<name>``."""
        out = dict(self.bounds())
        for c in self.classes:
            g = self.class_slo(c.name)
            out.update({f"{c.name}:{n}": v for n, v in g.bounds().items()})
        return out

    def bounds_itl(self) -> bool:
        """Whether any group (the top level or a class) bounds the inter-token latency."""
        return "itl_p99_ms" in self.bounds() or any("itl_p99_ms" in dict(c.bounds)
                                                    for c in self.classes)

    def adapter_class(self) -> dict[str, str]:
        """Adapter id -> its class name (adapters of no class are absent)."""
        return {i: c.name for c in self.classes for i in c.adapters}

    def loosest(self, adapter_ids=None) -> "Slo | None":
        """A plain SLO no tighter than any class's for any adapter (of ``adapter_ids``, default:
        the classes' own and the top level): every bound the loosest among the judged groups,
        unbounded where one group leaves it unbounded. A GPU that meets the classes' bounds
        meets this one — what a lower bound or a one-adapter carry limit may assume."""
        if not self.classes:
            return self
        of = self.adapter_class()
        names: set[str | None] = ({c.name for c in self.classes} | {None}
                                  if adapter_ids is None else {of.get(i) for i in adapter_ids})
        groups = [self.class_slo(n) for n in sorted(names, key=lambda n: n or "")]
        if any(g is None for g in groups):
            return None
        loose = {n: max(g.bounds().get(n, math.inf) for g in groups) for n in SLO_BOUNDS}
        return self._with_bounds({n: v for n, v in loose.items() if math.isfinite(v)})

    def describe(self) -> str:
        """``ttft_p99<=500ms itl_p99<=100ms (99 % of requests, after a 60 s warm-up)``."""
        q = f"{100 * self.attainment:g}"
        parts = [f"{n[:-3].replace('_p99', f'_p{q}')}<={v:g}ms" for n, v in self.bounds().items()]
        view = "" if self.latency == "client" else ", engine latencies"
        for c in self.classes:
            own = " ".join(f"{n[:-3].replace('_p99', f'_p{q}')}<={v:g}ms" for n, v in c.bounds)
            parts.append(f"[{c.name} ({len(c.adapters)} adapter(s)): {own}]")
        return f"{' '.join(parts)} (after a {self.warmup_s:g} s warm-up{view})"

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v is not None and k != "classes"}
        if self.classes:
            d["classes"] = {c.name: {**dict(c.bounds), "adapters": list(c.adapters)}
                            for c in self.classes}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "slo") -> "Slo":
        """An SLO from its JSON object; unknown keys and bad values name the field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: must be an object with any of {', '.join(SLO_BOUNDS)}, "
                             f"attainment, warmup_s, latency; got {d!r}")
        known = set(SLO_BOUNDS) | {"attainment", "warmup_s", "latency", "classes"}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"{where}: unknown field(s) {bad} (known: {', '.join(sorted(known))})")
        d = dict(d)
        raw = d.pop("classes", None)
        try:
            if raw is not None:
                if not isinstance(raw, Mapping) or not raw:
                    raise ValueError("slo.classes: must be an object {class name: {bounds..., "
                                     f"adapters: [ids]}}, got {raw!r}")
                out = []
                for name, body in raw.items():
                    if not isinstance(body, Mapping):
                        raise ValueError(f"slo.classes.{name}: must be an object with bounds "
                                         f"and adapters, got {body!r}")
                    if "adapters" not in body:
                        raise ValueError(f"slo.classes.{name}.adapters: missing (the ids of "
                                         "the class's adapters)")
                    ids = body["adapters"]
                    if not isinstance(ids, (list, tuple)):
                        raise ValueError(f"slo.classes.{name}.adapters: must be a list of "
                                         f"adapter ids, got {ids!r}")
                    out.append(SloClass(name, tuple((k, v) for k, v in body.items()
                                                    if k != "adapters"), tuple(ids)))
                d["classes"] = tuple(out)
            return cls(**d)
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


def _judge_group(slo: Slo, mask: np.ndarray, a: np.ndarray, f: np.ndarray, e: np.ndarray,
                 itl_observed: float, duration_s: float, prefix: str, observed: dict,
                 within: dict, bounds: dict, ok_req: np.ndarray) -> None:
    """Judge the judged requests in ``mask`` (arrival ``a``, client first/last token ``f``/``e``,
    -1 when none) by ``slo``'s bounds; results go into the dicts under ``prefix + name`` and
    requests that miss a per-request bound are cleared in ``ok_req``."""
    a, f, e = a[mask], f[mask], e[mask]
    n = int(mask.sum())
    has_first = (f >= 0) & (f <= duration_s)
    done = (e >= 0) & (e <= duration_s)
    ttft = (f[has_first] - a[has_first]) * 1000.0
    e2e = (e[done] - a[done]) * 1000.0
    good_all = np.ones(n, bool)
    per_request = {"ttft_p99_ms": (ttft, has_first), "e2e_p99_ms": (e2e, done)}
    for name, bound in slo.bounds().items():
        key = prefix + name
        bounds[key] = bound
        if name in per_request:         # a quantile over the judged requests, unserved = inf
            lat, served = per_request[name]
            observed[key] = _quantile_with_unserved(lat, n - len(lat), slo.attainment)
            good = np.zeros(n, bool)
            good[np.flatnonzero(served)] = lat <= bound
            within[key] = float(good.mean()) if n else float("nan")
            good_all &= good
        elif name == "ttft_mean_ms":
            waited = np.where(has_first, (f - a) * 1000.0, (duration_s - a) * 1000.0)
            observed[key] = float(waited.mean()) if n else float("nan")
        elif name == "itl_p99_ms":
            observed[key] = itl_observed
    ok_req[mask] &= good_all


def evaluate_slo(slo: Slo, arrival: np.ndarray, first_t: np.ndarray, finish_t: np.ndarray,
                 itl_hist: np.ndarray, duration_s: float, adapter: np.ndarray | None = None,
                 n_adapters: int | None = None, client=None,
                 adapter_ids: Sequence[str] | None = None) -> SloResult:
    """Judge one run (the kernel's per-request first-token and finish times, -1 when none);
    with ``adapter`` (each request's adapter index, < ``n_adapters``) also per adapter. With
    ``client`` (the run's ``twin.latency_tail.ClientView``) and ``slo.latency == "client"``,
    the client's latencies (module docstring). An SLO with classes needs ``adapter`` and
    ``adapter_ids`` (the run's adapters, by index) to know each request's class."""
    offset = np.zeros(len(arrival))
    itl_q = None
    if client is not None and slo.latency == "client":
        offset = client.offsets_ms / 1000.0
        if slo.bounds_itl():
            itl_q = client.itl_quantiles_ms(itl_hist, (slo.attainment,))[0]
    itl_observed = (hist_quantile_upper(itl_hist, slo.attainment) if itl_q is None
                    else float(itl_q))
    judged = (arrival >= slo.warmup_s) & (arrival < duration_s)
    n = int(judged.sum())
    a = arrival[judged]
    # a client sees the first and the last token later by the request's offset
    f = np.where(first_t[judged] >= 0, first_t[judged] + offset[judged], first_t[judged])
    e = np.where(finish_t[judged] >= 0, finish_t[judged] + offset[judged], finish_t[judged])
    observed: dict[str, float] = {}
    within: dict[str, float] = {}
    bounds: dict[str, float] = {}
    ok_req = np.ones(n, bool)
    if not slo.classes:
        _judge_group(slo, np.ones(n, bool), a, f, e, itl_observed, duration_s, "", observed,
                     within, bounds, ok_req)
    else:
        if adapter is None or adapter_ids is None:
            raise ValueError("evaluate_slo: an SLO with classes needs each request's adapter "
                             "and the run's adapter ids")
        of = slo.adapter_class()
        names = [None] + [c.name for c in slo.classes]
        idx = {nm: k for k, nm in enumerate(names)}
        cls_of_adapter = np.array([idx[of.get(i)] for i in adapter_ids], np.int64)
        req_cls = cls_of_adapter[np.asarray(adapter)[judged].astype(np.int64)]
        for k, nm in enumerate(names):
            group = slo.class_slo(nm)
            mask = req_cls == k
            if group is None or not mask.any():
                continue                # unbounded, or no request of the class on this GPU
            _judge_group(group, mask, a, f, e, itl_observed, duration_s,
                         "" if nm is None else f"{nm}:", observed, within, bounds, ok_req)
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


__all__ = ["SLO_BOUNDS", "Slo", "SloClass", "SloResult", "evaluate_slo", "hist_quantile_upper"]
