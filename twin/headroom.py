"""A throughput verdict with measured headroom: the twin's optimism against real runs, per regime.

The twin's verdict (``RunMetrics.accepted``: throughput >= 0.9 x the realised offered load)
carries the twin's own error. Replayed against the shared **max-search** runs
(``validation_llama/maxsearch_llama.csv``; never the validation runs, which are the evaluation
set) the twin is a few % optimistic in some regimes and exact in others. This module measures
that optimism per *regime* and turns it into a headroom ``h`` the verdict can use.

Regime of a run (``Regime``; known from the configuration and the twin's own run, never from
the real run):

- ``slots``: the ``max_loras`` bucket, ``<=16``, ``17-64``, ``65-128``, ``>128``;
- ``swapping``: the server holds more adapters than slots (served adapters > ``max_loras``);
- ``load``: ``saturated`` when the twin's own run already falls behind its arrivals (twin
  throughput < ``SATURATED_RATIO`` x its realised offered load), else ``keeps-up``.

Derivation (``twin.headroom_fit.fit_headroom``): per max-search run ``e = (twin - real) /
real`` throughput (the twin replays the run from its configuration columns with ``twin.shared_runs
.replay_run``, seed 0, engine latencies); per regime ``h`` = the ``QUANTILE`` (90th percentile)
of ``max(e, 0)`` over its runs. A regime with fewer than ``MIN_RUNS`` runs falls back to its
parent, in the order (slots, swapping, load) -> (slots, swapping) -> (slots) -> overall; the
table keeps every level with its run count and the lookup (``HeadroomTable.lookup``) walks the
chain. Runs the twin cannot start (memory error) are left out.

The verdict with headroom (``accepted_with_headroom``): a GPU is accepted when it started, meets
its SLO (if any) and ``throughput / (1 + h) >= threshold x offered_realised`` — the twin's
throughput discounted by the largest optimism it showed on 9 real runs in 10 of its regime. With
``h = 0`` (a profile without constants) it is the plain verdict. A server is judged with it when
its ``ServerConfig.headroom`` asks (``RunMetrics.headroom``: h, regime, ok; ``accepted`` then
requires it): ``optim plan`` does by default (``--no-headroom``: the plain rule), ``optim solve
--headroom`` and an instance's ``"headroom": true`` too. Otherwise the plain verdict rules and
``optim solve`` / ``verify`` / ``deploy`` print the headroom verdict beside it (``deployment.json``
flags the GPUs that pass only without it); ``python -m twin run`` prints both. Lower bounds stay
the plain verdict's: it accepts more, so they hold for either.

Refit (``twin.headroom_fit``; writes ``twin/profiles/headroom.json``)::

    python -m twin.headroom_fit --fit ../shared/data/vllm_h100 [--workers 2]

``--evaluate`` also replays ``validation_llama.csv`` and prints how the plain and the headroom
verdicts classify its real-starved runs (evaluation only; nothing is fitted on it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


CONSTANTS_FILE = Path(__file__).resolve().parent / "profiles" / "headroom.json"
MAXSEARCH_CSV = Path("validation_llama") / "maxsearch_llama.csv"
VALIDATION_CSV = Path("validation_llama") / "validation_llama.csv"
FIT_PROFILE = "llama-3.1-8b-instruct"
QUANTILE = 0.9                 # h = this quantile of max(e, 0) over a regime's runs
MIN_RUNS = 10                  # a regime with fewer runs falls back to its parent
SATURATED_RATIO = 0.98         # the twin's run is "saturated" below this throughput / offered
SLOT_BUCKETS = ((16, "<=16"), (64, "17-64"), (128, "65-128"), (None, ">128"))
REPLAY_COLUMNS = ("throughput_tps", "offered_realised_tps", "starved", "memory_error")


def slots_bucket(max_loras: int) -> str:
    for hi, name in SLOT_BUCKETS:
        if hi is None or max_loras <= hi:
            return name
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Regime:
    """Where a run sits: its ``max_loras`` bucket, whether it swaps adapters, the twin's load."""

    slots: str
    swapping: bool
    load: str

    @classmethod
    def of(cls, max_loras: int, served_adapters: int, throughput_tps: float,
           offered_realised_tps: float) -> "Regime":
        """The regime of a run from its configuration and the twin's own run of it."""
        sat = offered_realised_tps > 0 and throughput_tps < SATURATED_RATIO * offered_realised_tps
        return cls(slots_bucket(int(max_loras)), int(served_adapters) > int(max_loras),
                   "saturated" if sat else "keeps-up")

    def chain(self) -> tuple[str, ...]:
        """Table keys from the most specific to the overall one."""
        sw = "swapping" if self.swapping else "no-swap"
        return (f"slots {self.slots}|{sw}|{self.load}", f"slots {self.slots}|{sw}",
                f"slots {self.slots}", "all")

    def describe(self) -> str:
        return self.chain()[0].replace("|", ", ")


@dataclass(frozen=True)
class HeadroomEntry:
    """One level of the table: headroom fraction, runs it was measured on, the error's spread."""

    headroom: float
    runs: int
    mean_error: float = 0.0
    max_error: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.headroom) and self.headroom >= 0):
            raise ValueError(f"headroom must be a finite fraction >= 0, got {self.headroom!r}")


@dataclass(frozen=True)
class Headroom:
    """The headroom a run gets: ``h``, its regime, the table key used and its run count."""

    h: float
    regime: Regime | None
    key: str | None
    runs: int

    def describe(self) -> str:
        if self.key is None:
            return "headroom: 0 % (no measured headroom for this profile: plain verdict)"
        used = "" if self.regime is None or self.key == self.regime.chain()[0] else \
            f", table level '{self.key}'"
        return (f"headroom: {100 * self.h:.1f} % (regime: {self.regime.describe()}{used}, "
                f"from {self.runs} max-search runs)")


NO_HEADROOM = Headroom(0.0, None, None, 0)


@dataclass(frozen=True)
class HeadroomTable:
    """A profile's regimes -> headroom (every level of the fallback chain)."""

    profile: str
    quantile: float
    min_runs: int
    entries: tuple[tuple[str, HeadroomEntry], ...]

    def lookup(self, regime: Regime) -> Headroom:
        d = dict(self.entries)
        for key in regime.chain():
            e = d.get(key)
            if e is not None and (e.runs >= self.min_runs or key == "all"):
                return Headroom(e.headroom, regime, key, e.runs)
        return Headroom(0.0, regime, None, 0)

    def to_dict(self) -> dict:
        return {"quantile": self.quantile, "min_runs": self.min_runs,
                "saturated_ratio": SATURATED_RATIO,
                "regimes": {k: {"headroom": round(e.headroom, 5), "runs": e.runs,
                                "mean_error": round(e.mean_error, 5),
                                "max_error": round(e.max_error, 5)} for k, e in self.entries}}

    @classmethod
    def from_dict(cls, profile: str, d: dict) -> "HeadroomTable":
        return cls(profile, float(d["quantile"]), int(d["min_runs"]),
                   tuple((k, HeadroomEntry(float(v["headroom"]), int(v["runs"]),
                                           float(v.get("mean_error", 0.0)),
                                           float(v.get("max_error", 0.0))))
                         for k, v in d["regimes"].items()))


# ---------------------------------------------------------------------------------------------
# the constants shipped beside the profiles

_loaded: dict[str, dict] | None = None


def _entries(path: Path = CONSTANTS_FILE) -> dict[str, dict]:
    global _loaded
    if path != CONSTANTS_FILE:
        return json.loads(path.read_text()).get("profiles", {}) if path.exists() else {}
    if _loaded is None:
        _loaded = json.loads(path.read_text()).get("profiles", {}) if path.exists() else {}
    return _loaded


def headroom_table_for(profile) -> HeadroomTable | None:
    """The measured table of ``profile`` (a ``GpuProfile`` or its name); None without one."""
    name = profile if isinstance(profile, str) else getattr(profile, "name", None)
    entry = _entries().get(name) if name else None
    return None if entry is None else HeadroomTable.from_dict(name, entry)


def headroom_for(profile, max_loras: int, served_adapters: int, throughput_tps: float,
                 offered_realised_tps: float) -> Headroom:
    """The headroom of one run: its regime looked up in its profile's table (0, ``NO_HEADROOM``,
    for a profile without constants)."""
    table = headroom_table_for(profile)
    if table is None:
        return NO_HEADROOM
    return table.lookup(Regime.of(max_loras, served_adapters, throughput_tps,
                                  offered_realised_tps))


def passes_with_headroom(throughput_tps: float, offered_realised_tps: float, h: float,
                         threshold: float = 0.9) -> bool:
    """The rule: ``throughput / (1 + h) >= threshold x offered_realised``."""
    if h < 0 or not math.isfinite(h):
        raise ValueError(f"headroom must be a finite fraction >= 0, got {h!r}")
    return bool(throughput_tps / (1.0 + h) >= threshold * offered_realised_tps)


def accepted_with_headroom(m, h: float, threshold: float = 0.9) -> bool:
    """``RunMetrics.accepted`` with the throughput discounted by ``h`` (module docstring); with
    ``h = 0`` exactly the plain verdict."""
    if m.memory_error or not m.slo_met:
        return False
    if h == 0:
        return m.accepted
    return passes_with_headroom(m.throughput_tps, m.offered_realised_tps, h, threshold)


def judge(profile, max_loras: int, served_adapters: int, m, threshold: float = 0.9
          ) -> tuple[bool, Headroom]:
    """(accepted with headroom, the headroom used) of the run ``m`` of one server."""
    hr = headroom_for(profile, max_loras, served_adapters, m.throughput_tps,
                      m.offered_realised_tps)
    return accepted_with_headroom(m, hr.h, threshold), hr


def describe(profile, max_loras: int, served_adapters: int, m, threshold: float = 0.9
             ) -> list[str]:
    """The headroom verdict of one run in sentences (``python -m twin run``)."""
    if m.memory_error or m.arrived_requests == 0:
        return []
    ok, hr = judge(profile, max_loras, served_adapters, m, threshold)
    lines = [hr.describe()]
    if hr.key is None:
        return lines
    need = threshold * (1 + hr.h)
    if m.accepted and not ok:
        lines.append(f"  accepted by the plain verdict, AT RISK with the twin's measured "
                     f"headroom: throughput / (1 + h) is below {threshold:.0%} of the offered "
                     f"load (needs throughput >= {need:.1%} of it).")
    elif m.accepted:
        lines.append(f"  accepted with the headroom too (throughput / (1 + h) >= "
                     f"{threshold:.0%} x offered; needs >= {need:.1%} of it).")
    else:
        lines.append("  not accepted by the plain verdict; the headroom only tightens it.")
    return lines


def forget_constants() -> None:
    """Read the constants file again at the next lookup (after a refit wrote it)."""
    global _loaded
    _loaded = None
