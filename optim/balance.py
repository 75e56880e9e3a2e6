"""Load-balanced spread of adapters over GPUs, shared by greedy (spread, shrink, rebalance) and
compaction (which imports greedy's callers otherwise in a cycle)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twin.workload import Adapter

from .instance import Instance


def balanced_members(inst: Instance, adapters: Sequence[Adapter], k: int,
                     shares: Sequence[float] | None = None) -> list[list[int]] | None:
    """Indices of ``adapters`` per GPU for ``k`` GPUs: largest offered load (x its share, default
    1) first onto the least-loaded GPU not yet holding that adapter id (ties: lowest index).
    Items may be shares of one adapter (``optim.greedy.replicate``): two never go on one GPU,
    and the result is None when an adapter has more shares than there are GPUs."""
    sh = [1.0] * len(adapters) if shares is None else shares
    loads = np.array([inst.load_tps(a) * s for a, s in zip(adapters, sh)])
    members: list[list[int]] = [[] for _ in range(k)]
    held: list[set[str]] = [set() for _ in range(k)]
    gload = np.zeros(k)
    for i in np.argsort(-loads, kind="stable"):
        free = [g for g in range(k) if adapters[i].id not in held[g]]
        if not free:
            return None
        g = min(free, key=lambda g: (gload[g], g))
        members[g].append(int(i))
        held[g].add(adapters[i].id)
        gload[g] += loads[i]
    return members


__all__ = ["balanced_members"]
