"""First-fit and best-fit decreasing on the packing problem itself (the mode's real capacities).

The exact methods need a start that satisfies *their* model: in the constant-capacity mode the
surrogate-driven greedy does not know the constant capacity at all, and in the surrogate mode a
GPU is limited by its configurations (rank class, adapter-count interval, capacity piece), not
by one number. Both heuristics here read ``PackingProblem`` directly:

* adapters in non-increasing load order (ties: larger rank first);
* an adapter joins an open GPU when some configuration of the GPU's type admits the GPU with it
  (``Config.admits``: max rank, feature interval, load interval; cuts respected);
  first fit takes the first such GPU, best fit the one left with the least slack (largest
  admitting capacity minus load);
* otherwise it opens a GPU of the type that admits it alone with the best capacity per unit of
  objective weight (1 for gpus, the price for cost) among types with slots left.

``best_start`` runs both and keeps the one with the lower objective. Linear in adapters x open
GPUs x configurations, so it runs in well under a second for thousands of adapters.
"""

from __future__ import annotations

from typing import Sequence

from .common import effective
from .problem import PackingProblem

Solution = list[tuple[int, list[int]]]


def _admitting_cap(P: PackingProblem, cfgs, load: int, x: int, rank: int) -> int:
    """Largest capacity of a configuration admitting (load, x, rank), -1 when none does."""
    best = -1
    for c in cfgs:
        if c.admits(load, x, rank) and c.cap > best:
            best = c.cap
    return best


def decreasing_fit(P: PackingProblem, best_fit: bool = False) -> Solution | None:
    """First-fit (or best-fit) decreasing over the problem's configurations; ``None`` when an
    adapter fits no GPU left in the pool."""
    E = effective(P)
    cfgs = [P.types[t].configs for t in range(len(P.types))]
    left = [E.slots.count(t) for t in range(len(P.types))]
    order = sorted(range(P.n), key=lambda i: (-P.loads[i], -P.ranks[i], i))
    bins: list[list] = []          # [type, load, x, max rank, items]
    for i in order:
        w, xi, ri = P.loads[i], P.xs[i], P.ranks[i]
        chosen, chosen_slack = None, None
        for b in bins:
            t, load, x, mr, items = b
            cap = _admitting_cap(P, cfgs[t], load + w, x + xi, max(mr, ri))
            if cap < 0:
                continue
            if P.cuts and not P.configs_admitting(t, items + [i]):
                continue
            if not best_fit:
                chosen = b
                break
            slack = cap - load - w
            if chosen_slack is None or slack < chosen_slack:
                chosen, chosen_slack = b, slack
        if chosen is not None:
            chosen[1] += w
            chosen[2] += xi
            chosen[3] = max(chosen[3], ri)
            chosen[4].append(i)
            continue
        best_t, best_score = None, None
        for t in range(len(P.types)):
            if left[t] <= 0:
                continue
            cap = _admitting_cap(P, cfgs[t], w, xi, ri)
            if cap < 0 or (P.cuts and not P.configs_admitting(t, [i])):
                continue
            score = cap / P.slot_weight(t) if P.slot_weight(t) > 0 else float(cap)
            if best_score is None or score > best_score:
                best_t, best_score = t, score
        if best_t is None:
            return None
        left[best_t] -= 1
        bins.append([best_t, w, xi, ri, [i]])
    return [(b[0], sorted(b[4])) for b in bins]


def solution_value(P: PackingProblem, sol: Sequence[tuple[int, Sequence[int]]]) -> float:
    """Objective of a (type, adapters) solution for gpus / cost."""
    return float(sum(P.slot_weight(t) for t, _ in sol))


def best_start(P: PackingProblem) -> tuple[str, Solution] | None:
    """(``"ffd"`` or ``"bfd"``, solution) with the lower objective; ``None`` if both fail."""
    best = None
    for name, bf in (("ffd", False), ("bfd", True)):
        s = decreasing_fit(P, best_fit=bf)
        if s is not None and (best is None or solution_value(P, s) < solution_value(P, best[1])):
            best = (name, s)
    return best
