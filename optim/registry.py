"""The method registry's shared types: what a method is (``MethodFn``), how it is run
(``MethodOptions``) and what the registry knows of it (``MethodInfo``), and ``register_method``.

Kept below every method: greedy, the baselines and the exact methods import ``MethodOptions``
from here, and ``optim.methods`` registers the built-in ones in one place (``_load_builtin``),
so no method module imports the registry that lists it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .instance import Instance
from .objectives import Objective
from .placement import Placement


@dataclass(frozen=True)
class MethodOptions:
    """Run options: ``n_gpus`` (fleet size for fixed-fleet methods; ``None`` = the method's
    default), ``seed`` (``None`` = the instance's), ``time_limit_s`` (``None`` = the instance's
    solver limit), ``extra`` (method-specific settings)."""

    n_gpus: int | None = None
    seed: int | None = None
    time_limit_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


MethodFn = Callable[[Instance, Objective, MethodOptions], Placement]


@dataclass(frozen=True)
class MethodInfo:
    """A registered method: ``fixed_fleet`` methods place onto a given number of GPUs instead of
    choosing it; ``splits`` methods may route one adapter to several GPUs; ``max_homes``
    methods do so within the instance's ``max_homes`` (and not at all when it is 1)."""

    name: str
    fn: MethodFn
    objectives: frozenset[str]
    fixed_fleet: bool = False
    splits: bool = False
    description: str = ""
    repairs: bool = False
    max_homes: bool = False


_REGISTRY: dict[str, MethodInfo] = {}


def register_method(name: str, fn: MethodFn, *, objectives: tuple[str, ...] = ("gpus",),
                    fixed_fleet: bool = False, splits: bool = False, description: str = "",
                    replace: bool = False, repairs: bool = False,
                    max_homes: bool = False) -> MethodInfo:
    """Register ``fn`` under ``name`` (``replace=True`` to override an existing entry)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"method name must be alphanumeric (with - or _), got {name!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"method '{name}' is already registered")
    info = MethodInfo(name, fn, frozenset(objectives), fixed_fleet, splits, description, repairs,
                      max_homes)
    _REGISTRY[name] = info
    return info
