"""GPU adapter slots (``max_loras``) with LRU replacement and a per-adapter loading time.

vLLM keeps every served adapter in CPU memory (``max_cpu_loras >= N``) and activates the adapters
of the scheduled batch in GPU slots, evicting the least recently used slot that the batch does not
need. The scheduler guarantees a batch never holds more than ``max_loras`` distinct adapters, so a
free or evictable slot always exists. Each activation costs the profile's CPU->GPU load time.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numba import njit


@njit(cache=True)
def activate_batch(batch_adapters, n_batch, slot_of, last_used, resident, n_resident,
                   max_loras, in_batch_mark, step_id, touch_counter, load_ms):
    """Make every adapter of the batch resident; return (total load ms, loads, new counter).

    ``resident[0:n_resident[0]]`` lists resident adapters; ``slot_of[a]`` is a's index in it or -1.
    ``last_used[a]`` is a monotone touch stamp (LRU order); ``in_batch_mark[a] == step_id`` marks
    the adapters this step needs, which are never evicted.
    """
    total_ms = 0.0
    loads = 0
    for k in range(n_batch):
        a = batch_adapters[k]
        if slot_of[a] < 0:
            if n_resident[0] < max_loras:
                pos = n_resident[0]
                n_resident[0] += 1
            else:
                victim_pos = -1
                oldest = np.int64(2**62)
                for p in range(n_resident[0]):
                    b = resident[p]
                    if in_batch_mark[b] != step_id and last_used[b] < oldest:
                        oldest = last_used[b]
                        victim_pos = p
                pos = victim_pos
                slot_of[resident[pos]] = -1
            resident[pos] = a
            slot_of[a] = pos
            total_ms += load_ms[a]
            loads += 1
        touch_counter += 1
        last_used[a] = touch_counter
    return total_ms, loads, touch_counter


class AdapterSlots:
    """Plain-Python LRU slot cache used by the reference kernel."""

    def __init__(self, max_loras: int, load_ms: np.ndarray) -> None:
        self.max_loras = max_loras
        self.load_ms = load_ms
        self.lru: OrderedDict[int, None] = OrderedDict()

    def activate(self, batch_adapters: list[int]) -> tuple[float, int]:
        """Activate ``batch_adapters`` (in batch order); return (load ms, number of loads)."""
        needed = set(batch_adapters)
        total, loads = 0.0, 0
        for a in batch_adapters:
            if a not in self.lru:
                if len(self.lru) >= self.max_loras:
                    victim = next(b for b in self.lru if b not in needed)
                    del self.lru[victim]
                total += float(self.load_ms[a])
                loads += 1
                self.lru[a] = None
            self.lru.move_to_end(a)
        return total, loads
