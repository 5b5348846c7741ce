"""The paged KV block pool: reference counts, the prefix index, copy-on-write and LRU eviction.

The pool works on block tables (plain `list[int]` owned by the caller) and token id lists; it knows
nothing about requests, policies or the scheduler. Every device block is in exactly one state:

- free: ref count 0, not in the prefix index;
- evictable: ref count 0, still in the prefix index, in LRU order (evicted only when the free list
  is empty);
- used: ref count > 0, in the prefix index or not.

The prefix index holds full blocks only, keyed by a chained hash of
`(parent_hash, block_tokens, extra_key)`. Each full block also stores its key: its tokens, extra key
and a link to its parent block's key. A lookup compares keys, parents included, so a hash collision
(in a block or in any of its ancestors) can never hand out wrong KV.

A block is writable iff its ref count is 1 and it is not indexed; `allocate_slots` copies any other
block before a write (copy-on-write) and appends the copy to the caller's op list.

Block operations run before the step's forward pass, so none may read a slot that the forward is
yet to write for a sequence that counts it as computed (`pending`: a swap-out refuses, a copy
never does).

The pool is split by concept: its state (`pool_state`), the prefix index (`prefix_index`, with its
keys in `prefix_keys`), the step's pending slots (`pending`), swap planning (`swap_space`) and the
invariant checks (`pool_invariants`);
references, allocation with copy-on-write, and release are here. The parts are mixins over one
slotted state, so a block operation costs no more than in one class.
"""

from __future__ import annotations

from typing import Iterable

from .block_ops import COPY
from .pool_invariants import PoolInvariants
from .prefix_index import PrefixIndex
from .prefix_keys import PrefixHit
from .swap_space import SwapPlanning

__all__ = ["BlockPool", "PrefixHit"]


class BlockPool(PrefixIndex, SwapPlanning, PoolInvariants):
    """A pool of `num_blocks` device blocks of `block_size` tokens each."""

    __slots__ = ()

    # -- counts -------------------------------------------------------------------------------

    def num_free_blocks(self) -> int:
        """Blocks that can be allocated now: the free list plus the evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    def num_cached_blocks(self) -> int:
        """Evictable blocks: ref count 0, still in the prefix index."""
        return len(self._evictable)

    def num_used_blocks(self) -> int:
        """Blocks with a ref count above 0."""
        return self._num_used

    def ref_count(self, block_id: int) -> int:
        """The reference count of one block."""
        return self._refs[block_id]

    def num_unreferenced(self, block_ids: Iterable[int]) -> int:
        """How many of the blocks have a ref count of 0 (cached ones that `acquire` would take off
        the free blocks)."""
        refs = self._refs
        return sum(1 for b in block_ids if refs[b] == 0)

    def all_indexed(self, block_ids: Iterable[int]) -> bool:
        """Whether every one of the blocks is still in the prefix index (a hit not held yet that no
        block has left)."""
        indexed = self._indexed
        return all(indexed[b] for b in block_ids)

    # -- references ---------------------------------------------------------------------------

    def acquire(self, block_ids: Iterable[int]) -> None:
        """Take a reference on each block (typically `lookup`'s hit); cached ones leave the LRU."""
        refs, evictable = self._refs, self._evictable
        for b in block_ids:
            if refs[b] == 0:
                assert b in evictable, f"acquire of free block {b}"
                del evictable[b]
                self._num_used += 1
            refs[b] += 1
        if self._num_used > self.peak_used_blocks:
            self.peak_used_blocks = self._num_used

    # -- allocation ---------------------------------------------------------------------------

    def allocate_slots(
        self, block_table: list[int], num_computed: int, num_new: int, ops: list
    ) -> bool:
        """Make `block_table` cover positions [0, num_computed + num_new) and the blocks this step
        writes (positions [num_computed, num_computed + num_new)) writable.

        A block to be written that is shared or indexed is copied first: `(COPY, old, new)` is
        appended to `ops`, `new` replaces `old` in the table and `old` loses one reference. Atomic:
        returns False, with nothing changed, if the free and evictable blocks are too few. A copy
        never reads a slot this step's forward is yet to write (`pending`; asserted).
        """
        bs = self.block_size
        n_have = len(block_table)
        if num_new == 1 and num_computed < n_have * bs:
            b = block_table[num_computed // bs]
            if self._refs[b] == 1 and not self._indexed[b]:
                return True
        refs, indexed = self._refs, self._indexed
        num_required = -(-(num_computed + num_new) // bs)
        first = num_computed // bs if num_new > 0 else num_required
        copies = [
            i
            for i in range(first, min(n_have, num_required))
            if refs[block_table[i]] != 1 or indexed[block_table[i]]
        ]
        num_fresh = max(0, num_required - n_have)
        if num_fresh + len(copies) > len(self._free) + len(self._evictable):
            return False
        for i in copies:
            old = block_table[i]
            assert not (self.pending and self.reads_pending([old], num_computed - i * bs)), (
                f"copy-on-write of block {old}, whose KV this step has yet to write"
            )
            new = self._allocate_block()
            ops.append((COPY, old, new))
            block_table[i] = new
            self.release((old,))
        for _ in range(num_fresh):
            block_table.append(self._allocate_block())
        if self._num_used > self.peak_used_blocks:
            self.peak_used_blocks = self._num_used
        return True

    def _allocate_block(self) -> int:
        """A fresh block with ref count 1: from the free list, else the least recently used cached
        block (evicted from the index)."""
        if self._free:
            b = self._free.pop()
        else:
            b = self._evictable.popitem(last=False)[0]
            self._unindex(b)
        self._refs[b] = 1
        self._keys[b] = None
        self._num_used += 1
        if self.pending:
            self.pending.pop(b, None)  # handed out again: nothing the step registered is written here
        return b

    def release(self, block_table: list[int]) -> None:
        """Drop one reference from each block of the table, tail first (so tail blocks become
        least recently used before their ancestors). The caller clears its table."""
        refs, indexed, evictable, free = self._refs, self._indexed, self._evictable, self._free
        for b in reversed(block_table):
            r = refs[b] - 1
            assert r >= 0, f"release of free block {b}"
            refs[b] = r
            if r == 0:
                self._num_used -= 1
                if indexed[b]:
                    evictable[b] = None
                else:
                    free.append(b)

    def fork(self, block_table: list[int]) -> list[int]:
        """Share every block of the table with a new child (parallel sampling); return the child's
        table. Parent and child diverge through copy-on-write in `allocate_slots`."""
        refs = self._refs
        for b in block_table:
            assert refs[b] > 0, f"fork of free block {b}"
            refs[b] += 1
        return list(block_table)
