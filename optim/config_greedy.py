"""Greedy placement over (GPU type, power cap, Amax, max rank) configurations, for instances with
mixed GPU types, caps, a power budget or the energy objective (``Instance.uses_configurations``).

Capacities and power lines come from the configuration index (``optim.gpu_configs``, measured
with the twin: derived profiles have no trained surrogates, and the surrogates know no caps).

Fill. Adapters are taken rank group by rank group (largest first), heaviest load first. Each new
GPU is filled once per configuration whose type still has units (first fit in that order:
at most Amax adapters of rank <= the configuration's, total load <= its capacity) and the
configuration with the best *efficiency* of that fill is opened: load per $/h (``cost``), load
per watt of predicted power (``energy``: tokens per joule) or load (``gpus``); ties go to the
cheaper, then lower-power configuration. Scoring the actual fill, not the configuration's full
capacity, lets a cheap small configuration take the tail.

Refit. Each GPU then moves to the configuration that holds its adapters at the best objective
value (cheapest, lowest power, ...) while units of that type remain. With a power budget, GPUs
then move to lower-power configurations (largest saving first) until the predicted power fits;
a placement that cannot fit is not returned.

Portfolio. The fill runs on the whole pool, on each single type and (pools of at most
``MAX_SUBSET_TYPES`` types) on every subset of types, each ranked by the objective's
efficiency and by load alone (the most load per GPU: packing tightly can be the only way to fit
a scarce pool), and under a power budget also by load per watt; the best plan by the objective
is kept, so the mixed greedy never does worse than the best homogeneous greedy plan.

Twin loop. With verification, every GPU is replayed with its own profile and cap. A rejected
GPU's configuration has its capacity cut below the load it failed at (0.97 x) and the greedy
runs again, up to ``MAX_TWIN_ROUNDS`` times; the changes are listed in ``Placement.repairs``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from twin.workload import Adapter

from .gpu_configs import GpuConfig, config_index, derived_note
from .instance import Instance
from .placement import GpuMetrics, GpuPlan, Placement, plan_gpu

MAX_TWIN_ROUNDS = 5
DERATE = 0.97
MAX_SUBSET_TYPES = 5            # pools of up to 5 types: the portfolio tries every subset


@dataclass(frozen=True)
class Bin:
    """One GPU of a configuration plan: its configuration and adapter indices."""

    config: GpuConfig
    items: tuple[int, ...]


def objective_key(kind: str, c: GpuConfig, load: float) -> float:
    """What one GPU of configuration ``c`` at ``load`` adds to the objective."""
    if kind == "cost":
        return c.price_per_hour
    if kind == "energy":
        return c.power_w(load)
    return 1.0


def plan_value(kind: str, bins: Sequence[Bin], loads: Sequence[float]) -> float:
    """Objective value of a configuration plan (cost $/h, energy J/h predicted, or GPUs)."""
    total = 0.0
    for b in bins:
        total += objective_key(kind, b.config, sum(loads[i] for i in b.items))
    return total * 3600.0 if kind == "energy" else total


def plan_power(bins: Sequence[Bin], loads: Sequence[float]) -> float:
    return sum(b.config.power_w(sum(loads[i] for i in b.items)) for b in bins)


def _order(adapters: Sequence[Adapter], loads: Sequence[float]) -> list[int]:
    return sorted(range(len(adapters)), key=lambda i: (-adapters[i].rank, -loads[i],
                                                       adapters[i].id))


def _fill(c: GpuConfig, queue: list[int], adapters: Sequence[Adapter],
          loads: Sequence[float]) -> list[int]:
    taken, load = [], 0.0
    for i in queue:
        if len(taken) >= c.amax:
            break
        if adapters[i].rank <= c.max_rank and load + loads[i] <= c.capacity_tps:
            taken.append(i)
            load += loads[i]
    return taken


def _efficiency(kind: str, c: GpuConfig, load: float) -> float:
    if kind == "cost":
        return load / max(c.price_per_hour, 1e-12)
    if kind == "energy":
        return load / max(c.power_w(load), 1e-12)
    return load


def fill_plan(configs: Sequence[GpuConfig], adapters: Sequence[Adapter],
              loads: Sequence[float], avail: dict[str, int], kind: str) -> list[Bin] | None:
    """Greedy fill (module docstring); None when the pool runs out or an adapter fits nowhere."""
    left = dict(avail)
    queue = _order(adapters, loads)
    bins: list[Bin] = []
    while queue:
        best = None
        for c in configs:
            if left.get(c.gpu_type, 0) <= 0:
                continue
            taken = _fill(c, queue, adapters, loads)
            if not taken:
                continue
            load = sum(loads[i] for i in taken)
            key = (_efficiency(kind, c, load), load, -c.price_per_hour, -c.power_w(load))
            if best is None or key > best[0]:
                best = (key, c, taken)
        if best is None:
            return None
        _, c, taken = best
        left[c.gpu_type] -= 1
        bins.append(Bin(c, tuple(taken)))
        chosen = set(taken)
        queue = [i for i in queue if i not in chosen]
    return bins


def _movable_to(b: Bin, load: float, configs: Sequence[GpuConfig], adapters: Sequence[Adapter],
                used: dict[str, int], avail: dict[str, int]) -> Iterator[GpuConfig]:
    """Configurations GPU ``b`` (carrying ``load``) may switch to: they hold its adapters, and
    a GPU of another type is still available (``used`` GPUs per type so far)."""
    rank = max(adapters[i].rank for i in b.items)
    for c in configs:
        if not c.fits(len(b.items), rank, load):
            continue
        if c.gpu_type != b.config.gpu_type and used.get(c.gpu_type, 0) >= avail.get(
                c.gpu_type, 0):
            continue
        yield c


def refit(bins: list[Bin], configs: Sequence[GpuConfig], adapters: Sequence[Adapter],
          loads: Sequence[float], avail: dict[str, int], kind: str) -> list[Bin]:
    """Move each GPU to the configuration holding its adapters at the best objective value
    (units permitting)."""
    used: dict[str, int] = {}
    for b in bins:
        used[b.config.gpu_type] = used.get(b.config.gpu_type, 0) + 1
    out = list(bins)
    for k, b in enumerate(out):
        load = sum(loads[i] for i in b.items)
        best = b.config
        for c in _movable_to(b, load, configs, adapters, used, avail):
            if (objective_key(kind, c, load), c.power_w(load), c.price_per_hour) < \
                    (objective_key(kind, best, load), best.power_w(load), best.price_per_hour):
                best = c
        if best is not b.config:
            used[b.config.gpu_type] -= 1
            used[best.gpu_type] = used.get(best.gpu_type, 0) + 1
            out[k] = Bin(best, b.items)
    return out


def fit_power_budget(bins: list[Bin], configs: Sequence[GpuConfig],
                     adapters: Sequence[Adapter], loads: Sequence[float],
                     avail: dict[str, int], budget_w: float) -> list[Bin] | None:
    """Move GPUs to lower-power configurations, largest saving first, until the predicted power
    is within ``budget_w``; None if it cannot be."""
    out = list(bins)
    while plan_power(out, loads) > budget_w:
        used: dict[str, int] = {}
        for b in out:
            used[b.config.gpu_type] = used.get(b.config.gpu_type, 0) + 1
        best = None
        for k, b in enumerate(out):
            load = sum(loads[i] for i in b.items)
            for c in _movable_to(b, load, configs, adapters, used, avail):
                saving = b.config.power_w(load) - c.power_w(load)
                if saving > 1e-9 and (best is None or saving > best[0]):
                    best = (saving, k, c)
        if best is None:
            return None
        _, k, c = best
        out[k] = Bin(c, out[k].items)
    return out


def plan_configurations(inst: Instance, configs: Sequence[GpuConfig], kind: str,
                        types: Sequence[str] | None = None) -> list[Bin] | None:
    """Fill + refit (+ power budget) with the GPU types ``types`` (default: all); None when no
    plan within availability (and budget) is found."""
    allowed = set(types) if types is not None else {t.name for t in inst.gpu_types}
    cfgs = [c for c in configs if c.gpu_type in allowed]
    avail = {t.name: t.count for t in inst.gpu_types if t.name in allowed}
    loads = [inst.load_tps(a) for a in inst.adapters]
    best = None
    rankings = (kind, "gpus") + (("energy",) if inst.power_budget_w is not None else ())
    for rank_by in dict.fromkeys(rankings):
        bins = fill_plan(cfgs, inst.adapters, loads, avail, rank_by)
        if bins is None:
            continue
        bins = refit(bins, cfgs, inst.adapters, loads, avail, kind)
        if inst.power_budget_w is not None:
            bins = fit_power_budget(bins, cfgs, inst.adapters, loads, avail, inst.power_budget_w)
        if bins is not None and (best is None or plan_value(kind, bins, loads)
                                 < plan_value(kind, best, loads)):
            best = bins
    return best


def best_plan(inst: Instance, configs: Sequence[GpuConfig], kind: str,
              homogeneous_only: bool = False) -> tuple[list[Bin] | None, str]:
    """The portfolio (module docstring): the best of the whole pool, each single type and each
    subset of types (``homogeneous_only``: single types only). Returns (bins, which pool won)."""
    loads = [inst.load_tps(a) for a in inst.adapters]
    names = [t.name for t in inst.gpu_types]
    pools: list[tuple[str, list[str] | None]] = [(n, [n]) for n in names]
    if not homogeneous_only:
        pools.append(("mixed", None))
        if len(names) <= MAX_SUBSET_TYPES:       # every proper subset of two or more types
            pools += [("+".join(sub), list(sub)) for k in range(2, len(names))
                      for sub in itertools.combinations(names, k)]
    best: tuple[float, list[Bin], str] | None = None
    for label, types in pools:
        bins = plan_configurations(inst, configs, kind, types)
        if bins is None:
            continue
        key = (plan_value(kind, bins, loads), len(bins), plan_value("cost", bins, loads))
        if best is None or key < best[0]:
            best = (key, bins, label)
    return (None, "") if best is None else (best[1], best[2])


def to_placement(inst: Instance, bins: Sequence[Bin], method: str) -> tuple[GpuPlan, ...]:
    """GPU plans of a configuration plan, with predicted load and power."""
    plans = []
    for b in bins:
        c = b.config
        load = sum(inst.load_tps(inst.adapters[i]) for i in b.items)
        pred = GpuMetrics(load, load, False, False, avg_power_w=c.power_w(load))
        p = plan_gpu(c.gpu_type, c.profile, c.amax, [(inst.adapters[i], 1.0) for i in b.items],
                     inst.mean_tokens, c.max_rank, pred)
        plans.append(GpuPlan(p.gpu_type, p.profile, p.max_loras, p.max_lora_rank, p.adapters,
                             p.offered_tps, p.predicted, None, c.cap_w))
    return tuple(plans)


def derate_rejected(configs: list[GpuConfig], placement: Placement
                    ) -> tuple[list[GpuConfig], list[str]]:
    """Cut the capacity of every configuration the twin rejected a GPU of to ``DERATE`` x the
    load it failed at; returns the new index and one line per cut."""
    out = list(configs)
    changes = []
    for g, plan in enumerate(placement.gpus):
        if plan.verified is None or plan.verified.ok:
            continue
        for k, c in enumerate(out):
            if (c.gpu_type, c.amax, c.max_rank, c.cap_w) == (plan.gpu_type, plan.max_loras,
                                                             plan.max_lora_rank, plan.power_cap_w):
                new = DERATE * plan.offered_tps
                if new < c.capacity_tps:
                    changes.append(f"gpu {g}: twin rejected {c.label} at {plan.offered_tps:.0f} "
                                   f"tok/s; its capacity {c.capacity_tps:.0f} -> {new:.0f}")
                    out[k] = c.derated(new)
    return out, changes


def solve_configurations(inst: Instance, kind: str, verify: bool, duration_s: float | None,
                         workers: int | None, method: str = "greedy",
                         homogeneous_only: bool = False,
                         configs: list[GpuConfig] | None = None) -> Placement:
    """Greedy over configurations with the twin loop (module docstring)."""
    from .verify import verify as twin_verify
    t0 = time.perf_counter()
    configs = list(configs) if configs is not None else config_index(inst, workers=workers,
                                                                     duration_s=duration_s)
    notes = [n for n in (derived_note(inst),) if n]
    changes: list[str] = []
    p = None
    for _ in range(MAX_TWIN_ROUNDS + 1):
        bins, pool = best_plan(inst, configs, kind, homogeneous_only)
        if bins is None:
            why = ("no plan within the availability caps"
                   + (" and the power budget" if inst.power_budget_w is not None else ""))
            return Placement(inst.name, method, "failed", wall_time_s=time.perf_counter() - t0,
                             notes=tuple(notes + [why]), repairs=tuple(changes))
        loads = [inst.load_tps(a) for a in inst.adapters]
        p = Placement(inst.name, method, "solved", to_placement(inst, bins, method),
                      notes=tuple(notes + [f"best pool: {pool}"]), repairs=tuple(changes),
                      params={"configurations": len(configs), "pool": pool,
                              "predicted_power_w": plan_power(bins, loads),
                              "power_budget_w": inst.power_budget_w})
        if not verify:
            break
        p = twin_verify(p, inst, duration_s=duration_s, workers=workers)
        if p.verdict == "accepted":
            break
        configs, cut = derate_rejected(configs, p)
        if not cut:
            break
        changes += cut
    return p.with_(wall_time_s=time.perf_counter() - t0, repairs=tuple(changes))


__all__ = ["Bin", "fill_plan", "refit", "fit_power_budget", "plan_configurations", "best_plan",
           "plan_value", "plan_power", "to_placement", "derate_rejected",
           "solve_configurations", "objective_key"]
