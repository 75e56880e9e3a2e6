"""Pluggable objectives: how a placement is scored and which GPU types a method should open first.

An objective object has a ``name``, ``value(placement) -> float`` (lower is better; ``inf`` when
the placement violates the objective's own constraint, e.g. a GPU budget) and
``gpu_preference(instance) -> list[GpuType]`` (the order in which methods that open GPUs one by
one should draw types from a heterogeneous pool).

* ``gpus`` — number of GPUs used; opens the type with the largest backbone capacity first
  (ties: cheaper first).
* ``cost`` — Σ price per hour over the GPUs used (heterogeneous types); opens the type with the
  lowest price per unit of backbone capacity first.
* ``energy`` — joules per hour of the fleet at the placement's load: 3600 x Σ_g average power
  of GPU g, the twin's (``twin.power``, each GPU with its own profile and cap) when verified,
  else the method's prediction (``inf`` when neither has a power); opens the type with the most
  backbone capacity per watt of TDP first. Needs the configuration index
  (``optim.gpu_configs``); a power budget (``power_budget_w``) is a constraint, not an objective.
* ``latency`` — load-weighted mean inter-token latency Σ_g offered_g · ITL_g / Σ_g offered_g,
  within ``gpu_budget`` GPUs (``inf`` beyond it). ITL comes from the twin-verified metrics when
  present, else from the method's prediction (``inf`` when neither has an ITL).

Which method supports which objective (``register_method(..., objectives=...)`` records it; a
method is run on an unsupported objective only to *report* the value, never to target it):

| method                     | gpus | cost | latency | how                                         |
|----------------------------|------|------|---------|---------------------------------------------|
| maxbase, maxbase-half      | yes  | yes  | no      | sizes the fleet; cost via GPU-type order     |
| random, dlora, loraserve   | yes  | yes  | yes     | fixed fleet: given size, or ``gpu_budget``   |
| greedy                     | yes  | yes  | no      | Maxpack packing with the surrogate; type     |
|                            |      |      |         | chosen by load (gpus) or load per $ (cost)   |
|                            |      |      |         | energy (and any instance with catalog types, |
|                            |      |      |         | caps or a power budget): optim.config_greedy |
| milp, cpsat               | yes  | yes  | yes     | exact (``optim.exact``); latency: per-piece  |
|                            |      |      |         | ITL table from the ITL model, GPU budget     |
| auto                       | yes  | yes  | small   | cpsat when small, else greedy (or maxbase)   |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from .capacity import backbone_max_throughput
from .instance import GpuType, Instance
from .placement import Placement


class Objective(Protocol):
    """What a method minimises; see the module docstring."""

    name: str

    def value(self, placement: Placement) -> float: ...

    def gpu_preference(self, inst: Instance) -> list[GpuType]: ...


def _by_capacity(inst: Instance) -> list[GpuType]:
    cap = {t.name: backbone_max_throughput(t.profile, inst.lengths) for t in inst.gpu_types}
    return sorted(inst.gpu_types, key=lambda t: (-cap[t.name], t.price_per_hour, t.name))


@dataclass(frozen=True)
class GpusObjective:
    """Fewest GPUs."""

    name: str = "gpus"

    def value(self, placement: Placement) -> float:
        return float(placement.n_gpus) if placement.gpus else math.inf

    def gpu_preference(self, inst: Instance) -> list[GpuType]:
        return _by_capacity(inst)


@dataclass(frozen=True)
class CostObjective:
    """Lowest Σ price per hour; ``prices`` maps GPU type name -> $/h."""

    prices: tuple[tuple[str, float], ...]
    name: str = "cost"

    def value(self, placement: Placement) -> float:
        if not placement.gpus:
            return math.inf
        p = dict(self.prices)
        return float(sum(p[g.gpu_type] for g in placement.gpus))

    def gpu_preference(self, inst: Instance) -> list[GpuType]:
        cap = {t.name: backbone_max_throughput(t.profile, inst.lengths) for t in inst.gpu_types}
        return sorted(inst.gpu_types, key=lambda t: (t.price_per_hour / cap[t.name], -cap[t.name],
                                                     t.name))


@dataclass(frozen=True)
class LatencyObjective:
    """Lowest load-weighted mean ITL using at most ``gpu_budget`` GPUs."""

    gpu_budget: int
    name: str = "latency"

    def value(self, placement: Placement) -> float:
        if not placement.gpus or placement.n_gpus > self.gpu_budget:
            return math.inf
        num = den = 0.0
        for g in placement.gpus:
            m = g.verified or g.predicted
            if m is None or m.mean_itl_ms is None:
                return math.inf
            num += g.offered_tps * m.mean_itl_ms
            den += g.offered_tps
        return num / den if den > 0 else math.inf

    def gpu_preference(self, inst: Instance) -> list[GpuType]:
        return _by_capacity(inst)


@dataclass(frozen=True)
class EnergyObjective:
    """Lowest fleet energy per hour (J/h) at the placement's load."""

    name: str = "energy"

    def value(self, placement: Placement) -> float:
        if not placement.gpus:
            return math.inf
        total = 0.0
        for g in placement.gpus:
            m = g.verified if g.verified is not None and g.verified.avg_power_w is not None \
                else g.predicted
            if m is None or m.avg_power_w is None:
                return math.inf
            total += m.avg_power_w
        return 3600.0 * total

    def gpu_preference(self, inst: Instance) -> list[GpuType]:
        from twin.power import power_model_for
        score = {}
        for t in inst.gpu_types:
            pm = power_model_for(t.load_profile())
            watts = pm.max_w if pm is not None else math.inf
            score[t.name] = backbone_max_throughput(t.profile, inst.lengths) / watts
        return sorted(inst.gpu_types, key=lambda t: (-score[t.name], t.price_per_hour, t.name))


def make_objective(inst: Instance, kind: str | None = None, gpu_budget: int | None = None
                   ) -> Objective:
    """The objective object for ``kind`` (default: the instance's), with the instance's prices and
    GPU budget unless ``gpu_budget`` overrides it."""
    kind = kind or inst.objective.kind
    if kind == "gpus":
        return GpusObjective()
    if kind == "cost":
        return CostObjective(tuple((t.name, t.price_per_hour) for t in inst.gpu_types))
    if kind == "latency":
        budget = gpu_budget if gpu_budget is not None else inst.objective.gpu_budget
        if budget is None:
            raise ValueError("objective 'latency' needs a GPU budget (objective.gpu_budget in "
                             "the instance, or --gpu-budget)")
        return LatencyObjective(int(budget))
    if kind == "energy":
        return EnergyObjective()
    raise ValueError(f"unknown objective {kind!r} (expected gpus, cost, energy or latency)")
