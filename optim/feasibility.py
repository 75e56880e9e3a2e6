"""Infeasibility pre-checks: reasons why an instance cannot be served at all, as a report.

The checks are necessary conditions only (passing them does not prove feasibility). A GPU
starves when throughput < threshold x offered, and no GPU serves more than its backbone maximum
throughput ``C`` (LoRA only adds work), so a GPU can carry at most ``C / threshold`` offered
tokens/s. Checks, each producing a ``Reason`` with a machine-readable ``code``:

* ``rank_unsupported`` — an adapter's rank is in no GPU type's ``supported_ranks`` (or no
  configuration with that rank starts on any type);
* ``adapter_overload`` — an adapter alone offers more than the largest single-GPU limit
  ``max_t C_t / threshold`` (unless ``allow_split``: methods that split an adapter's traffic
  over GPUs are then bounded by the total only);
* ``pool_capacity`` — the total offered load exceeds ``sum_t count_t x C_t / threshold``;
* ``gpu_budget`` — the latency objective's GPU budget is below the capacity lower bound
  ``ceil(total x threshold / max_t C_t)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .capacity import backbone_max_throughput, lora_peak_throughput, max_startable_amax
from .instance import Instance


@dataclass(frozen=True)
class Reason:
    """One reason an instance is infeasible: ``code``, human ``message``, offending ``items``."""

    code: str
    message: str
    items: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "items": list(self.items)}


@dataclass(frozen=True)
class FeasibilityReport:
    """Outcome of the pre-checks: ``feasible`` is False when at least one reason was found;
    ``capacity_tps`` holds each GPU type's single-GPU limit used by the checks."""

    instance: str
    reasons: tuple[Reason, ...] = ()
    capacity_tps: dict[str, float] = field(default_factory=dict)
    gpu_lower_bound: int = 0

    @property
    def feasible(self) -> bool:
        return not self.reasons

    def to_dict(self) -> dict:
        return {"instance": self.instance, "feasible": self.feasible,
                "reasons": [r.to_dict() for r in self.reasons],
                "capacity_tps": self.capacity_tps, "gpu_lower_bound": self.gpu_lower_bound}

    def summary(self) -> str:
        if self.feasible:
            return f"{self.instance}: no infeasibility found (GPU lower bound {self.gpu_lower_bound})"
        return f"{self.instance}: infeasible — " + "; ".join(r.message for r in self.reasons)


def _listing(items: list[str], k: int = 5) -> str:
    return ", ".join(items[:k]) + (f" (+{len(items) - k} more)" if len(items) > k else "")


def _count_bound(inst: Instance, capacity_tps: float) -> int:
    """ceil(threshold x total load / capacity_tps), at least 1."""
    return max(1, math.ceil(inst.starvation_threshold * inst.total_load_tps / capacity_tps - 1e-9))


def gpu_lower_bound(inst: Instance) -> int:
    """Capacity lower bound on the GPU count: ceil(threshold x total load / best GPU capacity)."""
    return _count_bound(inst, max(backbone_max_throughput(t.profile, inst.lengths)
                                  for t in inst.gpu_types))


def lora_gpu_lower_bound(inst: Instance) -> int:
    """Twin lower bound on the GPU count of any placement: every GPU serving adapters runs with
    LoRA on and ``max_lora_rank`` at least the smallest adapter rank ``r``, so it serves at most
    ``P_t = capacity.lora_peak_throughput(type t, r)`` tokens/s and, unstarved, carries at most
    ``P_t / threshold`` offered tokens/s: ``ceil(threshold x total load / max_t P_t)``.

    Tighter than ``gpu_lower_bound`` (LoRA costs throughput: the peak is about 63 % of the
    backbone's on the H100 profiles). The load is the expected one; the realised load of an hour
    differs by well under the margin ``lora_peak_throughput`` includes."""
    r = min(a.rank for a in inst.adapters)
    best = max(lora_peak_throughput(t.profile, r, inst.lengths) for t in inst.gpu_types)
    if best <= 0:
        raise ValueError(f"{inst.name}: no GPU type starts a LoRA configuration of rank >= {r}")
    return _count_bound(inst, best)


def precheck(inst: Instance, allow_split: bool = False) -> FeasibilityReport:
    """Run every pre-check on ``inst`` and collect the reasons (never raises for infeasibility)."""
    thr = inst.starvation_threshold
    cap = {t.name: backbone_max_throughput(t.profile, inst.lengths) for t in inst.gpu_types}
    limit = {k: v / thr for k, v in cap.items()}      # most offered tps a GPU may carry
    reasons: list[Reason] = []

    usable_ranks: set[int] = set()
    for t in inst.gpu_types:
        prof = t.load_profile()
        usable_ranks |= {r for r in prof.supported_ranks if max_startable_amax(prof, r) >= 1}
    bad_rank = [a for a in inst.adapters if a.rank not in usable_ranks]
    if bad_rank:
        ranks = sorted({a.rank for a in bad_rank})
        reasons.append(Reason(
            "rank_unsupported",
            f"{len(bad_rank)} adapter(s) have rank(s) {ranks} that no GPU type supports "
            f"(supported: {sorted(usable_ranks)}): {_listing([a.id for a in bad_rank])}",
            tuple(a.id for a in bad_rank)))

    best = max(limit.values())
    if not allow_split:
        heavy = [a for a in inst.adapters if inst.load_tps(a) > best]
        if heavy:
            worst = max(heavy, key=inst.load_tps)
            reasons.append(Reason(
                "adapter_overload",
                f"{len(heavy)} adapter(s) offer more than one GPU can serve "
                f"({best:.0f} tok/s = capacity / threshold); largest: '{worst.id}' with "
                f"{inst.load_tps(worst):.0f} tok/s: {_listing([a.id for a in heavy])}",
                tuple(a.id for a in heavy)))

    pool = sum(t.count * limit[t.name] for t in inst.gpu_types)
    total = inst.total_load_tps
    lb = gpu_lower_bound(inst)
    if total > pool:
        reasons.append(Reason(
            "pool_capacity",
            f"total offered load {total:.0f} tok/s exceeds what the pool's "
            f"{inst.total_gpus_available} GPU(s) can serve ({pool:.0f} tok/s); at least {lb} "
            f"GPU(s) are needed"))
    budget = inst.objective.gpu_budget
    if budget is not None and budget < lb:
        reasons.append(Reason(
            "gpu_budget",
            f"objective.gpu_budget {budget} is below the capacity lower bound of {lb} GPU(s)"))
    return FeasibilityReport(inst.name, tuple(reasons), cap, lb)
