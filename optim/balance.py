"""Load-balanced spread of adapters over GPUs, shared by greedy (spread, shrink, rebalance) and
compaction (which imports greedy's callers otherwise in a cycle)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from twin.workload import Adapter

from .instance import Instance


def balanced_members(inst: Instance, adapters: Sequence[Adapter], k: int) -> list[list[int]]:
    """Indices of ``adapters`` per GPU for ``k`` GPUs: largest offered load first onto the
    least-loaded GPU (ties: lowest index)."""
    loads = np.array([inst.load_tps(a) for a in adapters])
    members: list[list[int]] = [[] for _ in range(k)]
    gload = np.zeros(k)
    for i in np.argsort(-loads, kind="stable"):
        g = int(np.argmin(gload))
        members[g].append(int(i))
        gload[g] += loads[i]
    return members


__all__ = ["balanced_members"]
