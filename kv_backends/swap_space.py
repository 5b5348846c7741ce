"""The host swap space: a free list of host blocks that preempted requests' KV is copied into."""

from __future__ import annotations

from typing import Iterable


class SwapSpace:
    """A fixed number of host blocks handed out and taken back by id.

    It only does the bookkeeping; the executor owns the host memory and runs the swap operations
    that `BlockPool.swap_out` and `BlockPool.swap_in` plan.
    """

    __slots__ = ("num_blocks", "_free", "_allocated")

    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 0, num_blocks
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._allocated = bytearray(num_blocks)

    def num_free_blocks(self) -> int:
        """How many host blocks can be allocated now."""
        return len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` host blocks; None, and nothing taken, if fewer than `n` are free."""
        free = self._free
        if n > len(free):
            return None
        if n <= 0:
            return []
        block_ids = free[-n:]
        del free[-n:]
        block_ids.reverse()
        allocated = self._allocated
        for b in block_ids:
            allocated[b] = 1
        return block_ids

    def free(self, block_ids: Iterable[int]) -> None:
        """Give host blocks back. Each must be allocated (a double free is an AssertionError)."""
        allocated, free = self._allocated, self._free
        for b in block_ids:
            assert allocated[b], f"host block {b} freed but not allocated"
            allocated[b] = 0
            free.append(b)
