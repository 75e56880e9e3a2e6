"""Load-balanced spreads of adapters over GPUs, shared by greedy (spread, shrink, rebalance) and
compaction (which imports greedy's callers otherwise in a cycle): by load alone, and by load
within rank tiers."""

from __future__ import annotations

import math
from typing import Callable, Sequence

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


def rank_tiered_members(inst: Instance, adapters: Sequence[Adapter], k: int,
                        capacity: Callable[[int], float] | None = None
                        ) -> list[list[int]] | None:
    """Indices of ``adapters`` per GPU for ``k`` GPUs, load-balanced within rank tiers; None
    when every adapter has one rank (the tiers are then :func:`balanced_members`).

    A server's LoRA work per step follows its largest rank (vLLM pads every slot to
    ``max_lora_rank``), so an even spread of mixed ranks runs every GPU at the top rank. Here GPU
    g gets a rank ceiling c_g: the adapters of rank >= r may use only the first n_r GPUs, just
    enough to carry their load at a fair share, n_r = ceil(L_{>=r} / (L / k x cap(r) / cap(r_min)))
    (at least 1, at most k, growing as r falls), with ``capacity(r)`` a GPU's relative capacity
    at rank r (default 1 for every rank; compaction passes the twin's saturated throughput).
    Each GPU has a fair load L x cap(c_g) / sum cap(c). Adapters go highest rank first, then
    largest load first: onto the GPU of their own tier (ceiling = their rank) with room and the
    least load relative to its capacity, else the lowest higher tier with room (it costs that
    GPU no rank), else the allowed GPU of least relative load (ties: lowest index). The smallest
    rank fills the higher tiers' room first, heaviest first (few adapters cost a high-rank GPU
    the least per-slot work), then the GPUs of least relative load. The high-rank adapters thus
    share as few GPUs as their load allows and the other GPUs run at a smaller rank
    (``instances/small/small-18``: 40 adapters of ranks 8/16/32 split evenly by load score 0.995
    and 0.991 at their best Amax; with rank 32 on one GPU both are accepted)."""
    ranks = sorted({a.rank for a in adapters}, reverse=True)
    if len(ranks) < 2 or k < 2:
        return None
    cap = capacity if capacity is not None else (lambda r: 1.0)
    loads = np.array([inst.load_tps(a) for a in adapters])
    fair = loads.sum() / k / cap(ranks[-1])          # load per unit of capacity, evenly spread
    allowed: dict[int, int] = {}
    n = 1
    for r in ranks:
        above = loads[[a.rank >= r for a in adapters]].sum()
        n = max(n, min(k, math.ceil(above / (fair * cap(r)) - 1e-9)))
        allowed[r] = n
    allowed[ranks[-1]] = k
    ceiling = [max(r for r in ranks if g < allowed[r]) for g in range(k)]
    weight = [cap(c) for c in ceiling]
    target = loads.sum() / sum(weight) * np.array(weight)       # each GPU's fair load
    members: list[list[int]] = [[] for _ in range(k)]
    gload = np.zeros(k)
    low = ranks[-1]
    for i in sorted(range(len(adapters)), key=lambda i: (-adapters[i].rank, -loads[i], i)):
        r = adapters[i].rank
        fits = [g for g in range(allowed[r]) if gload[g] + loads[i] <= target[g] * (1 + 1e-9)]
        if r != low:       # own tier, else the lowest tier above with room, else least loaded
            own = [g for g in fits if ceiling[g] == r]
            g = (min(own, key=lambda g: (gload[g] / weight[g], g)) if own
                 else min(fits, key=lambda g: (ceiling[g], g)) if fits
                 else min(range(allowed[r]), key=lambda g: (gload[g] / weight[g], g)))
        else:              # the higher tiers' room first, heaviest first
            room = [g for g in fits if ceiling[g] != low]
            g = room[0] if room else min(range(k), key=lambda g: (gload[g] / weight[g], g))
        members[g].append(int(i))
        gload[g] += loads[i]
    return members


__all__ = ["balanced_members", "rank_tiered_members"]
