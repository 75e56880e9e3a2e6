"""Exhaustive enumeration for tiny problems (tests): every partition of the adapters into at
most |slots| GPUs, every assignment of the blocks to GPU types within the counts, the best
admissible configuration of each block. Exponential — use for <= 8 adapters, <= 3 GPUs."""

from __future__ import annotations

import math

from .problem import PackingProblem, iter_partitions, type_assignments


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
