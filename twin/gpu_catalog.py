"""GPU catalog: public facts per GPU type (memory, bandwidth, FLOPs, host link, power).

``twin/data/gpus.json`` ships one entry per GPU type, each number with its public source.
``gpu_spec`` returns a catalog entry by id, or reads a user's JSON file holding one entry
(the same fields), so a derived profile can target a GPU the catalog lacks. Every field is
checked; a bad value raises ``CatalogError`` naming the file, the GPU and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .json_files import read_json_file

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "gpus.json"
GIB = 1 << 30

_NUMBERS = ("memory_gib", "hbm_bandwidth_gbs", "bf16_dense_tflops", "host_link_gbs", "tdp_w",
            "idle_w")
_ALLOWED = set(_NUMBERS) | {"name", "usable_memory_gib", "sources", "id"}


class CatalogError(ValueError):
    """A GPU spec is malformed or unknown; the message names where, the field and why."""


@dataclass(frozen=True)
class GpuSpec:
    """Public facts of one GPU type (units in the field names: GiB, GB/s, TFLOPS, W)."""

    id: str
    name: str
    memory_gib: float
    hbm_bandwidth_gbs: float
    bf16_dense_tflops: float
    host_link_gbs: float
    tdp_w: float
    idle_w: float
    usable_memory_gib: float | None = None
    sources: dict = field(default_factory=dict)

    def usable_bytes(self, reference: "GpuSpec | None" = None) -> int:
        """Bytes that torch sees as the GPU's total memory. Measured when the spec states it;
        otherwise the nominal size less the same driver/ECC reserve as ``reference`` (the
        measured GPU of the source profile), or the nominal size without a reference."""
        if self.usable_memory_gib is not None:
            return int(round(self.usable_memory_gib * GIB))
        reserve = 0.0
        if reference is not None and reference.usable_memory_gib is not None:
            reserve = reference.memory_gib - reference.usable_memory_gib
        return int(round((self.memory_gib - reserve) * GIB))

    def facts(self) -> dict[str, Any]:
        """The numbers (for a derived profile's metadata)."""
        d = {k: getattr(self, k) for k in ("id", "name") + _NUMBERS}
        if self.usable_memory_gib is not None:
            d["usable_memory_gib"] = self.usable_memory_gib
        return d


def spec_from_dict(d: Any, gpu_id: str, where: str) -> GpuSpec:
    """Validate one GPU entry (``where`` names the file for messages)."""
    def err(fld: str, reason: str) -> CatalogError:
        return CatalogError(f"{where}: GPU {gpu_id!r}: field {fld!r}: {reason}")

    if not isinstance(d, Mapping):
        raise CatalogError(f"{where}: GPU {gpu_id!r}: must be a JSON object, got "
                           f"{type(d).__name__}")
    unknown = sorted(set(d) - _ALLOWED)
    if unknown:
        raise err(unknown[0], f"unknown field (allowed: {', '.join(sorted(_ALLOWED))})")
    vals: dict[str, float] = {}
    for k in _NUMBERS:
        if k not in d:
            raise err(k, "missing")
        v = d[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise err(k, f"must be a finite number > 0, got {v!r}")
        vals[k] = float(v)
    if vals["idle_w"] >= vals["tdp_w"]:
        raise err("idle_w", f"{vals['idle_w']:g} W must be below tdp_w {vals['tdp_w']:g} W")
    usable = d.get("usable_memory_gib")
    if usable is not None:
        if isinstance(usable, bool) or not isinstance(usable, (int, float)) \
                or not math.isfinite(usable) or not 0 < usable <= vals["memory_gib"]:
            raise err("usable_memory_gib",
                      f"must be a number in (0, memory_gib={vals['memory_gib']:g}], got {usable!r}")
        usable = float(usable)
    name = d.get("name", gpu_id)
    if not isinstance(name, str) or not name:
        raise err("name", f"must be a non-empty string, got {name!r}")
    sources = d.get("sources", {})
    if not isinstance(sources, Mapping):
        raise err("sources", f"must be an object field -> source, got {type(sources).__name__}")
    return GpuSpec(id=gpu_id, name=name, usable_memory_gib=usable, sources=dict(sources), **vals)


def _read_json(path: Path, what: str) -> Any:
    return read_json_file(path, what, CatalogError)


def load_catalog(path: str | Path = CATALOG_PATH) -> dict[str, GpuSpec]:
    """Every GPU of a catalog file (``{"gpus": {id: spec}}``), validated."""
    p = Path(path)
    d = _read_json(p, "GPU catalog")
    if not isinstance(d, Mapping) or not isinstance(d.get("gpus"), Mapping) or not d["gpus"]:
        raise CatalogError(f"GPU catalog {str(p)!r}: field 'gpus': must be a non-empty object "
                           "id -> spec")
    return {str(k): spec_from_dict(v, str(k), f"GPU catalog {str(p)!r}")
            for k, v in d["gpus"].items()}


def gpu_ids() -> list[str]:
    """Ids of the shipped catalog."""
    return sorted(load_catalog())


def gpu_spec(id_or_path: str | Path) -> GpuSpec:
    """A shipped catalog entry by id, or one spec from a JSON file (its ``id`` field, else the
    file stem, names it)."""
    s = str(id_or_path)
    if s.endswith(".json") or "/" in s or Path(s).is_file():
        p = Path(s)
        d = _read_json(p, "GPU spec")
        gid = d.get("id", p.stem) if isinstance(d, Mapping) else p.stem
        return spec_from_dict(d, str(gid), f"GPU spec {s!r}")
    cat = load_catalog()
    if s not in cat:
        raise CatalogError(f"unknown GPU {s!r}; catalog ids: {', '.join(sorted(cat))} "
                           "(or give a JSON spec file)")
    return cat[s]
