"""Memory errors and KV capacity from a profile's KV-capacity table (exact, not learned).

The lookup rule is the twin's (``GpuProfile.kv_tokens``): a measured (Amax, rank) pair returns
its value; an Amax between grid points returns the next larger measured Amax of that rank; no
entry means the server does not start (memory error, capacity 0 here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KvTable:
    entries: dict[tuple[int, int], int]

    @classmethod
    def from_profile(cls, profile) -> "KvTable":
        return cls({(int(a), int(r)): int(v) for (a, r), v in profile.kv_capacity.items()})

    def to_json(self) -> dict:
        return {f"{a},{r}": v for (a, r), v in sorted(self.entries.items())}

    @classmethod
    def from_json(cls, d: dict) -> "KvTable":
        out = {}
        for k, v in d.items():
            a, r = (int(x) for x in k.split(","))
            out[(a, r)] = int(v)
        return cls(out)

    def tokens(self, amax: int, rank: int) -> int:
        """KV tokens of (Amax, max rank); 0 = memory error."""
        amax, rank = int(amax), int(rank)
        if (amax, rank) in self.entries:
            return self.entries[(amax, rank)]
        larger = sorted(a for (a, r) in self.entries if r == rank and a > amax)
        return self.entries[(larger[0], rank)] if larger else 0

    def tokens_array(self, amax: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Vectorised ``tokens`` (0 = memory error) for integer Amax <= 1024 and rank classes."""
        amax = np.asarray(amax, dtype=np.float64)
        rank = np.asarray(rank, dtype=np.float64)
        ranks = tuple(sorted({r for (_, r) in self.entries}))
        if not hasattr(self, "_dense_cache"):
            object.__setattr__(self, "_dense_cache", self.dense(1024, ranks))
        T = self._dense_cache
        out = np.zeros(len(amax))
        ri = np.searchsorted(ranks, rank)
        ri_c = np.minimum(ri, len(ranks) - 1)
        ok = ((ri < len(ranks)) & (np.asarray(ranks, float)[ri_c] == rank) & (amax >= 1)
              & (amax < T.shape[0]) & (amax == np.round(amax)))
        out[ok] = T[amax[ok].astype(np.int64), ri_c[ok]]
        return out

    def dense(self, max_amax: int, ranks: tuple[int, ...]) -> np.ndarray:
        """Dense table ``T[amax, rank_index]`` for Amax 0..max_amax (used by numba code)."""
        T = np.zeros((max_amax + 1, len(ranks)))
        for j, r in enumerate(ranks):
            for a in range(1, max_amax + 1):
                T[a, j] = self.tokens(a, r)
        return T
