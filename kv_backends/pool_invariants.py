"""`BlockPool.check_invariants`: the pool's invariants, asserted against the live block tables."""

from __future__ import annotations

from typing import Iterable

from .pool_state import PoolState


class PoolInvariants(PoolState):
    """The checking part of `BlockPool` (a mixin over the pool's state, `PoolState`)."""

    __slots__ = ()

    def check_invariants(self, live_tables: Iterable[list[int]]) -> None:
        """Assert the pool's invariants, given the block tables of all live reference owners."""
        n = self.num_blocks
        counts = [0] * n
        for table in live_tables:
            for b in table:
                counts[b] += 1
        free, evictable = set(self._free), set(self._evictable)
        used = {b for b in range(n) if self._refs[b] > 0}
        assert len(free) == len(self._free), "duplicate block in the free list"
        assert not free & evictable, f"free and evictable: {sorted(free & evictable)}"
        assert not free & used, f"free and used: {sorted(free & used)}"
        assert not evictable & used, f"evictable and used: {sorted(evictable & used)}"
        assert len(free) + len(evictable) + len(used) == n, (
            f"free {len(free)} + evictable {len(evictable)} + used {len(used)} != {n}"
        )
        assert self._num_used == len(used), f"used counter {self._num_used} != {len(used)}"
        assert self.peak_used_blocks >= self._num_used, "peak below current use"
        for b in range(n):
            assert self._refs[b] == counts[b], (
                f"block {b}: ref count {self._refs[b]} != {counts[b]} references in live tables"
            )
        for h, b in self._index.items():
            key = self._keys[b]
            assert self._indexed[b] and key is not None and key.hash == h, (
                f"index entry {h} -> block {b} stale"
            )
            parent_hash = None if key.parent is None else key.parent.hash
            assert self._block_hash((parent_hash, key.tokens, key.extra_key)) == h, (
                f"block {b}: stored key does not hash to {h}"
            )
            assert len(key.tokens) == self.block_size, f"indexed block {b} is not full"
        num_dups = 0
        for h, dups in self._dups.items():
            assert dups and h in self._index, f"duplicates of hash {h} without its indexed block"
            for b in dups:
                assert self._indexed[b] and self._keys[b] is self._keys[self._index[h]], (
                    f"duplicate block {b} of hash {h} holds another prefix"
                )
            num_dups += len(dups)
        assert sum(self._indexed) == len(self._index) + num_dups, "blocks marked indexed but not in the index"
        num_children = 0
        for child_key, children in self._children.items():
            assert children, f"empty children set {child_key}"
            for b in children:
                key = self._keys[b]
                assert self._indexed[b] and child_key == (
                    None if key.parent is None else key.parent.hash,
                    key.extra_key,
                    key.tokens[0],
                ), f"block {b} misfiled under {child_key}"
            num_children += len(children)
        assert num_children == len(self._index), "children sets do not match the index"
        for b in evictable:
            assert self._indexed[b], f"evictable block {b} is not indexed"
        for b in free:
            assert not self._indexed[b], f"free block {b} is indexed"
