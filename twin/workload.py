"""Workload of one vLLM server: adapters, arrival processes, requests, trace replay.

* ``Adapter`` — id, LoRA rank, request rate (req/s).
* Arrival processes (``PoissonArrivals``, ``GammaArrivals``, ``LognormalArrivals``,
  ``RateSwitchingArrivals``) — ``sample_times(rate, duration, rng)`` returns sorted times in
  ``[0, duration)``, generated vectorised.
* ``Requests`` — struct of arrays sorted by arrival time (what the scheduler consumes).
* ``generate_requests`` — one independent stream per adapter (seeded from
  ``SeedSequence(seed).spawn``: adapter ``i``'s requests depend only on ``seed``, ``i``, its
  rate, the arrival process and the length model — not on the other adapters), merged by time.
* ``load_trace_csv`` / ``load_adapters_csv`` — read real traces and adapter lists with errors
  that name the file, row and column. Rows are numbered from 1 after the header (row ``r`` is
  line ``r + 1`` of the file when it has no blank lines; blank lines are skipped, not counted).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .identifiers import clean_identifier, identifier, is_clean
from .lengths import LengthModel, _check_float
from .limits import (MAX_ADAPTERS_PER_INSTANCE, MAX_TRACE_REQUESTS, check_run_size,
                     tokens_limit)

__all__ = [
    "Adapter",
    "adapters_from_cycles",
    "adapters_from_counts",
    "parse_counts",
    "parse_rate_counts",
    "load_adapters_csv",
    "PoissonArrivals",
    "GammaArrivals",
    "LognormalArrivals",
    "RateSwitchingArrivals",
    "ArrivalProcess",
    "stationary_process_from_dict",
    "Requests",
    "generate_requests",
    "offered_token_rate",
    "load_trace_csv",
]

def _generator(rng: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng must be a numpy.random.Generator or a non-negative integer seed, got {rng!r}")


def _finite(owner: str, name: str, value: Any) -> float:
    """A finite float, or ValueError naming ``owner`` and ``name``."""
    return _check_float(owner, name, value)


# =========================================================================== adapters


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter: ``id``, ``rank`` (positive int) and Poisson/arrival ``rate`` (req/s, > 0)."""

    id: str
    rank: int
    rate: float

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip():
            raise ValueError(f"adapter {self.id!r}: id must be a non-empty string")
        if not is_clean(self.id):      # NFC, no control/format characters (twin.identifiers)
            object.__setattr__(self, "id", clean_identifier(self.id, f"adapter {self.id!r}",
                                                            what="id"))
        who = f"adapter '{self.id}'"
        r = self.rank
        if isinstance(r, (float, np.floating)) and math.isfinite(r) and float(r).is_integer():
            r = int(r)
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r <= 0:
            raise ValueError(f"{who}: rank must be a positive integer, got {self.rank!r}")
        object.__setattr__(self, "rank", int(r))
        rate = _finite(who, "rate", self.rate)
        if rate <= 0:
            raise ValueError(f"{who}: rate must be > 0, got {rate}")
        object.__setattr__(self, "rate", rate)


def _check_unique(adapters: Sequence[Adapter], what: str = "adapters") -> None:
    seen: set[str] = set()
    for a in adapters:
        if not isinstance(a, Adapter):
            raise ValueError(f"{what}: expected Adapter objects, got {type(a).__name__}")
        if a.id in seen:
            raise ValueError(f"{what}: duplicate adapter id '{a.id}'")
        seen.add(a.id)


def adapters_from_cycles(n: int, ranks: Sequence[int], rates: Sequence[float], prefix: str = "a") -> list[Adapter]:
    """``n`` adapters ``<prefix>0 … <prefix>{n-1}``; adapter i gets ``ranks[i % len(ranks)]`` and
    ``rates[i % len(rates)]``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"adapters_from_cycles: n must be a positive integer, got {n!r}")
    if len(ranks) == 0:
        raise ValueError("adapters_from_cycles: ranks must not be empty")
    if len(rates) == 0:
        raise ValueError("adapters_from_cycles: rates must not be empty")
    return [Adapter(f"{prefix}{i}", ranks[i % len(ranks)], rates[i % len(rates)]) for i in range(int(n))]


def adapters_from_counts(rank_counts: dict[int, int], rate_counts: dict[float, int], seed: int | np.random.Generator = 0,
                         prefix: str = "a") -> list[Adapter]:
    """Adapters with the given rank and rate multisets, randomly paired (as in the real benchmark).

    Ranks are laid out in ascending-rank blocks (adapter ids ``<prefix>0…``), the rate multiset
    is shuffled with ``seed`` and paired with them. Both counts must sum to the same total.
    """
    for what, counts in (("rank_counts", rank_counts), ("rate_counts", rate_counts)):
        if not isinstance(counts, dict) or not counts:
            raise ValueError(f"adapters_from_counts: {what} must be a non-empty dict value -> count")
        for k, c in counts.items():
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0:
                raise ValueError(f"adapters_from_counts: {what}[{k!r}] must be a non-negative integer count, got {c!r}")
    n_rank, n_rate = sum(rank_counts.values()), sum(rate_counts.values())
    if n_rank != n_rate:
        raise ValueError(f"adapters_from_counts: rank_counts total {n_rank} != rate_counts total {n_rate}")
    if n_rank == 0:
        raise ValueError("adapters_from_counts: counts sum to 0 adapters")
    ranks = [r for r in sorted(rank_counts) for _ in range(rank_counts[r])]
    rates = np.array([float(x) for x in sorted(rate_counts) for _ in range(rate_counts[x])], dtype=np.float64)
    rates = _generator(seed).permutation(rates)
    return [Adapter(f"{prefix}{i}", r, float(x)) for i, (r, x) in enumerate(zip(ranks, rates))]


def parse_counts(text: str, key_type: type = int) -> dict:
    """Parse ``"8:4 16:4"`` -> ``{8: 4, 16: 4}`` (``key_type=float`` for rates). Separators:
    whitespace or commas; counts are non-negative integers; keys must be unique and > 0."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"counts: expected text like '8:4 16:4', got {text!r}")
    out: dict = {}
    for tok in text.replace(",", " ").split():
        parts = tok.split(":")
        if len(parts) != 2:
            raise ValueError(f"counts {text!r}: token {tok!r} is not 'value:count'")
        try:
            key = key_type(parts[0]) if key_type is not int else int(parts[0])
        except ValueError:
            raise ValueError(f"counts {text!r}: value {parts[0]!r} in {tok!r} is not a valid {key_type.__name__}") from None
        if not (isinstance(key, (int, float)) and math.isfinite(key) and key > 0):
            raise ValueError(f"counts {text!r}: value {parts[0]!r} in {tok!r} must be finite and > 0")
        try:
            cnt = int(parts[1])
        except ValueError:
            raise ValueError(f"counts {text!r}: count {parts[1]!r} in {tok!r} is not an integer") from None
        if cnt < 0:
            raise ValueError(f"counts {text!r}: count in {tok!r} must be >= 0")
        if key in out:
            raise ValueError(f"counts {text!r}: value {parts[0]!r} appears twice")
        out[key] = cnt
    return out


def parse_rate_counts(text: str) -> dict[float, int]:
    """``parse_counts`` with float keys: ``"0.025:2 0.05:3"`` -> ``{0.025: 2, 0.05: 3}``."""
    return parse_counts(text, float)


# =========================================================================== CSV helpers


def _read_csv_strings(path: str | os.PathLike, required: Sequence[str], what: str,
                      max_rows: int | None = None):
    """Read a CSV as strings (stripped), checking the header; returns (name, DataFrame).

    Strict: every row has exactly the header's fields (a row with more or fewer is refused
    naming the row: pandas would shift an extra field into the wrong column or fill a missing
    one with an empty value); blank lines are skipped and not counted. ``max_rows``: a file with
    more lines is refused before it is parsed."""
    import csv

    import pandas as pd

    name = os.path.basename(os.fspath(path))
    if max_rows is not None:
        _check_line_count(path, name, what, max_rows)
    try:
        fh = open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{name}: {what} file not found ({path})") from None
    except OSError as e:
        raise ValueError(f"{name}: cannot read {what} CSV ({e.strerror or e})") from None
    with fh:
        try:
            reader = csv.reader(fh, skipinitialspace=True)
            header = None
            for row in reader:
                if not _blank(row):
                    header = [str(c).strip() for c in row]
                    break
            if header is None:
                raise ValueError(f"{name}: {what} file is empty (a header with columns "
                                 f"{list(required)} is required)")
            seen = set()
            for c in header:
                if c in seen:
                    raise ValueError(f"{name}: column '{c}' appears twice in the header {header}")
                seen.add(c)
            missing = [c for c in required if c not in header]
            if missing:
                raise ValueError(f"{name}: missing column(s) {missing} in header {header}")
            cols: list[list[str]] = [[] for _ in header]
            n = len(header)
            r = 0
            for row in reader:
                if _blank(row):
                    continue
                r += 1
                if len(row) != n:
                    raise ValueError(f"{name} row {r}: {len(row)} fields, the header has {n} "
                                     f"({','.join(header)}): {_clip(','.join(row))!r}")
                for k, c in enumerate(row):
                    cols[k].append(c.strip())
        except (csv.Error, UnicodeDecodeError) as e:
            raise ValueError(f"{name}: cannot parse {what} CSV ({str(e).strip()})") from None
    if r == 0:
        raise ValueError(f"{name}: {what} file has a header but no rows")
    return name, pd.DataFrame({h: c for h, c in zip(header, cols)}, dtype=object)


def _blank(row: list[str]) -> bool:
    return not row or (len(row) == 1 and not row[0].strip())


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _check_line_count(path: str | os.PathLike, name: str, what: str, max_rows: int) -> None:
    """Refuse a file of more than ``max_rows`` + 1 lines by counting newlines (fast, before
    anything is parsed or built)."""
    lines = 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):
                lines += chunk.count(b"\n")
                if lines > max_rows + 1:
                    break
    except OSError:
        return                      # reported by the reader with its own message
    if lines > max_rows + 1:
        raise ValueError(f"{name}: more than {max_rows:,} rows, the limit of one {what} file "
                         "(every row is held in memory); split the file")


_INT_LITERAL = r"[+-]?[0-9]+"


def _numeric_column(name: str, df, col: str, *, integer: bool = False, minimum: float | None = None,
                    strict_min: bool = False) -> np.ndarray:
    """Parse a string column to float64 with row/column-specific errors."""
    import pandas as pd

    raw = df[col]
    vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(vals)
    if bad.any():
        i = int(np.argmax(bad))
        cell = raw.iloc[i]
        reason = "missing value" if cell == "" else f"not a finite number ({cell!r})"
        raise ValueError(f"{name} row {i + 1}, column '{col}': {reason}")
    if integer:   # an integer literal: '8.0', '8.5' and '1e3' are refused
        bad = ~raw.str.fullmatch(_INT_LITERAL).to_numpy(dtype=bool)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"{name} row {i + 1}, column '{col}': not an integer "
                             f"({raw.iloc[i]!r}): write whole numbers without a decimal point "
                             "or exponent")
    if minimum is not None:
        bad = vals <= minimum if strict_min else vals < minimum
        if bad.any():
            i = int(np.argmax(bad))
            op = ">" if strict_min else ">="
            raise ValueError(f"{name} row {i + 1}, column '{col}': must be {op} {minimum:g}, got {raw.iloc[i]!r}")
    return vals


def _id_column(name: str, df, col: str) -> np.ndarray:
    """The ids of column ``col``, NFC-normalised; a missing id or one holding a control or
    format character is refused naming the row (``twin.identifiers``)."""
    ids = df[col].to_numpy(dtype=object)
    empty = ids == ""
    if empty.any():
        raise ValueError(f"{name} row {int(np.argmax(empty)) + 1}, column '{col}': missing value")
    clean: dict[str, str] = {}
    for v in set(ids.tolist()):
        if not is_clean(v):
            try:
                clean[v] = identifier(v, "id")
            except ValueError as e:
                row = int(np.argmax(ids == v)) + 1
                raise ValueError(f"{name} row {row}, column '{col}': {e}") from None
    if clean:
        ids = np.array([clean.get(v, v) for v in ids.tolist()], dtype=object)
    return ids


def load_adapters_csv(path: str | os.PathLike) -> list[Adapter]:
    """Read adapters from a CSV with header ``id,rank,rate`` (extra columns ignored)."""
    name, df = _read_csv_strings(path, ["id", "rank", "rate"], "adapters",
                                 max_rows=MAX_ADAPTERS_PER_INSTANCE)
    ids = _id_column(name, df, "id")
    ranks = _numeric_column(name, df, "rank", integer=True, minimum=1)
    rates = _numeric_column(name, df, "rate", minimum=0, strict_min=True)
    first: dict[str, int] = {}
    for i, a in enumerate(ids):
        if a in first:
            raise ValueError(f"{name} row {i + 1}, column 'id': duplicate adapter id '{a}' (first in row {first[a] + 1})")
        first[a] = i
    return [Adapter(str(a), int(r), float(x)) for a, r, x in zip(ids, ranks, rates)]


# =========================================================================== arrival processes


def _check_rate_duration(owner: str, rate: Any, duration: Any) -> tuple[float, float]:
    rate = _finite(owner, "rate", rate)
    if rate <= 0:
        raise ValueError(f"{owner}: rate must be > 0, got {rate}")
    duration = _finite(owner, "duration", duration)
    if duration < 0:
        raise ValueError(f"{owner}: duration must be >= 0, got {duration}")
    return rate, duration


def _renewal_times(draw, first_gap: float, rate: float, duration: float) -> np.ndarray:
    """Cumulate gaps drawn in batches by ``draw(k)`` starting at ``first_gap`` until ``duration``."""
    if first_gap >= duration:
        return np.empty(0, np.float64)
    expected = rate * (duration - first_gap)
    batch = int(expected + 6.0 * math.sqrt(expected) + 16)
    chunks = [np.array([first_gap])]
    t = first_gap
    while True:
        times = t + np.cumsum(draw(batch))
        chunks.append(times)
        t = float(times[-1])
        if t >= duration:
            break
        batch = max(16, batch // 4)
    out = np.concatenate(chunks)
    return out[: np.searchsorted(out, duration, side="left")]


@dataclass(frozen=True)
class PoissonArrivals:
    """Homogeneous Poisson process (N ~ Poisson(rate·duration) uniform points, sorted)."""

    kind = "poisson"

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int) -> np.ndarray:
        rate, duration = _check_rate_duration("PoissonArrivals", rate, duration)
        g = _generator(rng)
        n = int(g.poisson(rate * duration))
        return np.sort(g.random(n) * duration)

    def describe(self) -> dict:
        return {"kind": self.kind}


@dataclass(frozen=True)
class GammaArrivals:
    """Stationary renewal process with gamma gaps (mean 1/rate, coefficient of variation ``cv``).

    ``cv = 1`` is Poisson, ``cv > 1`` bursty, ``cv < 1`` regular. The process starts in
    equilibrium: the first arrival is ``U·G*`` with ``U ~ U(0,1)`` and ``G*`` the length-biased
    gap (gamma with shape + 1), the exact stationary forward-recurrence time.
    """

    cv: float
    kind = "gamma"

    def __post_init__(self) -> None:
        cv = _finite("GammaArrivals", "cv", self.cv)
        if cv <= 0:
            raise ValueError(f"GammaArrivals: cv must be > 0, got {cv}")
        object.__setattr__(self, "cv", cv)

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int) -> np.ndarray:
        rate, duration = _check_rate_duration("GammaArrivals", rate, duration)
        g = _generator(rng)
        shape = 1.0 / (self.cv * self.cv)
        scale = 1.0 / (rate * shape)
        first = g.random() * g.gamma(shape + 1.0, scale)
        return _renewal_times(lambda k: g.gamma(shape, scale, k), first, rate, duration)

    def describe(self) -> dict:
        return {"kind": self.kind, "cv": self.cv}


@dataclass(frozen=True)
class LognormalArrivals:
    """Stationary renewal process with lognormal gaps (mean 1/rate, coefficient of variation ``cv``).

    Starts in equilibrium like ``GammaArrivals`` (length-biased lognormal has mu + sigma^2).
    """

    cv: float
    kind = "lognormal"

    def __post_init__(self) -> None:
        cv = _finite("LognormalArrivals", "cv", self.cv)
        if cv <= 0:
            raise ValueError(f"LognormalArrivals: cv must be > 0, got {cv}")
        object.__setattr__(self, "cv", cv)

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int) -> np.ndarray:
        rate, duration = _check_rate_duration("LognormalArrivals", rate, duration)
        g = _generator(rng)
        s2 = math.log1p(self.cv * self.cv)
        sigma = math.sqrt(s2)
        mu = -math.log(rate) - 0.5 * s2
        first = g.random() * g.lognormal(mu + s2, sigma)
        return _renewal_times(lambda k: g.lognormal(mu, sigma, k), first, rate, duration)

    def describe(self) -> dict:
        return {"kind": self.kind, "cv": self.cv}


@dataclass(frozen=True)
class RateSwitchingArrivals:
    """Piecewise-constant-rate Poisson process.

    During period ``k`` (``[k·period_s, (k+1)·period_s)``) the rate is
    ``rate · m[k % len(m)]`` with ``m`` the multipliers normalised to mean 1, so the long-run
    mean rate is ``rate``. With ``random_phase`` each stream starts at a uniformly random point
    of the cycle (streams of different adapters are then not synchronised).
    """

    multipliers: tuple[float, ...]
    period_s: float
    random_phase: bool = False
    kind = "rate_switching"

    def __post_init__(self) -> None:
        o = "RateSwitchingArrivals"
        try:
            m = tuple(float(x) for x in self.multipliers)
        except (TypeError, ValueError):
            raise ValueError(f"{o}: multipliers must be a sequence of numbers, got {self.multipliers!r}") from None
        if not m:
            raise ValueError(f"{o}: multipliers must not be empty")
        for i, x in enumerate(m):
            if not math.isfinite(x) or x < 0:
                raise ValueError(f"{o}: multipliers[{i}] must be finite and >= 0, got {x}")
        if sum(m) <= 0:
            raise ValueError(f"{o}: multipliers must not all be 0")
        object.__setattr__(self, "multipliers", m)
        p = _finite(o, "period_s", self.period_s)
        if p <= 0:
            raise ValueError(f"{o}: period_s must be > 0, got {p}")
        object.__setattr__(self, "period_s", p)
        if not isinstance(self.random_phase, (bool, np.bool_)):
            raise ValueError(f"{o}: random_phase must be a bool, got {self.random_phase!r}")

    @property
    def normalized(self) -> np.ndarray:
        """Multipliers scaled to mean 1."""
        m = np.asarray(self.multipliers)
        return m / m.mean()

    def sample_times(self, rate: float, duration: float, rng: np.random.Generator | int) -> np.ndarray:
        rate, duration = _check_rate_duration("RateSwitchingArrivals", rate, duration)
        g = _generator(rng)
        m = self.normalized
        P = self.period_s
        phase = g.random() * P * len(m) if self.random_phase else 0.0
        # periods in absolute (cycle) time, shifted so that t = 0 maps to cycle time `phase`
        k0 = int(math.floor(phase / P))
        k1 = int(math.ceil((phase + duration) / P))
        if (k1 - k0) > 50_000_000:
            raise ValueError(f"RateSwitchingArrivals: period_s={P} is too short for duration {duration} s")
        ks = np.arange(k0, max(k1, k0 + 1))
        starts = np.maximum(ks * P - phase, 0.0)
        ends = np.minimum((ks + 1) * P - phase, duration)
        lens = np.maximum(ends - starts, 0.0)
        counts = g.poisson(rate * m[ks % len(m)] * lens)
        total = int(counts.sum())
        t = np.repeat(starts, counts) + g.random(total) * np.repeat(lens, counts)
        t.sort()
        return t[t < duration]

    def describe(self) -> dict:
        return {"kind": self.kind, "multipliers": list(self.multipliers), "period_s": self.period_s,
                "random_phase": bool(self.random_phase)}


ArrivalProcess = PoissonArrivals | GammaArrivals | LognormalArrivals | RateSwitchingArrivals


def stationary_process_from_dict(d: dict) -> ArrivalProcess:
    """Inverse of ``describe()`` for the stationary processes: ``{"kind": "poisson" | "gamma" |
    "lognormal" | "rate_switching", ...}``. ``twin.arrivals.arrival_process_from_dict`` reads
    every kind, the non-stationary ``markov_modulated`` and ``shaped`` too (they live there)."""
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError(f"arrival process: expected a dict with a 'kind' field, got {d!r}")
    if d["kind"] in ("markov_modulated", "shaped"):
        raise ValueError(f"arrival process: kind {d['kind']!r} is non-stationary: read it with "
                         "twin.arrivals.arrival_process_from_dict")
    kinds = {"poisson": (PoissonArrivals, set(), set()), "gamma": (GammaArrivals, {"cv"}, set()),
             "lognormal": (LognormalArrivals, {"cv"}, set()),
             "rate_switching": (RateSwitchingArrivals, {"multipliers", "period_s"}, {"random_phase"})}
    kind = d["kind"]
    if kind not in kinds:
        raise ValueError(f"arrival process: unknown kind {kind!r} (expected one of "
                         f"{sorted([*kinds, 'markov_modulated', 'shaped'])})")
    cls, req, opt = kinds[kind]
    params = {k: v for k, v in d.items() if k != "kind"}
    missing = sorted(req - set(params))
    if missing:
        raise ValueError(f"arrival process '{kind}': missing field(s) {missing}")
    unknown = sorted(set(params) - req - opt)
    if unknown:
        raise ValueError(f"arrival process '{kind}': unknown field(s) {unknown}")
    if "multipliers" in params:
        params["multipliers"] = tuple(params["multipliers"])
    return cls(**params)


# =========================================================================== requests


@dataclass(frozen=True, eq=False)
class Requests:
    """Requests sorted by arrival: ``arrival_s`` (float64), ``adapter`` (int32 index into the
    adapter list), ``input_len`` / ``output_len`` (int32, >= 1). Arrays are made read-only."""

    arrival_s: np.ndarray
    adapter: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray

    def __post_init__(self) -> None:
        conv = {}
        for name, dt in (("arrival_s", np.float64), ("adapter", np.int32), ("input_len", np.int32),
                         ("output_len", np.int32)):
            v = getattr(self, name)
            try:
                a = np.asarray(v)
                if a.ndim != 1:
                    raise ValueError(f"Requests: {name} must be 1-D, got shape {a.shape}")
                if dt is np.int32 and a.size and a.dtype.kind not in "iub":
                    af = a.astype(np.float64)
                    if not np.all(np.isfinite(af)) or np.any(af != np.round(af)):
                        raise ValueError(f"Requests: {name} must hold integers")
                if dt is np.int32 and a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
                    raise ValueError(f"Requests: {name} out of int32 range")
                a = np.array(a, dtype=dt, copy=True)
            except (TypeError, ValueError) as e:
                msg = str(e) if str(e).startswith("Requests:") else f"Requests: {name} must be numeric ({e})"
                raise ValueError(msg) from None
            a.setflags(write=False)
            conv[name] = a
        n = len(conv["arrival_s"])
        for name, a in conv.items():
            if len(a) != n:
                raise ValueError(f"Requests: {name} has {len(a)} entries, arrival_s has {n}")
        t = conv["arrival_s"]
        if n:
            if not np.all(np.isfinite(t)) or t.min() < 0:
                raise ValueError("Requests: arrival_s must be finite and >= 0")
            if np.any(np.diff(t) < 0):
                i = int(np.argmax(np.diff(t) < 0))
                raise ValueError(f"Requests: arrival_s must be sorted (index {i + 1}: {t[i + 1]} < {t[i]})")
            for name in ("input_len", "output_len"):
                if conv[name].min() < 1:
                    raise ValueError(f"Requests: {name} must be >= 1, got {conv[name].min()}")
            if conv["adapter"].min() < 0:
                raise ValueError(f"Requests: adapter index must be >= 0, got {conv['adapter'].min()}")
        for name, a in conv.items():
            object.__setattr__(self, name, a)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def total_tokens(self) -> int:
        """Σ (input + output) tokens."""
        return int(self.input_len.sum(dtype=np.int64) + self.output_len.sum(dtype=np.int64))

    def offered_token_rate(self, duration: float) -> float:
        """Offered load in tokens/s: Σ (input + output) / ``duration``."""
        d = _finite("Requests.offered_token_rate", "duration", duration)
        if d <= 0:
            raise ValueError(f"Requests.offered_token_rate: duration must be > 0, got {d}")
        return self.total_tokens / d

    def counts_per_adapter(self, n_adapters: int) -> np.ndarray:
        """Number of requests of each adapter index ``0..n_adapters-1``."""
        if len(self) and self.adapter.max() >= n_adapters:
            raise ValueError(f"Requests.counts_per_adapter: adapter index {self.adapter.max()} >= n_adapters {n_adapters}")
        return np.bincount(self.adapter, minlength=n_adapters)

    @classmethod
    def empty(cls) -> "Requests":
        """No requests."""
        return cls(np.empty(0), np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int32))


def offered_token_rate(adapters: Sequence[Adapter], lengths: LengthModel) -> float:
    """Expected offered tokens/s: Σ_i rate_i · (mean input + mean output) (DESIGN §1)."""
    return sum(a.rate for a in adapters) * (lengths.mean_input + lengths.mean_output)


def generate_requests(
    adapters: Sequence[Adapter],
    duration_s: float,
    lengths: LengthModel,
    arrivals: ArrivalProcess = PoissonArrivals(),
    seed: int | np.random.Generator = 0,
) -> Requests:
    """Independent per-adapter streams over ``[0, duration_s)``, merged by time (stable: ties keep
    adapter order).

    Adapter ``i`` uses child ``i`` of ``SeedSequence(seed)`` (for a Generator, of a SeedSequence
    seeded by one draw from it), itself split into an arrival stream and a length stream, so its requests do not
    depend on the other adapters, and switching the arrival process keeps the length sequence.
    """
    if not isinstance(adapters, Sequence) or len(adapters) == 0:
        raise ValueError("generate_requests: adapters must be a non-empty list of Adapter")
    _check_unique(adapters)
    duration_s = _finite("generate_requests", "duration_s", duration_s)
    if duration_s <= 0:
        raise ValueError(f"generate_requests: duration_s must be > 0, got {duration_s}")
    if not hasattr(lengths, "sample"):
        raise ValueError(f"generate_requests: lengths must be a length model, got {type(lengths).__name__}")
    if not hasattr(arrivals, "sample_times"):
        raise ValueError(f"generate_requests: arrivals must be an arrival process, got {type(arrivals).__name__}")
    if isinstance(seed, np.random.Generator):
        children = np.random.SeedSequence(int(seed.integers(2**63))).spawn(len(adapters))
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        children = np.random.SeedSequence(int(seed)).spawn(len(adapters))
    else:
        raise ValueError(f"generate_requests: seed must be a non-negative int or a Generator, got {seed!r}")

    return merge_streams([(arrivals, a.rate) for a in adapters], duration_s, lengths, children)


def merge_streams(streams: Sequence[tuple[ArrivalProcess, float]], duration_s: float,
                  lengths: LengthModel, children: Sequence[np.random.SeedSequence]) -> Requests:
    """Requests of independent per-adapter streams (adapter index = position in ``streams``),
    merged in arrival order. Stream i draws its arrivals and lengths from two children of
    ``children[i]``, so it does not depend on the other streams."""
    # bounded before anything is drawn (twin.limits): the expected request count, the window
    # and the adapter count of one server
    check_run_size(len(streams), sum(float(rate) for _, rate in streams), float(duration_s),
                   "workload")
    times, idx, ins, outs = [], [], [], []
    for i, ((process, rate), ss) in enumerate(zip(streams, children)):
        s_arr, s_len = ss.spawn(2)
        t = process.sample_times(rate, duration_s, np.random.Generator(np.random.PCG64(s_arr)))
        li, lo = lengths.sample(len(t), np.random.Generator(np.random.PCG64(s_len)))
        times.append(t)
        idx.append(np.full(len(t), i, np.int32))
        ins.append(li)
        outs.append(lo)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return Requests(t[order], np.concatenate(idx)[order], np.concatenate(ins)[order],
                    np.concatenate(outs)[order])


# =========================================================================== traces


def load_trace_csv(
    path: str | os.PathLike,
    adapters: Sequence[Adapter] | None = None,
    duration_s: float | None = None,
    max_model_len: int | None = None,
) -> tuple[list[Adapter], Requests]:
    """Read a request trace (``arrival_s, adapter_id, input_tokens, output_tokens`` [, ``rank``]).

    Rows need not be sorted (they are, stably). With ``adapters`` given, every ``adapter_id``
    must be one of them (a ``rank`` column, if present, must agree) and the list is returned
    unchanged. Otherwise adapters are created in order of first appearance with the rank from
    the ``rank`` column (required, consistent per adapter) and rate = count / span, where span
    is ``duration_s`` or else the largest arrival time.

    Sizes are bounded (``twin.limits``): at most ``MAX_TRACE_REQUESTS`` rows (refused before
    parsing), and input + output tokens of a row at most ``max_model_len`` when given (the
    profile's context: vLLM refuses longer requests), else ``MAX_TOKENS_PER_REQUEST``.
    """
    name, df = _read_csv_strings(path, ["arrival_s", "adapter_id", "input_tokens", "output_tokens"],
                                 "trace", max_rows=MAX_TRACE_REQUESTS)
    t = _numeric_column(name, df, "arrival_s", minimum=0)
    ids = _id_column(name, df, "adapter_id")
    li = _numeric_column(name, df, "input_tokens", integer=True, minimum=1)
    lo = _numeric_column(name, df, "output_tokens", integer=True, minimum=1)
    for col, v in (("input_tokens", li), ("output_tokens", lo)):
        if v.max() > np.iinfo(np.int32).max:
            i = int(np.argmax(v > np.iinfo(np.int32).max))
            raise ValueError(f"{name} row {i + 1}, column '{col}': too large ({df[col].iloc[i]!r})")
    limit, limit_text = tokens_limit(max_model_len)
    over = li + lo > limit
    if over.any():
        i = int(np.argmax(over))
        raise ValueError(f"{name} row {i + 1}: {int(li[i]):,} input + {int(lo[i]):,} output "
                         f"tokens exceed {limit_text} (columns 'input_tokens', 'output_tokens')")
    ranks = _numeric_column(name, df, "rank", integer=True, minimum=1) if "rank" in df.columns else None

    uniq, first_pos, inv = np.unique(ids.astype(str), return_index=True, return_inverse=True)
    if adapters is not None:
        adapters = list(adapters)
        _check_unique(adapters, f"{name}: adapters")
        pos = {a.id: k for k, a in enumerate(adapters)}
        missing = [u for u in uniq if u not in pos]
        if missing:
            row = int(np.min(first_pos[np.isin(uniq, missing)])) + 1
            raise ValueError(f"{name} row {row}, column 'adapter_id': unknown adapter '{ids[row - 1]}'")
        amap = np.array([pos[u] for u in uniq], dtype=np.int32)
        a_idx = amap[inv]
        if ranks is not None:
            expected = np.array([a.rank for a in adapters])[a_idx]
            bad = ranks != expected
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{name} row {i + 1}, column 'rank': {int(ranks[i])} differs from adapter "
                                 f"'{ids[i]}' rank {int(expected[i])}")
        out_adapters = adapters
    else:
        if ranks is None:
            raise ValueError(f"{name}: column 'rank' is required when no adapter list is given")
        span = float(t.max()) if duration_s is None else _finite("load_trace_csv", "duration_s", duration_s)
        if span <= 0:
            raise ValueError(f"{name}: cannot infer adapter rates: trace span is {span} s "
                             "(pass duration_s or an adapter list)")
        order = np.argsort(first_pos, kind="stable")  # adapters in order of first appearance
        rank_of = np.empty(len(uniq), dtype=np.int64)
        rank_of[inv] = ranks  # last write wins; check consistency below
        bad = ranks != rank_of[inv]
        if bad.any():
            i = int(np.argmax(bad))
            k = int(inv[i])
            raise ValueError(f"{name} row {i + 1}, column 'rank': adapter '{ids[i]}' has rank {int(ranks[i])} "
                             f"here but {int(rank_of[k])} elsewhere")
        counts = np.bincount(inv, minlength=len(uniq))
        new_index = np.empty(len(uniq), dtype=np.int32)
        new_index[order] = np.arange(len(uniq), dtype=np.int32)
        out_adapters = [Adapter(str(uniq[k]), int(rank_of[k]), counts[k] / span) for k in order]
        a_idx = new_index[inv]
    srt = np.argsort(t, kind="stable")
    return out_adapters, Requests(t[srt], a_idx[srt], li[srt].astype(np.int32), lo[srt].astype(np.int32))
