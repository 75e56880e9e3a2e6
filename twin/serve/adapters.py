"""LoRA modules served by ``twin serve``: names, PEFT paths, ranks, and the ids the engine uses.

As in vLLM, an adapter is a PEFT directory; its rank is the field ``r`` of its
``adapter_config.json`` (the weights themselves are never read: the twin needs only the rank,
which sets the adapter's CPU->GPU load time in the profile). Every error names the adapter, the
file or field and the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..profile import GpuProfile


class AdapterError(ValueError):
    """A LoRA module cannot be served; the message names it and says why."""


@dataclass(frozen=True)
class LoraModule:
    """One registered adapter: its engine id, name, PEFT path and rank."""

    adapter_id: int
    name: str
    path: str
    rank: int


def read_peft_rank(path: str | Path, what: str) -> int:
    """The rank ``r`` of the PEFT adapter in directory ``path`` (``what`` names it in errors)."""
    p = Path(path)
    if not p.exists():
        raise AdapterError(f"{what}: path {str(p)!r} does not exist")
    if not p.is_dir():
        raise AdapterError(f"{what}: path {str(p)!r} is not a directory (a PEFT adapter "
                           "directory with adapter_config.json is expected)")
    cfg = p / "adapter_config.json"
    if not cfg.is_file():
        raise AdapterError(f"{what}: {str(cfg)!r} not found (not a PEFT adapter directory)")
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{what}: {str(cfg)!r} is not valid JSON ({e})") from None
    except OSError as e:
        raise AdapterError(f"{what}: cannot read {str(cfg)!r} ({e.strerror})") from None
    if not isinstance(d, dict) or "r" not in d:
        raise AdapterError(f"{what}: {str(cfg)!r} has no field 'r' (the LoRA rank)")
    r = d["r"]
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise AdapterError(f"{what}: {str(cfg)!r} field 'r' must be a positive integer, got {r!r}")
    return r


class AdapterRegistry:
    """Name -> :class:`LoraModule`, with the rank checks vLLM makes when it loads an adapter."""

    def __init__(self, profile: GpuProfile, max_lora_rank: int, base_model_name: str) -> None:
        self.profile = profile
        self.max_lora_rank = max_lora_rank
        self.base_model_name = base_model_name
        self.by_name: dict[str, LoraModule] = {}
        self.name_of: dict[int, str] = {}
        self._next_id = 0

    def check(self, name: str, path: str, what: str) -> int:
        """Validate a module before it is added; return its rank."""
        if not isinstance(name, str) or not name.strip():
            raise AdapterError(f"{what}: the adapter name must be a non-empty string")
        if name == self.base_model_name:
            raise AdapterError(f"{what}: name {name!r} is the served base model's name")
        if name in self.by_name:
            raise AdapterError(f"The lora adapter '{name}' has already been loaded.")
        rank = read_peft_rank(path, what)
        if rank > self.max_lora_rank:
            raise AdapterError(f"{what}: LoRA rank {rank} is greater than max_lora_rank "
                               f"{self.max_lora_rank} (--max-lora-rank)")
        if rank not in self.profile.supported_ranks:
            raise AdapterError(f"{what}: rank {rank} is not supported by profile "
                               f"'{self.profile.name}' (supported: "
                               f"{', '.join(map(str, self.profile.supported_ranks))})")
        return rank

    def add(self, name: str, path: str, what: str | None = None) -> LoraModule:
        """Register a module (checked first); a fresh engine id each time, as vLLM gives a
        re-loaded adapter a new ``lora_int_id``."""
        rank = self.check(name, path, what or f"lora adapter {name!r}")
        mod = LoraModule(self._next_id, name, str(path), rank)
        self._next_id += 1
        self.by_name[name] = mod
        self.name_of[mod.adapter_id] = name
        return mod

    def remove(self, name: str) -> LoraModule:
        mod = self.by_name.pop(name, None)
        if mod is None:
            raise KeyError(name)
        return mod

    def load_ms(self, mod: LoraModule) -> float:
        """The profile's CPU->GPU load time of this adapter into slots of max_lora_rank."""
        return self.profile.load_time_ms(mod.rank, self.max_lora_rank)


def parse_lora_module(text: str) -> tuple[str, str]:
    """``name=path`` (vLLM's ``--lora-modules`` form; a JSON object with ``name`` and ``path``
    is accepted too)."""
    t = text.strip()
    if t.startswith("{"):
        try:
            d = json.loads(t)
        except json.JSONDecodeError as e:
            raise AdapterError(f"--lora-modules: invalid JSON {text!r} ({e})") from None
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) \
                or not isinstance(d.get("path"), str):
            raise AdapterError(f"--lora-modules: JSON form needs string fields 'name' and 'path', "
                               f"got {text!r}")
        return d["name"], d["path"]
    name, sep, path = t.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise AdapterError(f"--lora-modules: expected name=path, got {text!r}")
    return name.strip(), path.strip()
