"""KV-cache block accounting (vLLM V1 ``KVCacheManager`` without prefix caching).

A request holds ``ceil(computed_tokens / block_size)`` blocks; scheduling ``n`` new tokens for it
needs ``ceil((computed + n) / block_size) - held`` more blocks, and fails when the pool has fewer
free blocks (the caller then preempts). Finishing or preempting a request frees all its blocks.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` KV entries."""
    return (tokens + block_size - 1) // block_size


class KVCache:
    """Plain-Python block pool used by the reference kernel (the numba kernel keeps the same
    state in arrays)."""

    def __init__(self, total_blocks: int, block_size: int) -> None:
        if total_blocks < 1:
            raise ValueError(f"kv cache: total_blocks must be >= 1, got {total_blocks}")
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.free_blocks = total_blocks
        self.held: dict[int, int] = {}

    def try_allocate(self, req: int, computed_tokens: int, new_tokens: int) -> bool:
        """Reserve blocks so ``req`` can hold ``computed + new`` tokens; False if the pool is short."""
        have = self.held.get(req, 0)
        need = blocks_for(computed_tokens + new_tokens, self.block_size) - have
        if need > self.free_blocks:
            return False
        if need > 0:
            self.free_blocks -= need
            self.held[req] = have + need
        return True

    def free(self, req: int) -> None:
        """Return every block of ``req`` to the pool."""
        self.free_blocks += self.held.pop(req, 0)

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks
