"""The prefix index of `BlockPool`: lookups, registering computed blocks and taking them out.

The index maps the chained hash of each full, computed block to the block (`_index`), and
`(parent_hash, extra_key, first token)` to the indexed children of a block (`_children`), for
token-granular matching. Keys are verified on every hit (see `prefix_keys`).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

from .pool_state import PoolState
from .prefix_keys import BlockKey, PrefixHit, same_prefix


class PrefixIndex(PoolState):
    """The prefix-cache part of `BlockPool` (a mixin over the pool's state, `PoolState`)."""

    __slots__ = ()

    def lookup(
        self, token_ids: Sequence[int], extra_key: Hashable = None, max_tokens: int | None = None
    ) -> PrefixHit:
        """Find the longest cached prefix of `token_ids` (no side effects).

        Full blocks are matched by chained hash (keys verified), then, with `partial_match`, one
        more block may match in part: the indexed child of the last matched block whose tokens
        share the longest common prefix with the next prompt tokens (not a `pending` one). At most
        `max_tokens` tokens are counted (callers pass `len(prompt) - 1` so that the last prompt
        token is always computed). The caller must `acquire` the returned blocks before anything
        else allocates from the pool.
        """
        if not self.enable_prefix_caching:
            return PrefixHit([], 0)
        bs = self.block_size
        limit = len(token_ids) if max_tokens is None else min(len(token_ids), max_tokens)
        index, keys, block_hash = self._index, self._keys, self._block_hash
        block_ids: list[int] = []
        parent: BlockKey | None = None
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
                or not same_prefix(key.parent, parent)
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
                    if b in pending or not same_prefix(key.parent, parent):
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

    def cached_blocks(self, chain: Sequence[tuple[int, tuple]], at_least: int = 0) -> int:
        """How many leading full blocks of a prompt the index holds (no side effects on the pool),
        from the prompt's block chain `[(chained hash, tokens), ...]` with no extra key (see
        `block_chain`): the whole-block part of `lookup`, for callers that ask several pools about
        one prompt (a cluster's router) and hash it once. Blocks are found by chained hash and
        linked parent to child; the tokens of the last block found are verified (and, on a
        mismatch, those of its parents, in turn), which is enough to make a router's estimate; the
        engine's own `lookup` verifies every block before it shares one.

        `at_least`: the answer when it is at least that many blocks, else 0 (a caller that only
        wants a hit longer than one it has: one probe when block `at_least` is not indexed).

        The blocks that earlier calls found linked from the root are remembered (by chained hash,
        until a block leaves the index), so a prefix that many prompts share is walked once: a
        binary search over the chain finds how far the remembered blocks reach, and the walk goes
        on from there. The answer is the plain walk's (given distinct prefixes hash apart, as the
        walk itself assumes)."""
        if not self.enable_prefix_caching:
            return 0
        index = self._index
        size = len(chain)
        if at_least and (at_least > size or chain[at_least - 1][0] not in index):
            return 0
        memo = self._route_memo
        if self._route_epoch != self._unindexed:
            memo.clear()
            self._route_epoch = self._unindexed
        # The remembered blocks of this chain are a prefix of it: find its length.
        # (Galloping back from the end, as most of a prompt is usually its shared part.)
        lo = 0
        if memo and size:
            hi, step = size, 1  # hi: the least count known too long, once a probe has missed
            while True:
                if chain[hi - 1][0] in memo:
                    lo = hi
                    break
                hi, step = hi - step, step << 1
                if hi <= 0:
                    break
            # the count is in [lo, hi + step/2) now: binary search it
            if lo < size:
                hi = min(size, lo + (step >> 1)) - 1
                while lo < hi:
                    mid = (lo + hi + 1) >> 1
                    if chain[mid - 1][0] in memo:
                        lo = mid
                    else:
                        hi = mid - 1
        n = lo
        parent: BlockKey | None = memo[chain[n - 1][0]] if n else None
        keys = self._keys
        for i in range(n, size):
            h = chain[i][0]
            b = index.get(h)
            if b is None:
                break
            key = keys[b]
            if key.parent is not parent and not same_prefix(key.parent, parent):
                break
            memo[h] = parent = key
            n += 1
        while parent is not None and (parent.tokens != chain[n - 1][1] or parent.extra_key is not None):
            parent, n = parent.parent, n - 1  # a hash collision: back to the last block that matches
        return n if n >= at_least else 0

    def cache_full_blocks(
        self,
        block_table: list[int],
        token_ids: Sequence[int],
        start_block: int,
        end_block: int,
        extra_key: Hashable = None,
    ) -> None:
        """Register `block_table[start_block:end_block]` (full, KV computed) in the prefix index.

        A block of the same prefix as an indexed one (recomputed while its twin was cached: the
        last block of a prompt that was cached whole) is indexed too, as the twin's duplicate: a
        lookup takes the oldest; evicting one leaves the hash to the next. A block whose hash is
        indexed for other tokens (a collision) is not indexed, but it keeps its key so that later
        blocks chain on it. No-op without prefix caching.
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
            if indexed[b]:
                pass
            elif key.hash in index:
                if keys[index[key.hash]] is key:  # the same prefix (`_make_key` shares key objects)
                    self._dups.setdefault(key.hash, []).append(b)
                    indexed[b] = True
            else:
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
            self.pending.pop(b, None)
            if refs[b]:
                shared.add(b)
            else:
                del self._evictable[b]
                self._free.append(b)
        return shared

    def _make_key(
        self, parent: BlockKey | None, tokens: tuple, extra_key: Hashable
    ) -> BlockKey:
        """The key of `tokens` after `parent`: the indexed block's key object if it holds the same
        prefix (so that chains share key objects and compare by identity), else a new one."""
        h = self._block_hash((None if parent is None else parent.hash, tokens, extra_key))
        b = self._index.get(h)
        if b is not None:
            key = self._keys[b]
            if (
                key.tokens == tokens
                and key.extra_key == extra_key
                and same_prefix(key.parent, parent)
            ):
                return key
        return BlockKey(parent, tokens, extra_key, h)

    def _key_of(
        self, block_table: list[int], token_ids: Sequence[int], i: int, extra_key: Hashable
    ) -> BlockKey | None:
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

    def _unindex(self, b: int) -> None:
        key = self._keys[b]
        h = key.hash
        self._indexed[b] = False
        dups = self._dups.get(h)
        if self._index[h] != b:  # a duplicate leaves; its twin keeps the hash
            dups.remove(b)
            if not dups:
                del self._dups[h]
            return
        child_key = (None if key.parent is None else key.parent.hash, key.extra_key, key.tokens[0])
        children = self._children[child_key]
        children.discard(b)
        if dups:  # the next oldest duplicate (same key object) takes the hash
            twin = self._index[h] = dups.pop(0)
            if not dups:
                del self._dups[h]
            children.add(twin)
            return
        del self._index[h]
        self._unindexed += 1
        if not children:
            del self._children[child_key]


def block_chain(token_ids: Sequence[int], block_size: int, max_tokens: int) -> list[tuple[int, tuple]]:
    """`[(chained hash, tokens), ...]` of the full blocks among the first `max_tokens` of
    `token_ids`, hashed as the pool hashes them with no extra key (`PrefixIndex.cached_blocks`)."""
    return extend_chain([], token_ids, block_size, min(len(token_ids), max_tokens))


def extend_chain(chain: list[tuple[int, tuple]], token_ids: Sequence[int], block_size: int,
                 stop: int) -> list[tuple[int, tuple]]:
    """A new chain: `chain` (that of the first `len(chain)` full blocks of `token_ids`) and the
    full blocks after it among the first `stop` tokens."""
    out = list(chain)
    parent_hash = chain[-1][0] if chain else None
    for pos in range(len(chain) * block_size, stop - block_size + 1, block_size):
        tokens = tuple(token_ids[pos : pos + block_size])
        parent_hash = hash((parent_hash, tokens, None))
        out.append((parent_hash, tokens))
    return out
