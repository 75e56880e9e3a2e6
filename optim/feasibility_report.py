"""The pre-checks' verdict on an instance: reasons it is infeasible (shared by the checks in
``optim.feasibility`` and the ``Placement`` that carries them, so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
