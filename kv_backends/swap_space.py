"""Swapping: the host swap space (a free list of host blocks that preempted requests' KV is copied
into) and the pool's planning of swaps out of and back into device blocks."""

from __future__ import annotations

from typing import Iterable

from .block_ops import SWAP_IN, SWAP_OUT
from .pending import PendingSlots


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


class SwapPlanning(PendingSlots):
    """The swapping part of `BlockPool` (a mixin over the pool's state, `PoolState`, and its
    pending slots, `PendingSlots`; it allocates and releases device blocks through the pool's
    `_allocate_block` and `release`)."""

    __slots__ = ()

    def swap_out(
        self, block_table: list[int], swap: SwapSpace, ops: list, num_computed: int | None = None
    ) -> list[int] | None:
        """Plan copying the table's blocks to host blocks and release the device references.

        `num_computed`: the positions of the table whose KV the copy must carry (the owner's
        computed tokens; None: every slot). Returns the host table, or None (nothing changed) if
        the swap space is too small or a slot among them is pending: this step's forward has yet
        to write it, and the copy runs before the forward (`metroline.kv_backends.pending`; the
        caller preempts by recompute instead).
        """
        if self.pending and self.reads_pending(block_table, num_computed):
            return None
        host_table = swap.allocate(len(block_table))
        if host_table is None:
            return None
        ops.extend([(SWAP_OUT, d, h) for d, h in zip(block_table, host_table)])
        self.release(block_table)
        return host_table

    def swap_in(self, host_table: list[int], swap: SwapSpace, ops: list) -> list[int] | None:
        """Plan copying host blocks back into fresh device blocks and free the host blocks.

        Returns the device table (fresh, unindexed blocks with ref count 1), or None (nothing
        changed) if too few device blocks are free.
        """
        if len(host_table) > len(self._free) + len(self._evictable):
            return None
        block_table = [self._allocate_block() for _ in host_table]
        ops.extend([(SWAP_IN, h, d) for h, d in zip(host_table, block_table)])
        swap.free(host_table)
        if self._num_used > self.peak_used_blocks:
            self.peak_used_blocks = self._num_used
        return block_table
