"""What the MILP and CP-SAT models share: effective configuration data, the solve result, options.

``effective(problem)`` clips every configuration's upper bounds to what the instance can reach
(capacity <= total load, feature upper end <= total feature) so coefficients stay small, drops
configurations no adapter set can meet, and lists for every (adapter, type) pair whether the
adapter can go on that type at all (some configuration admits it alone; with replication, some
configuration of a rank class and feature range that can home it, whatever its load: a share
may be small).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Sequence

from .problem import Config, PackingProblem

STATUSES = ("optimal", "feasible", "infeasible", "unknown")


@dataclass(frozen=True)
class Effective:
    """Per type: clipped configurations and, per adapter, whether it may use the type."""

    configs: tuple[tuple[Config, ...], ...]
    allowed: tuple[tuple[bool, ...], ...]          # allowed[t][i]
    slots: tuple[int, ...]
    orig: tuple[tuple[int, ...], ...] = ()          # orig[t][p]: index in problem.types[t]


def effective(P: PackingProblem) -> Effective:
    total_load = P.total_load
    total_x = sum(P.xs)
    cfgs: list[tuple[Config, ...]] = []
    allowed: list[tuple[bool, ...]] = []
    min_x = min(P.xs)
    orig: list[tuple[int, ...]] = []
    for t in P.types:
        out = []
        idx = []
        for k, c in enumerate(t.configs):
            if c.x_lo > total_x or c.load_lo > total_load or c.x_hi < min_x:
                continue
            idx.append(k)
            out.append(Config(c.rank, c.amax, c.x_lo, min(c.x_hi, total_x),
                              min(c.cap, total_load), c.load_lo, c.itl_ms, c.label))
        cfgs.append(tuple(out))
        orig.append(tuple(idx))
        allowed.append(tuple(any(c.rank >= P.ranks[i] and c.x_hi >= P.xs[i]
                                 and (c.cap >= P.loads[i] if not P.splits else c.cap > 0)
                                 for c in out) for i in range(P.n)))
    return Effective(tuple(cfgs), tuple(allowed), P.slots, tuple(orig))


@dataclass(frozen=True)
class SolveResult:
    """Outcome of one exact solve: ``status`` (optimal / feasible [with bound] / infeasible /
    unknown), objective and best bound (objective units), relative ``gap``, solve time, the
    solution as ``(type_index, config_index, adapters)`` per used GPU, and solver details.
    ``shares`` (replication mode only; empty = every share 1) holds, per used GPU, the routing
    share of each of its adapters, aligned with ``gpus``."""

    solver: str
    status: str
    objective: float | None
    bound: float | None
    solve_time_s: float
    gpus: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
    warm_start_used: bool = False
    details: dict = field(default_factory=dict)
    shares: tuple[tuple[float, ...], ...] = ()

    def gpu_shares(self, k: int) -> tuple[float, ...]:
        """Shares of the adapters of used GPU ``k`` (all 1 without replication)."""
        return self.shares[k] if self.shares else (1.0,) * len(self.gpus[k][2])

    @property
    def gap(self) -> float | None:
        if self.objective is None or self.bound is None:
            return None
        if self.objective == 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / abs(self.objective))


_HIGHS_THREADS: int | None = None


def highs_threads(requested: int | None) -> int:
    """HiGHS keeps one global thread pool per process and fails (status unknown) when a later
    solve asks for a different thread count, so the first solve's count is kept for the
    process."""
    global _HIGHS_THREADS
    if _HIGHS_THREADS is None:
        _HIGHS_THREADS = int(requested or default_threads())
    return _HIGHS_THREADS


def default_threads() -> int:
    """Solver threads: the machine's cores (``os.sched_getaffinity`` where available)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # pragma: no cover
        return max(1, os.cpu_count() or 1)


def warm_start_solution(P: PackingProblem, E: Effective,
                        gpus: Sequence[tuple[int, Sequence[int]]] | None
                        ) -> list[tuple[int, int, tuple[int, ...]]] | None:
    """Map a heuristic solution ``(type_index, adapters)`` per GPU onto slots and admissible
    configurations; ``None`` when it does not satisfy the model (then no warm start)."""
    if not gpus:
        return None
    used: dict[int, int] = {}
    out = []
    covered: list[int] = []
    for t, items in gpus:
        items = tuple(sorted(items))
        covered += items
        load = sum(P.loads[i] for i in items)
        x = sum(P.xs[i] for i in items)
        mr = max(P.ranks[i] for i in items)
        cands = [p for p, c in enumerate(E.configs[t]) if c.admits(load, x, mr)
                 and not any(cut.forbids(t, c, items) for cut in P.cuts)]
        if not cands:
            return None
        if P.objective == "latency":
            cands.sort(key=lambda p: E.configs[t][p].itl_ms or math.inf)
        used[t] = used.get(t, 0) + 1
        if used[t] > E.slots.count(t):
            return None
        out.append((t, cands[0], items))
    if sorted(covered) != list(range(P.n)):
        return None
    if P.objective == "latency" and P.gpu_budget is not None and len(out) > P.gpu_budget:
        return None
    return out


def assign_slots(P: PackingProblem, E: Effective,
                 sol: Sequence[tuple[int, int, tuple[int, ...]]]) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """Place a solution on slot indices so that used slots come first within each type and
    identical adapters get non-decreasing slot indices (the symmetry-breaking order)."""
    by_type: dict[int, list] = {}
    for t, p, items in sol:
        by_type.setdefault(t, []).append((p, list(items)))
    out: dict[int, tuple[int, int, tuple[int, ...]]] = {}
    slot_of_type = {t: [g for g, tt in enumerate(E.slots) if tt == t] for t in by_type}
    # order GPUs of a type by their smallest adapter index
    for t, gl in by_type.items():
        gl.sort(key=lambda pi: min(pi[1]))
        for k, (p, items) in enumerate(gl):
            out[slot_of_type[t][k]] = (t, p, tuple(items))
    # relabel identical adapters so their slots are non-decreasing
    slot_item = {}
    for g, (_, _, items) in out.items():
        for i in items:
            slot_item[i] = g
    for grp in P.identical_groups():
        gs = sorted(slot_item[i] for i in grp)
        for i, g in zip(grp, gs):
            slot_item[i] = g
    new: dict[int, list[int]] = {g: [] for g in out}
    for i, g in slot_item.items():
        new[g].append(i)
    return {g: (out[g][0], out[g][1], tuple(sorted(new[g]))) for g in out}
