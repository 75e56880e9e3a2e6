"""GPU adapter slots (``max_loras``) with vLLM 0.8.5's LRU replacement and a per-adapter
loading time.

vLLM keeps every served adapter in CPU memory (``max_cpu_loras >= N``) and, before each step,
activates the adapters of the batch one by one (``LRUCacheWorkerLoRAManager._apply_adapters``):
an adapter already in a GPU slot is only touched (moved to most recently used); any other one
evicts the least recently used slot and is copied in, costing the profile's CPU->GPU load time.
Two details of vLLM 0.8.5 (``LRUCacheLoRAModelManager.activate_adapter``) matter under load:

* the evicted slot is the least recently used one **even when this step's batch still needs
  it**: vLLM does not protect the batch's adapters;
* the adapters are activated in the iteration order of a Python set of LoRA requests, i.e. by
  the hash of the adapter name, which is fixed within a server process and the same every step.

So when every slot holds an adapter of the previous batch and an adapter new to the batch comes
before the one that left it in that order, it evicts the next adapter of the batch still to be
activated, which then evicts the next, and so on up to the one that left: one new adapter can
cost up to ``max_loras`` loads in one step (on average about 1 + max_loras / 6 when the batch
fills every slot). The twin activates in the order of :func:`activation_ranks` (a fixed stand-in
for the hash order) and evicts exactly as vLLM does. The scheduler guarantees a batch never holds
more than ``max_loras`` distinct adapters, so every adapter of the batch is resident at the end.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np
from numba import njit


def activation_ranks(ids: Sequence[str]) -> np.ndarray:
    """Each adapter's position in the twin's activation order: by CRC-32 of its id (a fixed
    stand-in for vLLM's per-process hash of the adapter name), ties by list position. Depends
    on the ids only, not on the order they are listed in."""
    keys = np.array([zlib.crc32(str(i).encode()) for i in ids], np.int64)
    order = np.lexsort((np.arange(len(keys)), keys))
    ranks = np.empty(len(keys), np.int64)
    ranks[order] = np.arange(len(keys))
    return ranks


@njit(cache=True)
def activate_batch(batch_adapters, n_batch, slot_of, last_used, resident, n_resident,
                   max_loras, activation_rank, touch_base, load_ms):
    """Make every adapter of the batch resident as vLLM 0.8.5 does (module docstring); return
    (total load ms, loads, next touch base).

    ``resident[0:n_resident[0]]`` lists resident adapters; ``slot_of[a]`` is a's index in it or -1.
    ``last_used[a]`` is a's touch stamp (LRU order): a step touches its adapters in activation
    order with stamps ``touch_base + activation_rank[a] + 1``, above every earlier stamp.
    """
    n_adapters = activation_rank.shape[0]
    total_ms = 0.0
    loads = 0
    missing = False
    for k in range(n_batch):
        if slot_of[batch_adapters[k]] < 0:
            missing = True
            break
    if not missing:                       # only touches: the order is in the stamps
        for k in range(n_batch):
            a = batch_adapters[k]
            last_used[a] = touch_base + activation_rank[a] + 1
        return total_ms, loads, touch_base + n_adapters
    keys = np.empty(n_batch, np.int64)
    for k in range(n_batch):
        keys[k] = activation_rank[batch_adapters[k]]
    order = np.argsort(keys)
    for j in range(n_batch):
        a = batch_adapters[order[j]]
        if slot_of[a] < 0:
            if n_resident[0] < max_loras:
                pos = n_resident[0]
                n_resident[0] += 1
            else:                         # least recently used, needed by this batch or not
                pos = 0
                for p in range(1, n_resident[0]):
                    if last_used[resident[p]] < last_used[resident[pos]]:
                        pos = p
                slot_of[resident[pos]] = -1
            resident[pos] = a
            slot_of[a] = pos
            total_ms += load_ms[a]
            loads += 1
        last_used[a] = touch_base + activation_rank[a] + 1
    return total_ms, loads, touch_base + n_adapters


class AdapterSlots:
    """Plain-Python LRU slot cache used by the reference kernel and the online engine (same rules
    as :func:`activate_batch`). ``activation_rank`` gives each adapter's place in the activation
    order (an array or a mapping; adapters without one go last, by index)."""

    def __init__(self, max_loras: int, load_ms, activation_rank: Sequence[int] | Mapping[int, int]
                 ) -> None:
        self.max_loras = max_loras
        self.load_ms = load_ms
        self.activation_rank = activation_rank
        self.lru: OrderedDict[int, None] = OrderedDict()

    def _rank(self, a: int) -> tuple[int, int]:
        r = self.activation_rank
        if isinstance(r, Mapping):
            return (int(r[a]), a) if a in r else (np.iinfo(np.int64).max, a)
        return int(r[a]), a

    def activate(self, batch_adapters: list[int]) -> tuple[float, int]:
        """Activate ``batch_adapters`` in activation order; return (load ms, number of loads)."""
        total, loads = 0.0, 0
        for a in sorted(batch_adapters, key=self._rank):
            if a not in self.lru:
                if len(self.lru) >= self.max_loras:
                    del self.lru[next(iter(self.lru))]      # LRU, even if this batch needs it
                total += float(self.load_ms[a])
                loads += 1
                self.lru[a] = None
            self.lru.move_to_end(a)
        return total, loads
