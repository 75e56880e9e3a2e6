"""The configuration index of a heterogeneous pool: every (GPU type, power cap, Amax, max rank)
a GPU may run, with its capacity and power measured by the twin.

Why the twin and not the surrogates: the trained surrogates exist for the measured profiles
only, and know neither derived profiles (other GPUs, ``twin.derive``) nor power caps. So every
configuration of an instance that needs the index (``Instance.uses_configurations``) is measured
the same way, with the twin, and cached on disk like the carry limits (``optim.capacity``):

* **Capacity** ``capacity_tps``: the largest expected offered load (tok/s) a GPU in that
  configuration carries unstarved with ``amax`` equal-rate adapters of ``max_rank`` (one slot per
  adapter: no adapter is swapped out), bisected (resolution ``CAPACITY_RTOL``) with the
  instance's window, threshold and length model for the workload seeds ``inst.seed + 0 ..
  CAPACITY_SEEDS - 1``; the configuration's capacity is the smallest per-seed limit times
  ``1 - CAPACITY_MARGIN`` (the seeds verification uses for later GPUs differ). A GPU in this
  configuration may hold at most ``amax`` adapters of rank <= ``max_rank`` with total load <=
  capacity: with fewer adapters than slots each step does no more LoRA work than in the
  measurement, and lower ranks run at the server's ``max_lora_rank`` anyway.
* **Power** ``power_w(load) = idle_fit_w + w_per_tps x load``: the least-squares line through
  the twin's average power (``twin.power``) at ``POWER_LOAD_FRACTIONS`` of the capacity (first
  seed), raised by its largest residual so that it is not below any measured point (power
  budgets are checked against it). Linear, so the exact template model can encode it; the
  twin's own power is what verification reports.

A catalog GPU + model type resolves to the shipped measured profile when there is one (a
measured profile always wins) or to a derived profile written once to the cache directory
(``resolve_profile``); ``GpuConfig.derived`` says which, and reports print it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from twin.lengths import LengthModel
from twin.profile import GpuProfile, load_profile
from twin.server import ServerConfig
from twin.workload import Adapter

from .disk_cache import read_json, update_json

AMAX_GRID = (4, 8, 16, 32)
CAPACITY_SEEDS = 3
CAPACITY_MARGIN = 0.03
CAPACITY_RTOL = 0.005
POWER_LOAD_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
_OVERLOAD_TPS = 40_000.0       # above any catalog GPU's saturation with the 8B models
_VERSION = 1                   # bump when the measurement changes (disk cache)


def _cache_dir() -> Path:
    root = os.environ.get("LORA_PLACEMENT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "lora-placement"


def resolve_profile(gpu: str, model: str) -> str:
    """The profile string (shipped name or file path) of ``model`` on catalog ``gpu``: the
    measured profile when shipped, else the derived one, written once to
    ``<cache>/profiles/<name>-<hash>.json`` (content-addressed, never overwritten)."""
    from twin.derive import profile_for
    prof = profile_for(gpu, model)
    if not prof.is_derived:
        return prof.name
    blob = json.dumps(prof.to_dict(), sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    path = _cache_dir() / "profiles" / f"{prof.name}-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        prof.to_json(tmp)
        os.replace(tmp, path)
    return str(path)


@dataclass(frozen=True)
class GpuConfig:
    """One configuration a GPU of type ``gpu_type`` can run (module docstring)."""

    gpu_type: str
    profile: str
    derived: bool
    cap_w: float | None
    amax: int
    max_rank: int
    price_per_hour: float
    capacity_tps: float
    per_seed_tps: tuple[float, ...]
    idle_fit_w: float
    w_per_tps: float
    power_points: tuple[tuple[float, float], ...]

    def power_w(self, load_tps: float) -> float:
        """Predicted average power (W) at an offered load (the fitted line)."""
        return self.idle_fit_w + self.w_per_tps * float(load_tps)

    def fits(self, n_adapters: int, top_rank: int, load_tps: float) -> bool:
        return n_adapters <= self.amax and top_rank <= self.max_rank \
            and load_tps <= self.capacity_tps

    @property
    def label(self) -> str:
        cap = "uncapped" if self.cap_w is None else f"{self.cap_w:g}W"
        return f"{self.gpu_type}/{cap}/A{self.amax}/r{self.max_rank}"

    def derated(self, capacity_tps: float) -> "GpuConfig":
        """The same configuration with a lower capacity (a twin rejection's cut)."""
        return replace(self, capacity_tps=min(self.capacity_tps, float(capacity_tps)))


def _equal_gpu(profile: str, amax: int, rank: int, cap: float | None, load: float,
               per_request: float, threshold: float):
    from twin.fleet import GpuAssignment
    cfg = ServerConfig(max_loras=int(amax), max_lora_rank=int(rank),
                       starvation_threshold=threshold, power_cap_w=cap)
    rate = load / per_request / amax
    return GpuAssignment(profile, cfg, tuple((Adapter(f"e{i}", rank, rate), 1.0)
                                             for i in range(amax)))


def _run(jobs: list[tuple], lengths: LengthModel, duration_s: float, threshold: float,
         pool) -> list:
    """Twin metrics of (profile, amax, rank, cap, load, seed) jobs."""
    from twin.fleet import simulate_fleet
    per = lengths.mean_input + lengths.mean_output
    gpus = [_equal_gpu(p, a, r, c, load, per, threshold) for p, a, r, c, load, _ in jobs]
    res = simulate_fleet(gpus, duration_s=duration_s, lengths=lengths, workers=1, pool=pool,
                         check_routing=False, seeds=[j[-1] for j in jobs])
    return list(res.per_gpu)


def _key(prof: GpuProfile, cap: float | None, amax: int, rank: int, lengths: LengthModel,
         duration_s: float, seeds: Sequence[int], threshold: float) -> str:
    from .capacity import twin_fingerprint
    blob = json.dumps({"v": _VERSION, "profile": prof.to_dict(), "cap": cap, "amax": amax,
                       "rank": rank, "lengths": lengths.to_dict(), "duration_s": duration_s,
                       "seeds": list(seeds), "threshold": threshold,
                       "margin": CAPACITY_MARGIN, "rtol": CAPACITY_RTOL,
                       "fractions": list(POWER_LOAD_FRACTIONS),
                       "twin": twin_fingerprint(prof)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _disk() -> Path:
    return _cache_dir() / "config_capacity.json"


def _disk_read() -> dict:
    return read_json(_disk())


def _disk_write(new: dict) -> None:
    update_json(_disk(), new)


def _measure(specs: list[tuple], lengths: LengthModel, duration_s: float, seeds: list[int],
             threshold: float, pool, quiet: bool) -> list[dict]:
    """Capacity and power line of each (profile, amax, rank, cap) spec, all bisected in
    lockstep (one parallel twin batch per round)."""
    from twin.cli_support import progress
    pairs = [(s, seed) for s in specs for seed in seeds]
    bar = progress(desc=f"twin capacities of {len(specs)} configurations", unit="batch",
                   quiet=quiet)

    def batch(loads: list[float], idx: list[int]) -> list:
        bar.update(1)
        return _run([(*pairs[i][0], loads[i], pairs[i][1]) for i in idx], lengths, duration_s,
                    threshold, pool)

    all_i = list(range(len(pairs)))
    sat = [m.throughput_tps for m in batch([_OVERLOAD_TPS] * len(pairs), all_i)]
    lo = [threshold * t for t in sat]
    hi = [t / threshold * 1.02 for t in sat]
    for _ in range(4):                                     # lower end must be unstarved
        ms = batch(lo, all_i)
        bad = [i for i, m in zip(all_i, ms) if m.starved or m.memory_error]
        if not bad:
            break
        for i in bad:
            hi[i], lo[i] = lo[i], lo[i] * 0.85
    while True:
        todo = [i for i in all_i if hi[i] / lo[i] > 1 + CAPACITY_RTOL]
        if not todo:
            break
        mids = list(lo)
        for i in todo:
            mids[i] = (lo[i] * hi[i]) ** 0.5
        for i, m in zip(todo, batch(mids, todo)):
            if m.starved or m.memory_error:
                hi[i] = mids[i]
            else:
                lo[i] = mids[i]
    out = []
    n_seeds = len(seeds)
    caps = [min(lo[k * n_seeds:(k + 1) * n_seeds]) * (1 - CAPACITY_MARGIN)
            for k in range(len(specs))]
    pjobs = [(*s, f * c, seeds[0]) for s, c in zip(specs, caps) for f in POWER_LOAD_FRACTIONS]
    bar.update(1)
    pm = _run(pjobs, lengths, duration_s, threshold, pool)
    bar.close()
    nf = len(POWER_LOAD_FRACTIONS)
    for k, s in enumerate(specs):
        pts = [(j[4], m.avg_power_w) for j, m in zip(pjobs[k * nf:(k + 1) * nf],
                                                     pm[k * nf:(k + 1) * nf])]
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        slope, icpt = np.polyfit(x, y, 1)
        out.append({"capacity_tps": caps[k], "per_seed_tps": lo[k * n_seeds:(k + 1) * n_seeds],
                    "idle_fit_w": float(icpt), "w_per_tps": float(max(slope, 0.0)),
                    "power_points": [[float(a), float(b)] for a, b in pts]})
    return out


def config_specs(inst) -> list[tuple]:
    """(type, profile, cap, amax, rank) of every configuration the instance admits: each cap of
    the type (uncapped when it lists none) x each Amax of ``AMAX_GRID`` that starts at the rank
    and is needed (up to the smallest grid value >= the adapter count) x each adapter rank."""
    from .capacity import max_startable_amax
    ranks = sorted({a.rank for a in inst.adapters})
    n = len(inst.adapters)
    need = [a for a in AMAX_GRID if a < n] + [min([a for a in AMAX_GRID if a >= n]
                                                  or [max(AMAX_GRID)])]
    out = []
    for t in inst.gpu_types:
        prof = load_profile(t.profile)
        for cap in (t.power_caps_w or (None,)):
            for r in ranks:
                if r not in prof.supported_ranks:
                    continue
                top = max_startable_amax(prof, r)
                for a in need:
                    if a <= top:
                        out.append((t.name, t.profile, cap, a, r))
    return out


def config_index(inst, workers: int | None = None, quiet: bool = True,
                 duration_s: float | None = None) -> list[GpuConfig]:
    """Every configuration of ``inst`` with its twin-measured capacity and power line (cached
    on disk; see the module docstring), measured with the verification window ``duration_s``
    (default: the instance's)."""
    if duration_s is not None:
        inst = replace(inst, duration_s=float(duration_s))
    seeds = [inst.seed + s for s in range(CAPACITY_SEEDS)]
    specs = config_specs(inst)
    if not specs:
        raise ValueError(f"instance '{inst.name}': no GPU type starts any configuration for "
                         "the adapters' ranks")
    profs = {p: load_profile(p) for _, p, _, _, _ in specs}
    keys = [_key(profs[p], c, a, r, inst.lengths, float(inst.duration_s), seeds,
                 float(inst.starvation_threshold)) for _, p, c, a, r in specs]
    disk = _disk_read()
    todo = [k for k in range(len(specs)) if keys[k] not in disk]
    if todo:
        run_specs = [(specs[k][1], specs[k][3], specs[k][4], specs[k][2]) for k in todo]
        n_workers = workers or os.cpu_count() or 1
        if n_workers > 1:
            from twin.fleet import worker_pool
            with worker_pool(n_workers) as pool:
                got = _measure(run_specs, inst.lengths, float(inst.duration_s), seeds,
                               float(inst.starvation_threshold), pool, quiet)
        else:
            got = _measure(run_specs, inst.lengths, float(inst.duration_s), seeds,
                           float(inst.starvation_threshold), None, quiet)
        new = {keys[k]: g for k, g in zip(todo, got)}
        _disk_write(new)
        disk.update(new)
    types = {t.name: t for t in inst.gpu_types}
    out = []
    for (tname, p, cap, a, r), key in zip(specs, keys):
        d = disk[key]
        pts = tuple((float(x), float(y)) for x, y in d["power_points"])
        icpt, slope = power_line(pts)
        out.append(GpuConfig(tname, p, profs[p].is_derived, cap, a, r,
                             types[tname].price_per_hour, float(d["capacity_tps"]),
                             tuple(d["per_seed_tps"]), icpt, slope, pts))
    return out


def power_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept W, slope W per tok/s) of the least-squares line through (load, power) points,
    slope at least 0, raised by the largest residual (no point lies above it)."""
    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    slope, icpt = np.polyfit(x, y, 1)
    slope = max(float(slope), 0.0)
    icpt = float(np.max(y - slope * x))
    return icpt, slope


def derived_note(inst) -> str | None:
    """One line naming the instance's GPU types that run on derived profiles (None if none)."""
    parts = []
    for t in inst.gpu_types:
        prof = load_profile(t.profile)
        if prof.is_derived:
            parts.append(f"{t.name} = {prof.label()}")
    return "derived profiles: " + "; ".join(parts) if parts else None


def config_table(configs: Sequence[GpuConfig]) -> str:
    """Text table of the index (for reports)."""
    head = (f"{'configuration':<28} {'derived':>7} {'$/h':>6} {'cap_tps':>8} "
            f"{'P(cap) W':>8} {'tok/$':>9} {'tok/J':>6}")
    lines = [head, "-" * len(head)]
    for c in configs:
        p = c.power_w(c.capacity_tps)
        per_dollar = c.capacity_tps * 3600 / c.price_per_hour if c.price_per_hour > 0 else np.inf
        lines.append(f"{c.label:<28} {('yes' if c.derived else 'no'):>7} "
                     f"{c.price_per_hour:>6.2f} {c.capacity_tps:>8.0f} {p:>8.0f} "
                     f"{per_dollar:>9.3g} {c.capacity_tps / p:>6.1f}")
    return "\n".join(lines)


__all__ = ["AMAX_GRID", "GpuConfig", "resolve_profile", "config_specs", "config_index",
           "derived_note", "config_table"]
