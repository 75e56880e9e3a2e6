"""Calibrated constants of one GPU type x base model (a ``GpuProfile``), with JSON I/O.

A profile holds everything the twin needs that depends on the hardware and the base model:
the KV-capacity table (which (max_loras, max_lora_rank) configurations start and how many KV
tokens they leave), the step-time coefficients (see ``twin.step_time``), and the CPU->GPU
adapter load times. Profiles are produced by ``twin.calibrate`` and stored as JSON in
``twin/profiles/<name>.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .step_time import N_STEP_COEF, STEP_COEF_NAMES

SCHEMA_VERSION = 1
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"

_REQUIRED = (
    "name", "gpu", "model", "block_size", "max_num_batched_tokens", "max_num_seqs",
    "max_model_len", "kv_capacity", "supported_ranks", "step_coef", "load_ms",
    "backbone_kv_tokens",
)
_OPTIONAL = ("fit_report", "source")
# optional mappings written only when non-empty, so a measured profile's JSON (and every hash
# of it) is unchanged: ``derived_from`` marks a derived profile (twin.derive), ``power`` holds
# its power model (twin.power); ``serving`` (not simulated) names the served model id and the
# vLLM settings the profile was calibrated with, for deployment files (optim.deploy)
_OPTIONAL_IF_SET = ("derived_from", "power", "serving")
# keys of ``serving``: model_id (required), and the calibration's server settings that the
# profile's simulated fields (max_num_batched_tokens, max_num_seqs, max_model_len) do not hold
SERVING_KEYS = {"model_id": str, "gpu_memory_utilization": float, "enable_chunked_prefill": bool,
                "enable_prefix_caching": bool, "dtype": str, "engine": str,
                "vllm_version": str, "source": str}
_ALLOWED = (set(_REQUIRED) | set(_OPTIONAL) | set(_OPTIONAL_IF_SET)
            | {"schema_version", "step_coef_names"})


class ProfileError(ValueError):
    """A profile is malformed; the message names the profile, the field and the reason."""


@dataclass(frozen=True)
class GpuProfile:
    """Calibrated constants of one GPU type serving one base model with vLLM 0.8.5 (V1).

    ``kv_capacity`` maps (max_loras, max_lora_rank) to KV-cache tokens, only for configurations
    that start (a missing entry is a start-up memory error). ``load_ms`` maps
    (adapter_rank, max_lora_rank) to the mean CPU->GPU adapter load time in ms.
    ``step_coef`` are the coefficients of ``twin.step_time.step_time_ms``.
    """

    name: str
    gpu: str
    model: str
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    kv_capacity: dict[tuple[int, int], int]
    supported_ranks: tuple[int, ...]
    step_coef: tuple[float, ...]
    load_ms: dict[tuple[int, int], float]
    backbone_kv_tokens: int
    fit_report: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    derived_from: dict = field(default_factory=dict)
    power: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # validate by round-tripping through the dict validator (raises ProfileError)
        _validate(self.to_dict(include_serving=True))

    # ------------------------------------------------------------------ queries
    @property
    def is_derived(self) -> bool:
        """True for a profile derived from public facts (``twin.derive``), not measured."""
        return bool(self.derived_from)

    def label(self) -> str:
        """Name for reports: says "derived profile (from ...)" when the profile is derived."""
        if not self.derived_from:
            return self.name
        return f"{self.name} [derived profile (from {self.derived_from.get('profile', '?')})]"

    def max_startable_amax(self, rank: int) -> int:
        """Largest Amax with a KV-capacity entry at ``rank`` (0 when no configuration starts)."""
        slots = [a for (a, r) in self.kv_capacity if r == rank]
        return max(slots) if slots else 0

    def kv_tokens(self, max_loras: int, max_lora_rank: int) -> int | None:
        """KV-cache tokens of a configuration, or None when the server would not start.

        ``max_loras == 0`` means LoRA disabled: the backbone capacity. A measured
        (max_loras, rank) pair returns its value. A max_loras between two measured grid points
        of the same rank returns the value of the next larger measured max_loras (conservative:
        capacity decreases with slots) when that configuration starts, else None. A rank that is
        not in the table, or a max_loras above every measured one, returns None.
        """
        max_loras = int(max_loras)
        max_lora_rank = int(max_lora_rank)
        if max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {max_loras}")
        if max_loras == 0:
            return self.backbone_kv_tokens
        key = (max_loras, max_lora_rank)
        if key in self.kv_capacity:
            return self.kv_capacity[key]
        larger = sorted(a for (a, r) in self.kv_capacity if r == max_lora_rank and a > max_loras)
        if not larger:
            return None
        # only starting configurations are stored and capacity falls with max_loras, so the
        # next stored grid point is the next larger measured one that starts
        return self.kv_capacity[(larger[0], max_lora_rank)]

    def load_time_ms(self, adapter_rank: int, max_lora_rank: int) -> float:
        """Mean CPU->GPU load time (ms) of an adapter of ``adapter_rank`` into slots of
        ``max_lora_rank``.

        Measured pairs are returned as is. Otherwise the measured pair with the same adapter
        rank and the nearest slot rank is used (ties: the larger slot rank), else the nearest
        adapter rank. Both ranks must be in ``supported_ranks`` and adapter_rank <= max_lora_rank.
        """
        a, m = int(adapter_rank), int(max_lora_rank)
        for nm, v in (("adapter_rank", a), ("max_lora_rank", m)):
            if v not in self.supported_ranks:
                raise ValueError(
                    f"profile {self.name!r}: {nm}={v} not in supported_ranks {self.supported_ranks}")
        if a > m:
            raise ValueError(f"adapter_rank {a} exceeds max_lora_rank {m}")
        if (a, m) in self.load_ms:
            return self.load_ms[(a, m)]
        keys = list(self.load_ms)
        # nearest in (same adapter rank first, then |log2 slot diff|, larger slot on ties)
        def dist(k: tuple[int, int]) -> tuple[float, float, int]:
            return (abs(math.log2(k[0]) - math.log2(a)), abs(math.log2(k[1]) - math.log2(m)), -k[1])
        return self.load_ms[min(keys, key=dist)]

    def step_coef_array(self) -> np.ndarray:
        """Step-time coefficients as a contiguous float64 array (for the numba kernel)."""
        return np.ascontiguousarray(self.step_coef, dtype=np.float64)

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self, include_serving: bool = False) -> dict[str, Any]:
        """JSON-ready dict (tuple keys become "a,r" strings). ``serving`` (deployment facts, not
        simulated) only with ``include_serving`` — ``to_json`` writes it — so that every cache
        and hash keyed by a profile's dict (carry limits, capacity tables, surrogates) stays the
        same with or without it."""
        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "gpu": self.gpu,
            "model": self.model,
            "block_size": self.block_size,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "kv_capacity": {f"{a},{r}": v for (a, r), v in sorted(self.kv_capacity.items())},
            "supported_ranks": list(self.supported_ranks),
            "step_coef": list(self.step_coef),
            "step_coef_names": list(STEP_COEF_NAMES),
            "load_ms": {f"{a},{r}": v for (a, r), v in sorted(self.load_ms.items())},
            "backbone_kv_tokens": self.backbone_kv_tokens,
            "fit_report": self.fit_report,
            "source": self.source,
            **{k: getattr(self, k) for k in _OPTIONAL_IF_SET
               if getattr(self, k) and (include_serving or k != "serving")},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GpuProfile":
        """Validate a dict (as written by ``to_dict``) and build the profile."""
        kw = _validate(d)
        return cls(**kw)

    def to_json(self, path: str | Path) -> None:
        """Write the profile as indented JSON."""
        Path(path).write_text(json.dumps(self.to_dict(include_serving=True), indent=1,
                                         sort_keys=False) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "GpuProfile":
        """Read and validate a profile JSON file."""
        p = Path(path)
        if p.is_dir():
            raise ProfileError(f"profile file {str(p)!r}: is a directory, not a profile JSON file")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ProfileError(f"profile file {str(p)!r}: invalid JSON: {e}") from None
        except UnicodeDecodeError:
            raise ProfileError(f"profile file {str(p)!r}: not a text (UTF-8 JSON) file") from None
        except OSError as e:
            raise ProfileError(f"profile file {str(p)!r}: cannot read ({e.strerror})") from None
        try:
            return cls.from_dict(d)
        except ProfileError as e:
            raise ProfileError(f"profile file {str(p)!r}: {e}") from None


def available_profiles() -> list[str]:
    """Names of the GPU profiles shipped in ``twin/profiles`` (JSON files with a step_coef)."""
    out = []
    for p in PROFILES_DIR.glob("*.json"):
        try:
            if "step_coef" in json.loads(p.read_text()):
                out.append(p.stem)
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(out)


_LOADED: dict[tuple[str, int, int], GpuProfile] = {}


def load_profile(name_or_path: str | Path) -> GpuProfile:
    """Load a profile by bare name (``twin/profiles/<name>.json``) or by file path. Parsed
    profiles are cached per file and reparsed when the file changes (placement methods look a
    profile up per adapter and per GPU)."""
    s = str(name_or_path)
    p = Path(s)
    if p.suffix == ".json" or p.exists() or "/" in s:
        if not p.exists():
            raise FileNotFoundError(f"profile file not found: {s}")
        if p.is_dir():
            raise ProfileError(f"profile {s!r}: is a directory; give a profile JSON file or one "
                               f"of: {', '.join(available_profiles())}")
        return _from_file(p)
    cand = PROFILES_DIR / f"{s}.json"
    if not cand.exists():
        raise FileNotFoundError(
            f"unknown profile {s!r}; available: {', '.join(available_profiles()) or '(none)'}")
    return _from_file(cand)


def _from_file(p: Path) -> GpuProfile:
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _LOADED:
        _LOADED[key] = GpuProfile.from_json(p)
    return _LOADED[key]


# ---------------------------------------------------------------------------- validation
def _err(name: str, fld: str, reason: str) -> ProfileError:
    return ProfileError(f"profile {name!r}: field {fld!r}: {reason}")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def _pos_int(name: str, fld: str, v: Any, allow_zero: bool = False) -> int:
    if not _is_int(v) or (v < 0 if allow_zero else v <= 0):
        what = "a non-negative integer" if allow_zero else "a positive integer"
        raise _err(name, fld, f"must be {what}, got {v!r}")
    return int(v)


def _pair_key(name: str, fld: str, k: Any) -> tuple[int, int]:
    if isinstance(k, tuple):
        parts = list(k)
    elif isinstance(k, str):
        parts = k.split(",")
    else:
        raise _err(name, fld, f"key {k!r} must be 'a,b' or a tuple of two integers")
    try:
        if len(parts) != 2:
            raise ValueError
        a, b = (int(str(x).strip()) for x in parts)
    except ValueError:
        raise _err(name, fld, f"key {k!r} must be two integers 'a,b'") from None
    return a, b


def _validate(d: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise ProfileError(f"profile must be a mapping, got {type(d).__name__}")
    name = d.get("name", "?")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"profile {name!r}: field 'name': must be a non-empty string")
    unknown = sorted(set(d) - _ALLOWED)
    if unknown:
        raise _err(name, unknown[0], f"unknown key (allowed: {', '.join(sorted(_ALLOWED))})")
    for k in _REQUIRED:
        if k not in d:
            raise _err(name, k, "missing")
    sv = d.get("schema_version", SCHEMA_VERSION)
    if sv != SCHEMA_VERSION:
        raise _err(name, "schema_version", f"unsupported version {sv!r} (expected {SCHEMA_VERSION})")
    for k in ("gpu", "model"):
        if not isinstance(d[k], str) or not d[k]:
            raise _err(name, k, f"must be a non-empty string, got {d[k]!r}")
    out: dict[str, Any] = {"name": name, "gpu": d["gpu"], "model": d["model"]}
    for k in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
              "backbone_kv_tokens"):
        out[k] = _pos_int(name, k, d[k])
    if out["backbone_kv_tokens"] < out["max_model_len"]:
        raise _err(name, "backbone_kv_tokens",
                   f"{out['backbone_kv_tokens']} < max_model_len {out['max_model_len']}")

    sr = d["supported_ranks"]
    if not isinstance(sr, (list, tuple)) or not sr:
        raise _err(name, "supported_ranks", f"must be a non-empty list of integers, got {sr!r}")
    ranks = tuple(_pos_int(name, f"supported_ranks[{i}]", r) for i, r in enumerate(sr))
    if list(ranks) != sorted(set(ranks)):
        raise _err(name, "supported_ranks", f"must be strictly increasing, got {list(ranks)}")
    out["supported_ranks"] = ranks

    sc = d["step_coef"]
    if not isinstance(sc, (list, tuple, np.ndarray)):
        raise _err(name, "step_coef", f"must be a list of {N_STEP_COEF} numbers")
    if len(sc) != N_STEP_COEF:
        raise _err(name, "step_coef", f"must have length {N_STEP_COEF}, got {len(sc)}")
    coef = []
    for i, v in enumerate(sc):
        if not _is_num(v) or float(v) < 0:
            raise _err(name, f"step_coef[{i}]",
                       f"must be a finite non-negative number, got {v!r}")
        coef.append(float(v))
    out["step_coef"] = tuple(coef)
    names = d.get("step_coef_names")
    if names is not None and list(names) != list(STEP_COEF_NAMES):
        raise _err(name, "step_coef_names",
                   f"do not match this code's step model {list(STEP_COEF_NAMES)}")

    kv = d["kv_capacity"]
    if not isinstance(kv, Mapping):
        raise _err(name, "kv_capacity", "must be a mapping 'max_loras,rank' -> tokens")
    kvc: dict[tuple[int, int], int] = {}
    for k, v in kv.items():
        a, r = _pair_key(name, "kv_capacity", k)
        fld = f"kv_capacity[{a},{r}]"
        if a <= 0:
            raise _err(name, fld, f"max_loras must be positive, got {a}")
        if r not in ranks:
            raise _err(name, fld, f"rank {r} not in supported_ranks {list(ranks)}")
        v = _pos_int(name, fld, v)
        if v < out["max_model_len"]:
            raise _err(name, fld, f"{v} < max_model_len {out['max_model_len']} (would not start)")
        kvc[(a, r)] = v
    for r in ranks:
        row = sorted((a, v) for (a, rr), v in kvc.items() if rr == r)
        for (a0, v0), (a1, v1) in zip(row, row[1:]):
            if v1 > v0:
                raise _err(name, f"kv_capacity[{a1},{r}]",
                           f"inconsistent: {v1} > {v0} at fewer slots ({a0},{r})")
    out["kv_capacity"] = kvc

    lm = d["load_ms"]
    if not isinstance(lm, Mapping) or not lm:
        raise _err(name, "load_ms", "must be a non-empty mapping 'adapter_rank,max_lora_rank' -> ms")
    lms: dict[tuple[int, int], float] = {}
    for k, v in lm.items():
        a, m = _pair_key(name, "load_ms", k)
        fld = f"load_ms[{a},{m}]"
        if a not in ranks or m not in ranks:
            raise _err(name, fld, f"ranks must be in supported_ranks {list(ranks)}")
        if a > m:
            raise _err(name, fld, "adapter rank exceeds max_lora_rank")
        if not _is_num(v) or float(v) < 0:
            raise _err(name, fld, f"must be a finite non-negative number, got {v!r}")
        lms[(a, m)] = float(v)
    out["load_ms"] = lms

    for k in _OPTIONAL + _OPTIONAL_IF_SET:
        v = d.get(k, {})
        if not isinstance(v, Mapping):
            raise _err(name, k, f"must be a mapping, got {type(v).__name__}")
        out[k] = dict(v)
    if out["serving"]:
        _check_serving(name, out["serving"])
    return out


def _check_serving(name: str, sv: Mapping[str, Any]) -> None:
    """``serving``: known keys of the right type, a non-empty model id, a memory fraction in
    (0, 1]."""
    for k, v in sv.items():
        want = SERVING_KEYS.get(k)
        if want is None:
            raise _err(name, f"serving.{k}", f"unknown key (allowed: {', '.join(SERVING_KEYS)})")
        ok = (_is_num(v) if want is float else isinstance(v, want))
        if not ok or (want is not bool and isinstance(v, bool)):
            raise _err(name, f"serving.{k}", f"must be a {want.__name__}, got {v!r}")
    if not isinstance(sv.get("model_id"), str) or not sv["model_id"].strip():
        raise _err(name, "serving.model_id", "missing or empty (the model id vLLM loads)")
    gmu = sv.get("gpu_memory_utilization")
    if gmu is not None and not 0 < float(gmu) <= 1:
        raise _err(name, "serving.gpu_memory_utilization", f"must be in (0, 1], got {gmu!r}")
