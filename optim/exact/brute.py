"""Exhaustive enumeration for tiny problems (tests): every partition of the adapters into at
most |slots| GPUs, every assignment of the blocks to GPU types within the counts, the best
admissible configuration of each block. Exponential — use for <= 8 adapters, <= 3 GPUs.
``brute_force_split`` does the same for the replication mode (adapters split over up to
``max_homes`` GPUs)."""

from __future__ import annotations

import itertools
import math

from .problem import PackingProblem, iter_partitions, type_assignments
from .split import home_caps


def brute_force(P: PackingProblem, max_adapters: int = 10
                ) -> tuple[float, list[tuple[int, int, tuple[int, ...]]]] | None:
    """(optimal objective, solution) or ``None`` when infeasible."""
    if P.n > max_adapters:
        raise ValueError(f"brute_force: {P.n} adapters > max_adapters={max_adapters}")
    counts = [0] * len(P.types)
    for t in P.slots:
        counts[t] += 1
    max_blocks = sum(counts)
    if P.objective == "latency" and P.gpu_budget is not None:
        max_blocks = min(max_blocks, P.gpu_budget)
    best = (math.inf, None)
    cache: dict[tuple[int, tuple[int, ...]], tuple[float, int] | None] = {}
    for blocks in iter_partitions(range(P.n), max_blocks):
        for combo in type_assignments(len(blocks), counts):
            total = 0.0
            sol = []
            for b, t in zip(blocks, combo):
                key = (t, tuple(b))
                if key not in cache:
                    cache[key] = P.gpu_cost(t, b)
                c = cache[key]
                if c is None:
                    break
                total += c[0]
                sol.append((t, c[1], tuple(b)))
            else:
                if P.objective == "latency":
                    total /= max(P.total_load, 1)
                if total < best[0] - 1e-9:
                    best = (total, sol)
    return None if best[1] is None else best


def brute_force_split(P: PackingProblem, max_adapters: int = 6
                      ) -> tuple[float, list[tuple[int, tuple[int, ...]]]] | None:
    """Replication mode (``P.max_homes``), gpus or cost objective, no lower load ends: (optimal
    objective, [(slot, homed adapters), ...] per used slot) or ``None`` when infeasible.

    Enumerates every choice of 1..k home slots per adapter. Given the homes, each used slot
    takes, among the configurations of its type admitting its homes' feature sum and max rank,
    the largest capacity (the objective does not depend on it); the shares exist iff the
    transportation problem "adapters supply w_i, slot g takes at most cap_g, only along homes"
    is feasible, which by Hall's theorem (Gale's supply-demand theorem) holds iff every set A of
    adapters has sum_{i in A} w_i <= sum of the caps of the slots homing some i in A."""
    if P.n > max_adapters:
        raise ValueError(f"brute_force_split: {P.n} adapters > max_adapters={max_adapters}")
    if P.objective not in ("gpus", "cost"):
        raise ValueError(f"brute_force_split: objective {P.objective!r} (gpus or cost only)")
    if any(c.load_lo for t in P.types for c in t.configs):
        raise ValueError("brute_force_split: configurations with a lower load end")
    slots = P.slots
    home_sets = [c for r in range(1, min(P.max_homes, len(slots)) + 1)
                 for c in itertools.combinations(range(len(slots)), r)]
    best: tuple[float, list | None] = (math.inf, None)
    subsets = [[i for i in range(P.n) if mask >> i & 1] for mask in range(1, 1 << P.n)]
    for homes in itertools.product(home_sets, repeat=P.n):
        on: dict[int, list[int]] = {}
        for i, hs in enumerate(homes):
            for g in hs:
                on.setdefault(g, []).append(i)
        value = sum(P.slot_weight(slots[g]) for g in on)
        if value >= best[0] - 1e-9:
            continue
        best_caps = home_caps(P, [(slots[g], -1, items) for g, items in on.items()])
        if any(p < 0 for _, p in best_caps):
            continue
        cap = {g: c for g, (c, _) in zip(on, best_caps)}
        if all(sum(P.loads[i] for i in A)
               <= sum(cap[g] for g in {g for i in A for g in homes[i]}) for A in subsets):
            best = (value, sorted(on.items()))
    return None if best[1] is None else best
