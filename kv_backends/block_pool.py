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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Hashable, Iterable, NamedTuple, Sequence

from metroline.kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT

if TYPE_CHECKING:
    from metroline.kv_backends.swap_space import SwapSpace


class PrefixHit(NamedTuple):
    """The cached prefix of a prompt, as found by `BlockPool.lookup`."""

    block_ids: list[int]
    """Blocks to share, in block-table order: full matched blocks, then possibly one partially
    matched block."""
    num_tokens: int
    """How many leading prompt tokens those blocks hold KV for."""


class _BlockKey:
    """What a full block holds KV for: `tokens` after the prefix of `parent`, under `extra_key`."""

    __slots__ = ("parent", "tokens", "extra_key", "hash")

    def __init__(
        self, parent: _BlockKey | None, tokens: tuple, extra_key: Hashable, h: int
    ) -> None:
        self.parent = parent
        self.tokens = tokens
        self.extra_key = extra_key
        self.hash = h


def _same_prefix(a: _BlockKey | None, b: _BlockKey | None) -> bool:
    """Whether two keys stand for the same token prefix: walks up to a shared ancestor (usually at
    once: a chain links to the indexed parent's key object)."""
    while a is not b:
        if (
            a is None
            or b is None
            or a.hash != b.hash
            or a.tokens != b.tokens
            or a.extra_key != b.extra_key
        ):
            return False
        a, b = a.parent, b.parent
    return True


class BlockPool:
    """A pool of `num_blocks` device blocks of `block_size` tokens each."""

    __slots__ = (
        "num_blocks",
        "block_size",
        "enable_prefix_caching",
        "partial_match",
        "pending",
        "peak_used_blocks",
        "_refs",
        "_keys",
        "_indexed",
        "_free",
        "_evictable",
        "_index",
        "_children",
        "_num_used",
    )

    _block_hash = staticmethod(hash)
    """Hash of `(parent_hash, tokens, extra_key)`; a class attribute so tests can collide it."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        partial_match: bool = True,
    ) -> None:
        assert num_blocks > 0 and block_size > 0, (num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.partial_match = partial_match
        """Whether `lookup` may end on a block that matches the prompt in part (token-granular,
        shared through copy-on-write); False matches whole blocks only, as vLLM does."""
        self.pending: set[int] = set()
        """Indexed blocks whose KV the current step has yet to write (the scheduler's set): a
        lookup may share them whole, never in part (a copy would run before the write)."""
        self.peak_used_blocks = 0
        self._refs = [0] * num_blocks
        # The key of a full, computed block; kept on blocks that are not indexed (a duplicate took
        # the hash) so that their children still chain.
        self._keys: list[_BlockKey | None] = [None] * num_blocks
        self._indexed = [False] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._index: dict[int, int] = {}  # hash -> block
        # (parent_hash, extra_key, first token) -> indexed blocks, for token-granular matching.
        self._children: dict[tuple, set[int]] = {}
        self._num_used = 0

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

    # -- prefix cache -------------------------------------------------------------------------

    def lookup(
        self, token_ids: Sequence[int], extra_key: Hashable = None, max_tokens: int | None = None
    ) -> PrefixHit:
        """Find the longest cached prefix of `token_ids` (no side effects).

        Full blocks are matched by chained hash (keys verified), then, with `partial_match`, one
        more block may match in part: the indexed child of the last matched block whose tokens
        share the longest common prefix with the next prompt tokens (not a `pending` one). At most `max_tokens` tokens are counted (callers pass
        `len(prompt) - 1` so that the last prompt token is always computed). The caller must
        `acquire` the returned blocks before anything else allocates from the pool.
        """
        if not self.enable_prefix_caching:
            return PrefixHit([], 0)
        bs = self.block_size
        limit = len(token_ids) if max_tokens is None else min(len(token_ids), max_tokens)
        index, keys, block_hash = self._index, self._keys, self._block_hash
        block_ids: list[int] = []
        parent: _BlockKey | None = None
        parent_hash = None
        pos = 0
        while pos + bs <= limit:
            tokens = tuple(token_ids[pos : pos + bs])
            b = index.get(block_hash((parent_hash, tokens, extra_key)))
            if b is None:
                break
            key = keys[b]
            if (
                key.tokens != tokens
                or key.extra_key != extra_key
                or not _same_prefix(key.parent, parent)
            ):
                break
            block_ids.append(b)
            parent, parent_hash = key, key.hash
            pos += bs
        n = min(bs, limit - pos)
        if n > 0 and self.partial_match:
            candidates = self._children.get((parent_hash, extra_key, token_ids[pos]))
            if candidates:
                best, best_len = -1, 0
                pending = self.pending
                for b in candidates:
                    key = keys[b]
                    if b in pending or not _same_prefix(key.parent, parent):
                        continue
                    tokens = key.tokens
                    k = 1
                    while k < n and tokens[k] == token_ids[pos + k]:
                        k += 1
                    if k > best_len:
                        best, best_len = b, k
                        if k == n:
                            break
                if best_len:
                    block_ids.append(best)
                    pos += best_len
        return PrefixHit(block_ids, pos)

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

    def cache_full_blocks(
        self,
        block_table: list[int],
        token_ids: Sequence[int],
        start_block: int,
        end_block: int,
        extra_key: Hashable = None,
    ) -> None:
        """Register `block_table[start_block:end_block]` (full, KV computed) in the prefix index.

        A block whose hash is already indexed (by itself or by a duplicate) is not indexed again,
        but it keeps its key so that later blocks chain on it. No-op without prefix caching.
        """
        if not self.enable_prefix_caching or start_block >= end_block:
            return
        bs = self.block_size
        assert end_block <= len(block_table) and end_block * bs <= len(token_ids), (
            f"blocks [{start_block}, {end_block}) not full: table {len(block_table)}, "
            f"tokens {len(token_ids)}"
        )
        keys, indexed, index = self._keys, self._indexed, self._index
        parent = self._key_of(block_table, token_ids, start_block - 1, extra_key)
        for i in range(start_block, end_block):
            b = block_table[i]
            assert self._refs[b] > 0, f"caching block {b} with ref count 0"
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            key = keys[b]
            if key is None:
                key = keys[b] = self._make_key(parent, tokens, extra_key)
            else:
                assert key.tokens == tokens, f"block {b} holds other tokens"
            if not indexed[b] and key.hash not in index:
                index[key.hash] = b
                indexed[b] = True
                child_key = (None if parent is None else parent.hash, extra_key, key.tokens[0])
                children = self._children.get(child_key)
                if children is None:
                    self._children[child_key] = {b}
                else:
                    children.add(b)
            parent = key

    def uncache(self, block_ids: Iterable[int]) -> set[int]:
        """Take blocks out of the prefix index (their KV was never written: the step that was to
        write them did not run it). Unreferenced ones become free. Returns those of them still
        referenced (shared by a prefix hit, so their holders must not use them)."""
        shared = set()
        indexed, refs = self._indexed, self._refs
        for b in block_ids:
            if not indexed[b]:
                continue
            self._unindex(b)
            if refs[b]:
                shared.add(b)
            else:
                del self._evictable[b]
                self._free.append(b)
        return shared

    def _make_key(
        self, parent: _BlockKey | None, tokens: tuple, extra_key: Hashable
    ) -> _BlockKey:
        """The key of `tokens` after `parent`: the indexed block's key object if it holds the same
        prefix (so that chains share key objects and compare by identity), else a new one."""
        h = self._block_hash((None if parent is None else parent.hash, tokens, extra_key))
        b = self._index.get(h)
        if b is not None:
            key = self._keys[b]
            if (
                key.tokens == tokens
                and key.extra_key == extra_key
                and _same_prefix(key.parent, parent)
            ):
                return key
        return _BlockKey(parent, tokens, extra_key, h)

    def _key_of(
        self, block_table: list[int], token_ids: Sequence[int], i: int, extra_key: Hashable
    ) -> _BlockKey | None:
        """The key of block i of the table (None for i < 0), made from the tokens and stored on the
        blocks that have none (fresh copies, swapped-in blocks)."""
        keys, bs = self._keys, self.block_size
        j = i
        while j >= 0 and keys[block_table[j]] is None:
            j -= 1
        key = keys[block_table[j]] if j >= 0 else None
        for k in range(j + 1, i + 1):
            key = keys[block_table[k]] = self._make_key(
                key, tuple(token_ids[k * bs : (k + 1) * bs]), extra_key
            )
        return key

    # -- allocation ---------------------------------------------------------------------------

    def allocate_slots(
        self, block_table: list[int], num_computed: int, num_new: int, ops: list
    ) -> bool:
        """Make `block_table` cover positions [0, num_computed + num_new) and the blocks this step
        writes (positions [num_computed, num_computed + num_new)) writable.

        A block to be written that is shared or indexed is copied first: `(COPY, old, new)` is
        appended to `ops`, `new` replaces `old` in the table and `old` loses one reference. Atomic:
        returns False, with nothing changed, if the free and evictable blocks are too few.
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
            new = self._allocate_block()
            ops.append((COPY, old, new))
            block_table[i] = new
            self._release_block(old)
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
        return b

    def _unindex(self, b: int) -> None:
        key = self._keys[b]
        del self._index[key.hash]
        child_key = (None if key.parent is None else key.parent.hash, key.extra_key, key.tokens[0])
        children = self._children[child_key]
        children.discard(b)
        if not children:
            del self._children[child_key]
        self._indexed[b] = False

    def _release_block(self, b: int) -> None:
        r = self._refs[b] - 1
        assert r >= 0, f"release of free block {b}"
        self._refs[b] = r
        if r == 0:
            self._num_used -= 1
            if self._indexed[b]:
                self._evictable[b] = None
            else:
                self._free.append(b)

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

    # -- swapping -----------------------------------------------------------------------------

    def swap_out(self, block_table: list[int], swap: SwapSpace, ops: list) -> list[int] | None:
        """Plan copying the table's blocks to host blocks and release the device references.

        Returns the host table, or None (nothing changed) if the swap space is too small.
        """
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

    # -- checks -------------------------------------------------------------------------------

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
        assert sum(self._indexed) == len(self._index), "blocks marked indexed but not in the index"
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
