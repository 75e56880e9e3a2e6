"""Placement instance files: JSON schema, loading and validation, the ``Instance`` dataclass.

An instance says what must be served (adapters), with what (a pool of GPU types), under which
workload assumptions (request lengths, starvation threshold), what to optimise (objective), with
which solver limits, and how to verify (twin duration and seed). Schema (``schema_version`` 1)::

    {
      "schema_version": 1,                       # optional, must be 1
      "name": "paper-llama-r8-qlow-n256",        # required, non-empty string
      "description": "...",                      # optional string
      "adapters": [{"id": "a0", "rank": 8, "rate": 0.3}, ...]
                  | "adapters.csv",              # CSV (id,rank,rate) relative to this file
      "gpus": [{"name": "h100", "profile": "llama-3.1-8b-instruct",
                "count": 8, "price_per_hour": 2.5,
                "capacity_tps": 15000, "capacity_amax": 32}, ...],
                                                 # >= 1 type, unique names; capacity_* optional:
                                                 # constant capacity (sustained offered tok/s
                                                 # at a fixed Amax), both or neither
               | [{"name": "a100", "gpu": "A100-80GB", "model": "llama-3.1-8b-instruct",
                   "availability": 4, "price_per_hour": 1.3,
                   "power_caps_w": [250, 400]}, ...],
                                                 # a catalog GPU + base model instead of a
                                                 # profile (twin.derive.profile_for: the measured
                                                 # profile when shipped, else a derived one);
                                                 # "availability" = "count" (units available);
                                                 # power_caps_w: the caps a GPU of this type may
                                                 # run under (each a configuration, like Amax)
      "power_budget_w": 3000,                    # optional: sum of predicted average power
                                                 # over the GPUs used must stay below it
      "lengths": {"mean_input": 223.0, "mean_output": 196.3}   # ShareGPT-like, rescaled
                 | {"kind": "fixed" | "clipped_normal" | "empirical" | "sharegpt", ...},
                                                 # optional; default: twin default_lengths()
      "starvation_threshold": 0.9,               # optional, in (0, 1]
      "objective": "gpus" | {"kind": "gpus" | "cost" | "energy" | "latency",
                             "gpu_budget": 4},
                                                 # optional, default "gpus"; latency needs
                                                 # gpu_budget (int >= 1)
      "solver": {"time_limit_s": 60, "mip_gap": 0.0, "threads": 0,
                 "max_repair_iterations": 20},   # optional, all keys optional
      "duration_s": 3600,                        # optional, twin verification window (s),
                                                 # <= 604800 (a week) and <= 10M requests/GPU
      "seed": 0,                                 # optional, int in [0, 2^32-1]: workload +
                                                 # random methods
      "max_homes": 1,                            # optional, int in [1, GPUs of the pool]:
                                                 # most GPUs one adapter's traffic may be
                                                 # split over (routing weights); 1 = no split
      "slo": {"ttft_p99_ms": 500, "itl_p99_ms": 100, "ttft_mean_ms": 200,
              "e2e_p99_ms": 30000, "attainment": 0.99, "warmup_s": 60,
              "classes": {"premium": {"ttft_p99_ms": 200, "adapters": ["a0"]}}}
                                                 # optional latency SLO (twin.slo.Slo): >= 1
                                                 # bound (ms); every GPU must meet each one in
                                                 # the twin, besides the throughput rule;
                                                 # optional classes: their adapters' requests
                                                 # are held to the class's bounds instead
      "headroom": false,                         # optional: every GPU must also pass with the
                                                 # twin's measured headroom (twin.headroom);
                                                 # optim plan sets it unless --no-headroom
    }

Every GPU type's profile must serve the same base model (one fleet serves one base model).
A malformed file raises ``InstanceError`` whose message names the file, the field (a JSON path
such as ``gpus[1].count``) and the reason. Whether an instance can be served at all is a
separate question answered by ``optim.feasibility.precheck`` (a report, not an exception).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from twin.lengths import LengthModel
from twin.sharegpt import default_lengths, sharegpt_lengths
from twin.length_models import length_model_from_dict
from twin.cli_support import SEED_MAX
from twin.identifiers import identifier
from twin.limits import (MAX_ADAPTERS_PER_INSTANCE, MAX_DURATION_S, MAX_REQUESTS_PER_SERVER,
                         check_adapter_count)
from twin.profile import GpuProfile, load_profile
from twin.server import Judging
from twin.slo import Slo
from twin.workload import Adapter, load_adapters_csv

SCHEMA_VERSION = 1
OBJECTIVE_KINDS = ("gpus", "cost", "latency", "energy")
DEFAULT_THRESHOLD = 0.9
DEFAULT_DURATION_S = 3600.0

_TOP_KEYS = {"schema_version", "name", "description", "adapters", "gpus", "lengths",
             "starvation_threshold", "objective", "solver", "duration_s", "seed",
             "power_budget_w", "max_homes", "slo", "headroom"}
_GPU_KEYS = {"name", "profile", "count", "price_per_hour", "capacity_tps", "capacity_amax",
             "gpu", "model", "availability", "power_caps_w"}
_SOLVER_KEYS = {"time_limit_s", "mip_gap", "threads", "max_repair_iterations"}
_OBJECTIVE_KEYS = {"kind", "gpu_budget"}


class InstanceError(ValueError):
    """A malformed instance; the message names the source, the field and the reason."""

    def __init__(self, source: str, field_path: str, reason: str) -> None:
        self.source = source
        self.field = field_path
        self.reason = reason
        super().__init__(f"{source}: field '{field_path}': {reason}")


@dataclass(frozen=True)
class GpuType:
    """One GPU type of the pool: instance-local ``name``, twin ``profile`` (a shipped name or a
    profile file), how many are available (``count``, the availability cap) and the price per
    GPU-hour. A type given as a catalog ``gpu`` + base ``model`` keeps both (``profile`` is then
    the measured profile or the file of the derived one, ``optim.gpu_configs.resolve_profile``);
    ``power_caps_w`` lists the caps its GPUs may run under (empty: uncapped only)."""

    name: str
    profile: str
    count: int
    price_per_hour: float
    capacity_tps: float | None = None
    capacity_amax: int | None = None
    gpu: str | None = None
    model: str | None = None
    power_caps_w: tuple[float, ...] = ()

    @property
    def constant_capacity(self) -> bool:
        """True when the instance gives this type a constant capacity (``capacity_tps`` offered
        tok/s sustained at Amax ``capacity_amax``): placement is then classical bin packing."""
        return self.capacity_tps is not None

    def load_profile(self) -> GpuProfile:
        return load_profile(self.profile)


@dataclass(frozen=True)
class ObjectiveSpec:
    """What to optimise: ``kind`` in ``OBJECTIVE_KINDS``; ``gpu_budget`` for ``latency``."""

    kind: str = "gpus"
    gpu_budget: int | None = None


@dataclass(frozen=True)
class SolverLimits:
    """Limits for methods that search (exact solvers, repair loops); ``None`` = method default."""

    time_limit_s: float | None = None
    mip_gap: float | None = None
    threads: int | None = None
    max_repair_iterations: int | None = None


@dataclass(frozen=True)
class Instance:
    """A validated placement instance (see the module docstring for the file schema)."""

    name: str
    adapters: tuple[Adapter, ...]
    gpu_types: tuple[GpuType, ...]
    lengths: LengthModel
    lengths_spec: Mapping[str, Any] | None = None
    starvation_threshold: float = DEFAULT_THRESHOLD
    objective: ObjectiveSpec = field(default_factory=ObjectiveSpec)
    solver: SolverLimits = field(default_factory=SolverLimits)
    duration_s: float = DEFAULT_DURATION_S
    seed: int = 0
    description: str = ""
    source: str | None = None
    power_budget_w: float | None = None
    max_homes: int = 1
    slo: Slo | None = None
    headroom: bool = False

    @property
    def uses_configurations(self) -> bool:
        """True when placement needs the (type, cap, Amax) configuration index
        (``optim.gpu_configs``): a type named by catalog GPU + model or running a derived
        profile (no trained surrogates), power caps, a power budget or the energy objective.
        Other instances keep the surrogate-based methods."""
        return (self.power_budget_w is not None or self.objective.kind == "energy"
                or any(t.gpu is not None or t.power_caps_w or t.load_profile().is_derived
                       for t in self.gpu_types))

    @property
    def judging(self) -> Judging:
        """How the twin judges this instance's GPUs: its threshold, SLO and headroom."""
        return Judging(self.starvation_threshold, self.slo, self.headroom)

    @property
    def mean_tokens(self) -> float:
        """Mean input + output tokens per request (offered tokens per request)."""
        return self.lengths.mean_input + self.lengths.mean_output

    def bound_view(self) -> "Instance":
        """This instance judged by the loosest plain SLO its adapters' classes allow
        (``twin.slo.Slo.loosest``): a GPU that meets its classes' bounds meets that one, so a
        lower bound, a carry limit or an exclusion measured under it stays sound — also on the
        synthetic adapters (of no class) those checks replay. Judged by the plain throughput
        rule, without the measured headroom (``headroom``), which only rejects more. Itself
        without SLO classes or headroom."""
        out = replace(self, headroom=False) if self.headroom else self
        if out.slo is None or not out.slo.classes:
            return out
        return replace(out, slo=out.slo.loosest([a.id for a in out.adapters]))

    def load_tps(self, adapter: Adapter) -> float:
        """Offered token rate of one adapter: rate x (mean input + mean output)."""
        return adapter.rate * self.mean_tokens

    @property
    def total_load_tps(self) -> float:
        return sum(a.rate for a in self.adapters) * self.mean_tokens

    @property
    def total_gpus_available(self) -> int:
        return sum(t.count for t in self.gpu_types)

    def gpu_type(self, name: str) -> GpuType:
        for t in self.gpu_types:
            if t.name == name:
                return t
        raise KeyError(f"instance '{self.name}': no GPU type named '{name}'")

    def to_dict(self, adapters_csv: str | None = None) -> dict[str, Any]:
        """JSON form; adapters inline unless ``adapters_csv`` (a path string) is given."""
        obj: Any = (self.objective.kind if self.objective.gpu_budget is None else
                    {"kind": self.objective.kind, "gpu_budget": self.objective.gpu_budget})
        solver = {k: v for k, v in vars(self.solver).items() if v is not None}
        d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": self.name}
        if self.description:
            d["description"] = self.description
        d["adapters"] = adapters_csv if adapters_csv is not None else [
            {"id": a.id, "rank": a.rank, "rate": a.rate} for a in self.adapters]
        d["gpus"] = [{"name": t.name,
                      **({"profile": t.profile} if t.gpu is None
                         else {"gpu": t.gpu, "model": t.model}),
                      "count": t.count, "price_per_hour": t.price_per_hour,
                      **({"capacity_tps": t.capacity_tps, "capacity_amax": t.capacity_amax}
                         if t.constant_capacity else {}),
                      **({"power_caps_w": list(t.power_caps_w)} if t.power_caps_w else {})}
                     for t in self.gpu_types]
        d["lengths"] = dict(self.lengths_spec) if self.lengths_spec is not None \
            else self.lengths.to_dict()
        d["starvation_threshold"] = self.starvation_threshold
        d["objective"] = obj
        if solver:
            d["solver"] = solver
        if self.power_budget_w is not None:
            d["power_budget_w"] = self.power_budget_w
        d["duration_s"] = self.duration_s
        d["seed"] = self.seed
        if self.max_homes != 1:
            d["max_homes"] = self.max_homes
        if self.slo is not None:
            d["slo"] = self.slo.to_dict()
        if self.headroom:
            d["headroom"] = True
        return d


# --------------------------------------------------------------------------- field checks


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(src: str, path: str, v: Any, minimum: int) -> int:
    if not _is_int(v):
        raise InstanceError(src, path, f"must be an integer, got {v!r}")
    if v < minimum:
        raise InstanceError(src, path, f"must be >= {minimum}, got {v}")
    return int(v)


def _num(src: str, path: str, v: Any, *, lo: float | None = None, lo_open: bool = False,
         hi: float | None = None) -> float:
    if not _is_num(v):
        raise InstanceError(src, path, f"must be a finite number, got {v!r}")
    v = float(v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise InstanceError(src, path, f"must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
    if hi is not None and v > hi:
        raise InstanceError(src, path, f"must be <= {hi:g}, got {v:g}")
    return v


def _str(src: str, path: str, v: Any, what: str = "name") -> str:
    """A non-empty name, NFC-normalised, without control or format characters
    (``twin.identifiers``: it is printed into tables, plans and deployment files)."""
    if not isinstance(v, str) or not v.strip():
        raise InstanceError(src, path, f"must be a non-empty string, got {v!r}")
    try:
        return identifier(v, what)
    except ValueError as e:
        raise InstanceError(src, path, str(e)) from None


def _unknown(src: str, path: str, d: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        where = f"{path}.{extra[0]}" if path else extra[0]
        raise InstanceError(src, where, f"unknown field (allowed: {sorted(allowed)})")


def _missing(src: str, path: str, d: Mapping[str, Any], required: Sequence[str]) -> None:
    for k in required:
        if k not in d:
            raise InstanceError(src, f"{path}.{k}" if path else k, "missing")


def _adapters(src: str, v: Any, base_dir: Path | None) -> tuple[Adapter, ...]:
    if isinstance(v, str):
        if not v.strip():
            raise InstanceError(src, "adapters", "CSV path must be a non-empty string")
        p = Path(v)
        if not p.is_absolute():
            p = (base_dir or Path.cwd()) / p
        if not p.is_file():
            raise InstanceError(src, "adapters", f"CSV file not found: {p}")
        try:
            out = tuple(load_adapters_csv(p))
        except ValueError as e:
            raise InstanceError(src, "adapters", str(e)) from None
        if not out:
            raise InstanceError(src, "adapters", f"CSV file {p} holds no adapters")
        return out
    if not isinstance(v, list):
        raise InstanceError(src, "adapters",
                            f"must be a list of {{id, rank, rate}} or a CSV path, got {type(v).__name__}")
    if not v:
        raise InstanceError(src, "adapters", "must not be empty")
    try:
        check_adapter_count(len(v), "list")      # refused by count before any is built
    except ValueError as e:
        raise InstanceError(src, "adapters", str(e)) from None
    out_l: list[Adapter] = []
    seen: dict[str, int] = {}
    for i, a in enumerate(v):
        path = f"adapters[{i}]"
        if not isinstance(a, dict):
            raise InstanceError(src, path, f"must be an object {{id, rank, rate}}, got {a!r}")
        _unknown(src, path, a, {"id", "rank", "rate"})
        _missing(src, path, a, ("id", "rank", "rate"))
        aid = _str(src, f"{path}.id", a["id"], "adapter id")
        rank = _int(src, f"{path}.rank", a["rank"], 1)
        rate = _num(src, f"{path}.rate", a["rate"], lo=0.0, lo_open=True)
        if aid in seen:
            raise InstanceError(src, f"{path}.id", f"duplicate adapter id '{aid}' "
                                                   f"(first at adapters[{seen[aid]}])")
        seen[aid] = i
        out_l.append(Adapter(aid, rank, rate))
    return tuple(out_l)


def _gpu_types(src: str, v: Any) -> tuple[GpuType, ...]:
    if not isinstance(v, list) or not v:
        raise InstanceError(src, "gpus", "must be a non-empty list of GPU types "
                                         "{name, profile, count, price_per_hour}")
    out: list[GpuType] = []
    models: dict[str, str] = {}
    for i, g in enumerate(v):
        path = f"gpus[{i}]"
        if not isinstance(g, dict):
            raise InstanceError(src, path, f"must be an object, got {g!r}")
        _unknown(src, path, g, _GPU_KEYS)
        _missing(src, path, g, ("name",))
        name = _str(src, f"{path}.name", g["name"], "GPU type name")
        if any(t.name == name for t in out):
            raise InstanceError(src, f"{path}.name", f"duplicate GPU type name '{name}'")
        prof_name, prof, gpu_id, model_id = _type_profile(src, path, g)
        if ("count" in g) == ("availability" in g):
            raise InstanceError(src, f"{path}.count", "give exactly one of 'count' and "
                                "'availability' (the units of this type available)")
        key = "count" if "count" in g else "availability"
        count = _int(src, f"{path}.{key}", g[key], 1)
        caps = _power_caps(src, f"{path}.power_caps_w", g.get("power_caps_w"), prof)
        price = _num(src, f"{path}.price_per_hour", g.get("price_per_hour", 1.0), lo=0.0)
        cap_tps = cap_amax = None
        if ("capacity_tps" in g) != ("capacity_amax" in g):
            missing = "capacity_amax" if "capacity_tps" in g else "capacity_tps"
            raise InstanceError(src, f"{path}.{missing}", "missing (a constant capacity needs "
                                "both capacity_tps and capacity_amax)")
        if "capacity_tps" in g:
            cap_tps = _num(src, f"{path}.capacity_tps", g["capacity_tps"], lo=0.0, lo_open=True)
            cap_amax = _int(src, f"{path}.capacity_amax", g["capacity_amax"], 1)
            if not any(prof.kv_tokens(cap_amax, r) for r in prof.supported_ranks):
                raise InstanceError(src, f"{path}.capacity_amax",
                                    f"no configuration with Amax {cap_amax} starts on profile "
                                    f"'{prof_name}' (no KV-capacity entry at any rank)")
        if caps and cap_tps is not None:
            raise InstanceError(src, f"{path}.power_caps_w", "a constant-capacity type "
                                "(capacity_tps) cannot list power caps")
        models[name] = prof.model
        out.append(GpuType(name, prof_name, count, price, cap_tps, cap_amax, gpu_id, model_id,
                           caps))
    if len(set(models.values())) > 1:
        raise InstanceError(src, "gpus", "all GPU types must serve the same base model, got "
                            + ", ".join(f"{k}: {m}" for k, m in models.items()))
    return tuple(out)


def _type_profile(src: str, path: str, g: Mapping[str, Any]
                  ) -> tuple[str, GpuProfile, str | None, str | None]:
    """(profile string, profile, catalog GPU id, model id) of one GPU type: a ``profile``, or a
    catalog ``gpu`` + base ``model`` (measured profile when shipped, else derived)."""
    has_gpu = "gpu" in g or "model" in g
    if has_gpu == ("profile" in g):
        raise InstanceError(src, f"{path}.profile", "give either 'profile' or both 'gpu' (a "
                            "catalog GPU id) and 'model' (a base-model id)")
    if not has_gpu:
        prof_name = _str(src, f"{path}.profile", g["profile"])
        try:
            return prof_name, load_profile(prof_name), None, None
        except (OSError, ValueError) as e:
            raise InstanceError(src, f"{path}.profile", f"cannot load profile '{prof_name}' "
                                                        f"({e})") from None
    _missing(src, path, g, ("gpu", "model"))
    gpu_id = _str(src, f"{path}.gpu", g["gpu"])
    model_id = _str(src, f"{path}.model", g["model"])
    from twin.gpu_catalog import CatalogError, gpu_ids
    from twin.model_configs import ModelConfigError, model_config
    if gpu_id not in gpu_ids():
        raise InstanceError(src, f"{path}.gpu", f"unknown GPU {gpu_id!r} (catalog: "
                                                f"{', '.join(gpu_ids())})")
    try:
        model_config(model_id)
    except ModelConfigError as e:
        raise InstanceError(src, f"{path}.model", str(e)) from None
    from .gpu_configs import resolve_profile
    try:
        prof_name = resolve_profile(gpu_id, model_id)
        return prof_name, load_profile(prof_name), gpu_id, model_id
    except (OSError, ValueError, CatalogError) as e:
        raise InstanceError(src, f"{path}.gpu", f"no profile for {model_id} on {gpu_id} "
                                                f"({e})") from None


def _power_caps(src: str, path: str, v: Any, prof: GpuProfile) -> tuple[float, ...]:
    """Validated caps (W): finite, above the GPU's idle power, at most its maximum, unique."""
    if v is None:
        return ()
    if not isinstance(v, list) or not v:
        raise InstanceError(src, path, f"must be a non-empty list of watts, got {v!r}")
    from twin.power import power_model_for
    pm = power_model_for(prof)
    if pm is None:
        raise InstanceError(src, path, f"profile '{prof.name}' has no power model (GPU "
                                       f"{prof.gpu!r} is not in the catalog)")
    caps = []
    for i, c in enumerate(v):
        c = _num(src, f"{path}[{i}]", c, lo=pm.idle_w, lo_open=True, hi=pm.max_w)
        if c in caps:
            raise InstanceError(src, f"{path}[{i}]", f"duplicate cap {c:g} W")
        caps.append(c)
    return tuple(sorted(caps))


def _lengths(src: str, v: Any) -> tuple[LengthModel, Mapping[str, Any] | None]:
    if v is None:
        return default_lengths(), None
    if not isinstance(v, dict):
        raise InstanceError(src, "lengths", "must be {mean_input, mean_output} or a length-model "
                                            f"object with 'kind', got {v!r}")
    if "kind" not in v:
        _unknown(src, "lengths", v, {"mean_input", "mean_output"})
        for k in ("mean_input", "mean_output"):
            if k not in v:
                raise InstanceError(src, f"lengths.{k}", "missing")
        mi = _num(src, "lengths.mean_input", v["mean_input"], lo=1.0)
        mo = _num(src, "lengths.mean_output", v["mean_output"], lo=1.0)
        try:
            return sharegpt_lengths(mi, mo), dict(v)
        except ValueError as e:
            raise InstanceError(src, "lengths", str(e)) from None
    try:
        return length_model_from_dict(dict(v)), dict(v)
    except (ValueError, TypeError) as e:
        raise InstanceError(src, "lengths", str(e)) from None


def _objective(src: str, v: Any, n_gpus: int) -> ObjectiveSpec:
    if v is None:
        return ObjectiveSpec()
    if isinstance(v, str):
        v = {"kind": v}
    if not isinstance(v, dict):
        raise InstanceError(src, "objective", f"must be one of {list(OBJECTIVE_KINDS)} or an "
                                              f"object with 'kind', got {v!r}")
    _unknown(src, "objective", v, _OBJECTIVE_KEYS)
    kind = v.get("kind")
    if kind not in OBJECTIVE_KINDS:
        raise InstanceError(src, "objective.kind", f"must be one of {list(OBJECTIVE_KINDS)}, "
                                                   f"got {kind!r}")
    budget = v.get("gpu_budget")
    if budget is not None:
        budget = _int(src, "objective.gpu_budget", budget, 1)
        if budget > n_gpus:
            raise InstanceError(src, "objective.gpu_budget",
                                f"{budget} exceeds the {n_gpus} GPUs of the pool")
    if kind == "latency" and budget is None:
        raise InstanceError(src, "objective.gpu_budget", "missing (required by 'latency')")
    return ObjectiveSpec(kind, budget)


def _solver(src: str, v: Any) -> SolverLimits:
    if v is None:
        return SolverLimits()
    if not isinstance(v, dict):
        raise InstanceError(src, "solver", f"must be an object, got {v!r}")
    _unknown(src, "solver", v, _SOLVER_KEYS)
    tl = v.get("time_limit_s")
    gap = v.get("mip_gap")
    th = v.get("threads")
    it = v.get("max_repair_iterations")
    return SolverLimits(
        time_limit_s=None if tl is None else _num(src, "solver.time_limit_s", tl, lo=0.0, lo_open=True),
        mip_gap=None if gap is None else _num(src, "solver.mip_gap", gap, lo=0.0, hi=1.0),
        threads=None if th is None else _int(src, "solver.threads", th, 0),
        max_repair_iterations=None if it is None else _int(src, "solver.max_repair_iterations", it, 0),
    )


def instance_from_dict(d: Any, source: str = "<instance>", base_dir: str | os.PathLike | None = None
                       ) -> Instance:
    """Validate an instance dict (the parsed JSON); CSV paths resolve against ``base_dir``."""
    src = source
    if not isinstance(d, dict):
        raise InstanceError(src, "$", f"the instance must be a JSON object, got {type(d).__name__}")
    _unknown(src, "", d, _TOP_KEYS)
    sv = d.get("schema_version", SCHEMA_VERSION)
    if sv != SCHEMA_VERSION:
        raise InstanceError(src, "schema_version", f"unsupported version {sv!r} "
                                                   f"(expected {SCHEMA_VERSION})")
    _missing(src, "", d, ("name", "adapters", "gpus"))
    name = _str(src, "name", d["name"])
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise InstanceError(src, "description", f"must be a string, got {desc!r}")
    gpu_types = _gpu_types(src, d["gpus"])
    adapters = _adapters(src, d["adapters"], Path(base_dir) if base_dir is not None else None)
    lengths, spec = _lengths(src, d.get("lengths"))
    thr = _num(src, "starvation_threshold", d.get("starvation_threshold", DEFAULT_THRESHOLD),
               lo=0.0, lo_open=True, hi=1.0)
    objective = _objective(src, d.get("objective"), sum(t.count for t in gpu_types))
    solver = _solver(src, d.get("solver"))
    dur = _num(src, "duration_s", d.get("duration_s", DEFAULT_DURATION_S), lo=0.0, lo_open=True)
    try:
        check_twin_window(adapters, sum(t.count for t in gpu_types), dur)
    except ValueError as e:
        raise InstanceError(src, "duration_s", str(e)) from None
    seed = _int(src, "seed", d.get("seed", 0), 0)
    if seed > SEED_MAX:
        raise InstanceError(src, "seed", f"must be <= {SEED_MAX}, got {seed}")
    budget_w = d.get("power_budget_w")
    if budget_w is not None:
        budget_w = _num(src, "power_budget_w", budget_w, lo=0.0, lo_open=True)
    if objective.kind == "latency" and (budget_w is not None or any(
            t.gpu is not None or t.power_caps_w for t in gpu_types)):
        raise InstanceError(src, "objective.kind", "'latency' is not supported with catalog GPU "
                            "types, power caps or a power budget (use gpus, cost or energy)")
    if (objective.kind == "energy" or budget_w is not None) and any(
            t.constant_capacity for t in gpu_types):
        raise InstanceError(src, "gpus", "energy and power budgets need twin-measured "
                            "configurations; remove capacity_tps/capacity_amax")
    homes = check_max_homes(d.get("max_homes", 1), sum(t.count for t in gpu_types), src)
    slo = _slo(src, d.get("slo"), dur, {a.id for a in adapters})
    headroom = d.get("headroom", False)
    if not isinstance(headroom, bool):
        raise InstanceError(src, "headroom", f"must be true or false, got {headroom!r}")
    return Instance(name=name, adapters=adapters, gpu_types=gpu_types, lengths=lengths,
                    lengths_spec=spec, starvation_threshold=thr, objective=objective,
                    solver=solver, duration_s=dur, seed=seed, description=desc, source=source,
                    power_budget_w=budget_w, max_homes=homes, slo=slo, headroom=headroom)


def _slo(src: str, v: Any, duration_s: float, adapter_ids: set[str]) -> Slo | None:
    """The instance's latency SLO (``twin.slo.Slo``), or None; its warm-up must leave part of
    the twin window to judge, and its classes name adapters of the instance."""
    if v is None:
        return None
    try:
        slo = Slo.from_dict(v, "slo")
    except ValueError as e:
        path, _, reason = str(e).partition(": ")
        raise InstanceError(src, path, reason) from None
    if slo.warmup_s >= duration_s:
        raise InstanceError(src, "slo.warmup_s", f"{slo.warmup_s:g} s leaves nothing of the "
                            f"{duration_s:g} s twin window (duration_s) to judge")
    for c in slo.classes:
        unknown = [i for i in c.adapters if i not in adapter_ids]
        if unknown:
            raise InstanceError(src, f"slo.classes.{c.name}.adapters",
                                f"{len(unknown)} id(s) name no adapter of the instance: "
                                f"{', '.join(map(repr, unknown[:5]))}"
                                + (" ..." if len(unknown) > 5 else ""))
    return slo


def check_max_homes(v: Any, pool: int, source: str = "<instance>",
                    field_path: str = "max_homes") -> int:
    """A valid ``max_homes`` (int in [1, GPUs of the pool]: one adapter cannot have more homes
    than there are GPUs); ``InstanceError`` naming ``field_path`` otherwise."""
    k = _int(source, field_path, v, 1)
    if k > pool:
        raise InstanceError(source, field_path, f"{k} exceeds the {pool} GPU(s) of the pool")
    return k


def check_twin_window(adapters: Sequence[Adapter], n_gpus: int, duration_s: float) -> None:
    """Refuse a verification window the twin cannot hold in memory: longer than
    ``twin.limits.MAX_DURATION_S``, or more expected requests than the per-server limit times
    the GPUs of the pool (``ValueError`` with the value, the limit and the reason)."""
    if duration_s > MAX_DURATION_S:
        raise ValueError(f"{duration_s:g} s exceeds the twin's limit of {MAX_DURATION_S:g} s "
                         "(a week of simulated time)")
    rate = sum(a.rate for a in adapters)
    expected = rate * duration_s
    if expected > MAX_REQUESTS_PER_SERVER * n_gpus:
        raise ValueError(f"{duration_s:g} s at {rate:g} req/s is about {expected:,.0f} requests, "
                         f"more than the twin's limit of {MAX_REQUESTS_PER_SERVER:,} per GPU x "
                         f"{n_gpus} GPUs (each request is held in memory); shorten the window")


def load_instance(path: str | os.PathLike) -> Instance:
    """Read and validate an instance JSON file (``InstanceError`` names the field on failure)."""
    p = Path(path)
    src = str(p)
    if p.is_dir():
        raise InstanceError(src, "$", "is a directory, not an instance JSON file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InstanceError(src, "$", f"cannot read file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise InstanceError(src, "$", f"not a text (UTF-8 JSON) file: byte {e.start} "
                                      f"is {e.object[e.start:e.start + 1]!r}") from None
    n_ids = text.count('"id"')          # an upper bound of the inline adapters, before parsing
    if n_ids > MAX_ADAPTERS_PER_INSTANCE:
        raise InstanceError(src, "adapters", f"about {n_ids:,} adapters (\"id\" fields) exceed "
                            f"the limit of {MAX_ADAPTERS_PER_INSTANCE:,} per instance; not parsed")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise InstanceError(src, "$", f"invalid JSON ({e})") from None
    return instance_from_dict(d, source=src, base_dir=p.parent)


def write_instance(inst: Instance, path: str | os.PathLike, adapters_csv: bool = False) -> list[Path]:
    """Write ``inst`` as JSON (and its adapters as ``<stem>.adapters.csv`` when ``adapters_csv``);
    returns the files written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    written = [p]
    csv_name = None
    if adapters_csv:
        csv_path = p.with_name(p.stem + ".adapters.csv")
        with open(csv_path, "w", encoding="utf-8") as fh:
            fh.write("id,rank,rate\n")
            for a in inst.adapters:
                fh.write(f"{a.id},{a.rank},{a.rate!r}\n")
        csv_name = csv_path.name
        written.append(csv_path)
    p.write_text(json.dumps(inst.to_dict(csv_name), indent=1) + "\n", encoding="utf-8")
    return written


def adapters_by_id(adapters: Sequence[Adapter]) -> dict[str, Adapter]:
    return {a.id: a for a in adapters}
