"""Unit tests of the paged KV block pool and the host swap space, with exact expected values."""

import pytest

from metroline.core.step.plan import StepPlan
from metroline.kv_backends import COPY, SWAP_IN, SWAP_OUT, BlockPool, PrefixHit, SwapSpace
from metroline.kv_backends.prefix_index import block_chain
from metroline.kv_backends.prefix_keys import BlockKey, same_prefix

BS = 4


def counts(pool):
    return pool.num_free_blocks(), pool.num_cached_blocks(), pool.num_used_blocks()


def refs(pool):
    return [pool.ref_count(b) for b in range(pool.num_blocks)]


def admit(pool, prompt, extra_key=None):
    """What the scheduler does to admit a prompt: lookup, acquire, allocate the rest, cache."""
    hit = pool.lookup(prompt, extra_key, max_tokens=len(prompt) - 1)
    pool.acquire(hit.block_ids)
    table = list(hit.block_ids)
    ops = []
    assert pool.allocate_slots(table, hit.num_tokens, len(prompt) - hit.num_tokens, ops)
    pool.cache_full_blocks(table, prompt, hit.num_tokens // BS, len(prompt) // BS, extra_key)
    return table, hit, ops


A = list(range(100, 112))  # three full blocks


# -- allocation and release ---------------------------------------------------------------------


def test_allocate_and_release_counts():
    pool = BlockPool(8, BS)
    assert (pool.num_blocks, pool.block_size) == (8, BS)
    assert counts(pool) == (8, 0, 0)
    table, ops = [], []
    assert pool.allocate_slots(table, 0, 10, ops)
    assert table == [0, 1, 2] and ops == []
    assert counts(pool) == (5, 0, 3)
    assert refs(pool) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert pool.allocate_slots(table, 10, 1, ops)  # into the own last block
    assert table == [0, 1, 2]
    assert pool.allocate_slots(table, 11, 2, ops)  # fills block 2, opens block 3
    assert table == [0, 1, 2, 3] and ops == []
    assert counts(pool) == (4, 0, 4)
    assert pool.allocate_slots(table, 13, 0, ops)  # nothing to write, nothing to add
    assert table == [0, 1, 2, 3]
    pool.check_invariants([table])
    pool.release(table)
    assert counts(pool) == (8, 0, 0)
    assert pool.peak_used_blocks == 4
    pool.check_invariants([])


def test_allocate_slots_extends_a_short_table():
    pool = BlockPool(8, BS)
    table = []
    assert pool.allocate_slots(table, 6, 3, [])  # covers [0, 9): blocks for unwritten 0..5 too
    assert table == [0, 1, 2]
    pool.check_invariants([table])


def test_peak_used_blocks():
    pool = BlockPool(8, BS)
    a, b = [], []
    pool.allocate_slots(a, 0, 12, [])
    pool.allocate_slots(b, 0, 8, [])
    pool.release(a)
    pool.allocate_slots(a := [], 0, 4, [])
    assert pool.num_used_blocks() == 3
    assert pool.peak_used_blocks == 5


def test_peak_used_blocks_counts_the_cached_blocks_a_prefix_hit_takes_back():
    # the run's `kv_peak_blocks`: blocks a hit acquires from the cache count as used, like new ones
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A)
    pool.release(t1)  # A's 3 blocks cached, none used
    other = []
    pool.allocate_slots(other, 0, 8, [])
    assert (pool.num_used_blocks(), pool.peak_used_blocks) == (2, 3)
    hit = pool.lookup(A + [5])
    pool.acquire(hit.block_ids)
    assert (pool.num_used_blocks(), pool.peak_used_blocks) == (5, 5)
    pool.acquire(hit.block_ids)  # a second reference takes no further block
    assert (pool.num_used_blocks(), pool.peak_used_blocks) == (5, 5)


def test_peak_used_blocks_counts_the_blocks_a_swap_in_takes():
    pool, swap = BlockPool(8, BS), SwapSpace(4)
    assert pool.peak_used_blocks == 0  # a fresh pool has used nothing
    table, ops = [], []
    pool.allocate_slots(table, 0, 12, ops)
    host = pool.swap_out(table, swap, ops)
    other = []
    pool.allocate_slots(other, 0, 8, ops)
    assert (pool.num_used_blocks(), pool.peak_used_blocks) == (2, 3)
    back = pool.swap_in(host, swap, ops)
    assert len(back) == 3
    assert (pool.num_used_blocks(), pool.peak_used_blocks) == (5, 5)


# -- prefix hits --------------------------------------------------------------------------------


def test_prefix_hit_of_full_blocks():
    pool = BlockPool(8, BS)
    t1, hit, _ = admit(pool, A)
    assert hit == PrefixHit([], 0)
    assert t1 == [0, 1, 2]
    before = (counts(pool), refs(pool))
    assert pool.lookup(A + [7]) == PrefixHit([0, 1, 2], 12)
    assert pool.lookup(A + [7], max_tokens=12) == PrefixHit([0, 1, 2], 12)
    assert pool.lookup(A[:8] + [1, 2, 3, 4]) == PrefixHit([0, 1], 8)
    assert pool.lookup([1] + A) == PrefixHit([], 0)
    assert (counts(pool), refs(pool)) == before  # lookup has no side effects

    t2, hit, ops = admit(pool, A + [7, 8])
    assert hit == PrefixHit([0, 1, 2], 12)
    assert t2 == [0, 1, 2, 3] and ops == []
    assert refs(pool)[:4] == [2, 2, 2, 1]
    pool.check_invariants([t1, t2])


def test_released_blocks_stay_cached_and_hit():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A + [1, 2])
    pool.release(t1)
    assert counts(pool) == (8, 3, 0)  # 3 full blocks cached, the partial one freed
    hit = pool.lookup(A + [5])
    assert hit == PrefixHit([0, 1, 2], 12)
    pool.acquire(hit.block_ids)
    assert counts(pool) == (5, 0, 3)
    pool.check_invariants([hit.block_ids])


def test_token_granular_partial_hit():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A)
    prompt = A[:8] + [108, 109, 50, 51, 52]  # block 2 matches in its first 2 tokens
    hit = pool.lookup(prompt, max_tokens=len(prompt) - 1)
    assert hit == PrefixHit([0, 1, 2], 2 * BS + 2)
    pool.acquire(hit.block_ids)
    table, ops = list(hit.block_ids), []
    assert pool.allocate_slots(table, hit.num_tokens, len(prompt) - hit.num_tokens, ops)
    assert ops == [(COPY, 2, 3)]
    assert table == [0, 1, 3, 4]
    assert refs(pool)[:5] == [2, 2, 1, 1, 1]
    pool.check_invariants([t1, table])


def test_partial_hit_first_block_and_longest_prefix_wins():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    t2, _, _ = admit(pool, [1, 2, 3, 4, 5, 6, 9, 9])
    assert t2 == [0, 2]  # block 0 shared, block 1 partially matched ([5, 6]) then copied
    assert pool.lookup([1, 2, 9]) == PrefixHit([0], 2)
    assert pool.lookup([1, 2, 3, 4, 5, 6, 7, 0, 0]) == PrefixHit([0, 1], 7)
    assert pool.lookup([1, 2, 3, 4, 5, 6, 9, 0, 0]) == PrefixHit([0, 2], 7)
    assert pool.lookup([1, 2, 3, 4, 5, 0]) in (PrefixHit([0, 1], 5), PrefixHit([0, 2], 5))  # a tie
    assert pool.lookup([2, 2, 3, 4]) == PrefixHit([], 0)
    pool.check_invariants([t1, t2])


def test_max_tokens_cap():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A)
    assert pool.lookup(A, max_tokens=11) == PrefixHit([0, 1, 2], 11)
    assert pool.lookup(A, max_tokens=8) == PrefixHit([0, 1], 8)  # block 2 holds no counted token
    assert pool.lookup(A, max_tokens=5) == PrefixHit([0, 1], 5)
    assert pool.lookup(A, max_tokens=1) == PrefixHit([0], 1)
    assert pool.lookup(A, max_tokens=0) == PrefixHit([], 0)
    assert pool.lookup(A[:9], max_tokens=8) == PrefixHit([0, 1], 8)

    # The same prompt again: all but its last token hit, the last block is copied before the write.
    t2, hit, ops = admit(pool, A)
    assert hit == PrefixHit([0, 1, 2], 11)
    assert ops == [(COPY, 2, 3)]
    assert t2 == [0, 1, 3]
    pool.check_invariants([t1, t2])


def test_extra_key_separates_caches():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A, extra_key="salt-a")
    assert pool.lookup(A, "salt-a") == PrefixHit([0, 1, 2], 12)
    assert pool.lookup(A, "salt-b") == PrefixHit([], 0)
    assert pool.lookup(A) == PrefixHit([], 0)
    assert pool.lookup(A[:2] + [0], "salt-b") == PrefixHit([], 0)  # no partial hit across salts
    pool.check_invariants([t1])


def test_duplicate_content_keeps_chaining():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A[:8])
    # A second request computes the same two blocks itself (no lookup), then a third one.
    t2, ops = [], []
    assert pool.allocate_slots(t2, 0, 12, ops)
    assert t2 == [2, 3, 4]
    pool.cache_full_blocks(t2, A, 0, 3)
    # Blocks 2 and 3 duplicate 0 and 1, indexed behind them; block 4 chains on them.
    assert pool.lookup(A + [0]) == PrefixHit([0, 1, 4], 12)
    pool.release(t2)
    assert counts(pool) == (6, 3, 2)  # blocks 2, 3 and 4 cached
    pool.check_invariants([t1])


def test_a_recomputed_last_block_stays_cached_as_a_duplicate_and_keeps_its_hash_alive():
    # vLLM: a prompt cached whole recomputes its last block into a new block of the same hash;
    # both stay cached, a lookup takes the oldest, evicting one leaves the hash to the other
    pool = BlockPool(6, BS, partial_match=False)
    t1, _, _ = admit(pool, A[:8])  # blocks 0, 1
    pool.release(t1)
    t2, hit, _ = admit(pool, A[:8])  # hits block 0 (the last token is always computed): block 1 again
    assert (hit, t2) == (PrefixHit([0], 4), [0, 2])
    pool.check_invariants([t2])
    pool.release(t2)
    assert counts(pool) == (6, 3, 0)  # 0, 1 and its duplicate 2, all cached
    assert pool.lookup(A[:8]) == PrefixHit([0, 1], 8)  # the oldest
    # the free list first, then evict in LRU order (1 was released first, then t2's tail 2, then
    # 0): 1 leaves, its duplicate 2 takes the hash
    table, ops = [], []
    assert pool.allocate_slots(table, 0, 4 * BS, ops)
    assert table == [3, 4, 5, 1]
    assert pool.lookup(A[:8]) == PrefixHit([0, 2], 8)
    pool.check_invariants([table])
    assert pool.allocate_slots(table, 4 * BS, BS, ops) and table[-1] == 2  # the duplicate goes next
    assert pool.lookup(A[:8]) == PrefixHit([0], 4)
    pool.check_invariants([table])


def test_cache_full_blocks_is_idempotent_and_recomputes_missing_parent_hashes():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A)
    pool.cache_full_blocks(t1, A, 0, 3)  # already indexed: left as is
    assert pool.lookup(A) == PrefixHit([0, 1, 2], 12)
    # A table whose leading blocks carry no hash (as after a swap-in): block 2 still chains right.
    t2 = []
    pool.allocate_slots(t2, 0, 16, [])
    pool.cache_full_blocks(t2, A + [9, 9, 9, 9], 3, 4)
    assert t2 == [3, 4, 5, 6]
    assert pool.lookup(A + [9, 9, 9, 9, 0]) == PrefixHit([0, 1, 2, 6], 16)
    pool.check_invariants([t1, t2])


# -- copy-on-write and fork ---------------------------------------------------------------------


def test_copy_on_write_into_shared_block():
    pool = BlockPool(8, BS)
    t1, ops = [], []
    pool.allocate_slots(t1, 0, 6, ops)
    assert t1 == [0, 1]
    t2 = pool.fork(t1)
    assert t2 == [0, 1] and t2 is not t1
    assert refs(pool)[:2] == [2, 2]
    assert pool.allocate_slots(t2, 6, 1, ops)
    assert ops == [(COPY, 1, 2)]
    assert t2 == [0, 2] and t1 == [0, 1]
    assert refs(pool)[:3] == [2, 1, 1]
    ops.clear()
    assert pool.allocate_slots(t1, 6, 1, ops)  # the parent is the only owner now: writes in place
    assert ops == [] and t1 == [0, 1]
    pool.check_invariants([t1, t2])


def test_fork_three_children_first_writers_copy_last_writes_in_place():
    pool = BlockPool(8, BS)
    parent = []
    pool.allocate_slots(parent, 0, 5, [])
    children = [pool.fork(parent) for _ in range(2)]
    assert refs(pool)[:2] == [3, 3]
    pool.release(parent)  # the parent hands its blocks to the children
    pool.fork(children[0])  # and a third child
    tables = children + [list(children[0])]
    assert refs(pool)[:2] == [3, 3]
    all_ops = []
    for table in tables:
        ops = []
        assert pool.allocate_slots(table, 5, 1, ops)
        all_ops.append(ops)
    assert all_ops == [[(COPY, 1, 2)], [(COPY, 1, 3)], []]
    assert [t[1] for t in tables] == [2, 3, 1]
    assert refs(pool)[:4] == [3, 1, 1, 1]
    pool.check_invariants(tables)


def test_write_after_shared_full_block_needs_no_copy():
    pool = BlockPool(8, BS)
    t1 = []
    pool.allocate_slots(t1, 0, 4, [])
    t2 = pool.fork(t1)
    ops = []
    assert pool.allocate_slots(t2, 4, 1, ops)
    assert ops == [] and t2 == [0, 1]
    pool.check_invariants([t1, t2])


def test_copy_on_write_into_own_indexed_block():
    pool = BlockPool(8, BS)
    t1, _, _ = admit(pool, A)
    pool.release(t1)
    hit = pool.lookup(A, max_tokens=11)
    pool.acquire(hit.block_ids)
    table, ops = list(hit.block_ids), []
    assert refs(pool)[:3] == [1, 1, 1]
    assert pool.allocate_slots(table, 11, 1, ops)  # block 2 is indexed: copied, not overwritten
    assert ops == [(COPY, 2, 3)] and table == [0, 1, 3]
    assert counts(pool) == (5, 1, 3)  # block 2 back to the cache
    assert pool.lookup(A) == PrefixHit([0, 1, 2], 12)
    pool.check_invariants([table])


def test_multi_block_write_copies_each_shared_block():
    pool = BlockPool(8, BS)
    t1 = []
    pool.allocate_slots(t1, 0, 8, [])
    t2 = pool.fork(t1)
    ops = []
    assert pool.allocate_slots(t2, 2, 7, ops)  # rewrites positions 2..8 (e.g. a rollback)
    assert ops == [(COPY, 0, 2), (COPY, 1, 3)]
    assert t2 == [2, 3, 4]
    pool.check_invariants([t1, t2])


# -- eviction -----------------------------------------------------------------------------------


def test_lru_eviction_order():
    pool = BlockPool(4, BS)
    x, y = [1, 2, 3, 4, 5, 6, 7, 8], [11, 12, 13, 14, 15, 16, 17, 18]
    tx, _, _ = admit(pool, x)
    ty, _, _ = admit(pool, y)
    assert (tx, ty) == ([0, 1], [2, 3])
    pool.release(tx)  # tail first: LRU order 1, 0
    pool.release(ty)  # then 3, 2
    assert counts(pool) == (4, 4, 0)

    t = []
    assert pool.allocate_slots(t, 0, 1, [])
    assert t == [1]  # the tail of x was least recently used
    assert pool.lookup(x) == PrefixHit([0], 4)  # an evicted block no longer hits
    pool.allocate_slots(t, 1, 4, [])
    assert t == [1, 0]
    assert pool.lookup(x) == PrefixHit([], 0)
    assert pool.lookup(y) == PrefixHit([2, 3], 8)
    pool.check_invariants([t])


def test_free_list_is_used_before_eviction_and_acquire_refreshes_lru():
    pool = BlockPool(6, BS)
    tx, _, _ = admit(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    ty, _, _ = admit(pool, [11, 12, 13, 14])
    pool.release(tx)
    pool.release(ty)  # LRU order: 1, 0, 2
    hit = pool.lookup([1, 2, 3, 4, 0])
    pool.acquire(hit.block_ids)
    pool.release(hit.block_ids)  # block 0 is now most recently used: 1, 2, 0
    t = []
    assert pool.allocate_slots(t, 0, 16, [])
    assert t == [3, 4, 5, 1]  # free blocks first, then the LRU cached block
    pool.allocate_slots(t, 16, 1, [])
    assert t[-1] == 2
    assert pool.lookup([1, 2, 3, 4, 0]) == PrefixHit([0], 4)
    pool.check_invariants([t])


# -- hash collisions ----------------------------------------------------------------------------


class CollidingPool(BlockPool):
    """Every block key hashes to the same value."""

    _block_hash = staticmethod(lambda key: 42)


class SaltBlindPool(BlockPool):
    """The hash ignores the extra key: keys differing only in it collide."""

    _block_hash = staticmethod(lambda key: hash(key[:2]))


def test_hash_collision_never_hands_out_wrong_kv():
    pool = CollidingPool(8, BS)
    t1, _, _ = admit(pool, A[:8])
    assert pool.num_cached_blocks() == 0 and len(pool._index) == 1  # only block 0 got the hash
    assert pool.lookup([50, 51, 52, 53, 54, 55, 56, 57]) == PrefixHit([], 0)
    assert pool.lookup(A[:4] + [60, 61, 62, 63, 64]) == PrefixHit([0], 4)
    assert pool.lookup(A[:8] + [1]) == PrefixHit([0], 4)  # block 1 collides with block 0: no hit
    assert pool.lookup(A[:2]) == PrefixHit([0], 2)  # a true partial match is still found
    pool.check_invariants([t1])
    pool.release(t1)
    pool.check_invariants([])


def test_hash_collision_across_extra_keys():
    pool = SaltBlindPool(8, BS)
    t1, _, _ = admit(pool, A, extra_key="x")
    assert pool.lookup(A, "x") == PrefixHit([0, 1, 2], 12)
    assert pool.lookup(A, "y") == PrefixHit([], 0)
    assert pool.lookup(A) == PrefixHit([], 0)
    t2, hit, _ = admit(pool, A, extra_key="y")
    assert hit == PrefixHit([], 0) and t2 == [3, 4, 5]
    assert pool.lookup(A, "y") == PrefixHit([], 0)  # its hashes were taken: not indexed
    pool.check_invariants([t1, t2])


class FirstBlocksCollidePool(BlockPool):
    """Every first block hashes to 1; deeper blocks hash normally (on a colliding parent hash)."""

    _block_hash = staticmethod(lambda key: 1 if key[0] is None else hash(key))


def test_collision_of_an_ancestor_never_hands_out_wrong_kv():
    pool = FirstBlocksCollidePool(6, BS)
    a0, x, b0 = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    t1, _, _ = admit(pool, a0 + x)
    assert t1 == [0, 1]
    pool.release(t1)
    pool.acquire([1])  # keep block 1 (x after a0) cached and in use; evict block 0 (a0)
    t = []
    assert pool.allocate_slots(t, 0, 5 * BS, [])
    assert t == [2, 3, 4, 5, 0]
    pool.release(t)
    t2, hit, _ = admit(pool, b0 + x + [0])
    assert hit == PrefixHit([], 0)
    assert t2 == [2, 3, 4]  # b0 (block 2) now holds hash 1, as a0 did
    # x after b0 has the hash of x after a0, but block 1 was computed after a0: no hit.
    assert pool.lookup(b0 + x + [0]) == PrefixHit([2], 4)
    assert pool.lookup(a0 + x + [0]) == PrefixHit([], 0)
    pool.check_invariants([[1], t2])


def test_reallocated_block_forgets_its_content():
    pool = BlockPool(5, BS)
    t1, _, _ = admit(pool, A[:8])
    t2 = []
    pool.allocate_slots(t2, 0, 8, [])
    pool.cache_full_blocks(t2, A[:8], 0, 2)  # duplicates of blocks 0 and 1
    pool.release(t2)
    b = [50 + i for i in range(12)]
    t3 = []
    pool.allocate_slots(t3, 0, 12, [])
    assert t3 == [4, 3, 2]  # the free block, then the former duplicates (LRU), reused for other tokens
    pool.cache_full_blocks(t3, b, 2, 3)  # must chain on b's tokens, not on the old content
    assert pool.lookup(A[:8] + b[8:12] + [0]) == PrefixHit([0, 1], 8)
    pool.cache_full_blocks(t3, b, 0, 2)
    assert pool.lookup(b + [0]) == PrefixHit([4, 3, 2], 12)
    pool.check_invariants([t1, t3])


# -- swapping -----------------------------------------------------------------------------------


def test_swap_out_and_in_round_trip():
    pool, swap = BlockPool(8, BS), SwapSpace(4)
    prompt = A[:10]
    table, _, _ = admit(pool, prompt)
    assert table == [0, 1, 2]
    ops = []
    host = pool.swap_out(table, swap, ops)
    assert host == [0, 1, 2]
    assert ops == [(SWAP_OUT, 0, 0), (SWAP_OUT, 1, 1), (SWAP_OUT, 2, 2)]
    assert counts(pool) == (8, 2, 0)  # the full blocks stay cached on the device
    assert swap.num_free_blocks() == 1
    pool.check_invariants([])

    ops = []
    device = pool.swap_in(host, swap, ops)
    assert device == [2, 3, 4]
    assert ops == [(SWAP_IN, 0, 2), (SWAP_IN, 1, 3), (SWAP_IN, 2, 4)]
    assert swap.num_free_blocks() == 4
    assert refs(pool)[:5] == [0, 0, 1, 1, 1]
    ops = []
    assert pool.allocate_slots(device, 10, 1, ops) and ops == []  # fresh, unindexed: writable
    pool.check_invariants([device])


# -- pending slots: KV the step's forward has yet to write --------------------------------------


def registered_in_step(pool, prompt, computed_before=0):
    """A registrant scheduled in this step: its blocks up to the last full one are indexed and
    pending from `computed_before` (its tokens computed before the step) on."""
    table = []
    assert pool.allocate_slots(table, 0, len(prompt), [])
    full = len(prompt) // BS
    pool.mark_pending(table, 0, full, computed_before)
    pool.cache_full_blocks(table, prompt, 0, full)
    return table


def test_a_swap_out_refuses_a_hit_of_blocks_the_step_has_yet_to_write():
    pool, swap = BlockPool(8, BS), SwapSpace(8)
    a = registered_in_step(pool, A[:9])  # a fills blocks 0 and 1 in this step
    assert pool.pending == {0: 0, 1: 0}
    hit = pool.lookup(A[:8] + [7], None, 8)
    assert hit == PrefixHit([0, 1], 8)
    pool.acquire(hit.block_ids)
    b = list(hit.block_ids)
    assert pool.allocate_slots(b, 8, 1, [])
    ops = []
    assert pool.swap_out(b, swap, ops, num_computed=8) is None  # b's 8 computed tokens: not written yet
    assert pool.swap_out(b, swap, ops) is None  # every slot of the table: the same
    assert ops == [] and swap.num_free_blocks() == 8 and refs(pool)[:3] == [2, 2, 1]
    pool.check_invariants([a, b])
    # once the step's forward ran, nothing is pending: the same table swaps out
    pool.clear_pending()
    assert pool.swap_out(b, swap, ops, num_computed=8) == [0, 1, 2]
    assert ops == [(SWAP_OUT, 0, 0), (SWAP_OUT, 1, 1), (SWAP_OUT, 3, 2)]


def test_the_registrant_itself_swaps_out_what_it_computed_before_the_step():
    pool, swap = BlockPool(8, BS), SwapSpace(8)
    # 6 tokens computed before the step; this step writes positions 6..9, filling block 1 from
    # its slot 2 on
    a = registered_in_step(pool, A[:10], computed_before=6)
    assert pool.pending == {0: 6, 1: 2}  # block 0: 6 >= 4, nothing of it is pending
    assert not pool.reads_pending(a, 6)
    assert pool.reads_pending(a, 7)  # position 6 is block 1's slot 2
    ops = []
    assert pool.swap_out(a, swap, ops, num_computed=6) == [0, 1, 2]
    assert ops == [(SWAP_OUT, 0, 0), (SWAP_OUT, 1, 1), (SWAP_OUT, 2, 2)]


def test_a_block_leaves_the_pending_ones_when_it_leaves_the_index_or_is_handed_out_again():
    pool = BlockPool(3, BS)
    a = registered_in_step(pool, A[:8])
    assert pool.pending == {0: 0, 1: 0}
    pool.release(a)
    assert pool.uncache([1]) == set() and pool.pending == {0: 0}  # its step will not write it
    t = []
    assert pool.allocate_slots(t, 0, 12, [])  # the free block 2, block 1, then block 0 evicted
    assert sorted(t) == [0, 1, 2] and pool.pending == {}
    pool.check_invariants([t])


def test_a_copy_on_write_never_reads_a_pending_slot():
    pool = BlockPool(8, BS)
    a = registered_in_step(pool, A[:8])
    b = pool.fork(a)  # not a path the scheduler takes: shares blocks written in this step
    with pytest.raises(AssertionError, match="copy-on-write of block 1, whose KV this step has yet to write"):
        pool.allocate_slots(b, 7, 1, [])
    # the registrant's own table, from where it computed before the step: nothing pending is read
    c = registered_in_step(BlockPool(8, BS), A[:8], computed_before=7)
    assert c == [0, 1]


# -- atomic failures ----------------------------------------------------------------------------


def test_allocate_slots_failure_changes_nothing():
    pool = BlockPool(3, BS)
    t1 = []
    pool.allocate_slots(t1, 0, 6, [])
    t2 = pool.fork(t1)
    before = (counts(pool), refs(pool))
    ops = []
    assert not pool.allocate_slots(t2, 6, 3, ops)  # one copy + one new block, one free
    assert t2 == [0, 1] and ops == []
    assert (counts(pool), refs(pool)) == before
    assert not pool.allocate_slots(t3 := [], 0, 8, ops)
    assert t3 == [] and ops == []
    assert pool.allocate_slots(t2, 6, 1, ops)  # the copy alone fits
    assert ops == [(COPY, 1, 2)]
    pool.check_invariants([t1, t2])


def test_allocate_slots_counts_evictable_blocks_as_free():
    pool = BlockPool(2, BS)
    t1, _, _ = admit(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    pool.release(t1)
    t = []
    assert pool.allocate_slots(t, 0, 8, [])
    assert t == [1, 0] and pool.num_cached_blocks() == 0
    assert pool.lookup([1, 2, 3, 4, 5]) == PrefixHit([], 0)
    pool.check_invariants([t])


def test_swap_out_failure_changes_nothing():
    pool, swap = BlockPool(8, BS), SwapSpace(2)
    table = []
    pool.allocate_slots(table, 0, 12, [])
    ops = []
    assert pool.swap_out(table, swap, ops) is None
    assert ops == [] and table == [0, 1, 2]
    assert refs(pool)[:3] == [1, 1, 1] and swap.num_free_blocks() == 2
    pool.check_invariants([table])


def test_swap_in_failure_changes_nothing():
    pool, swap = BlockPool(4, BS), SwapSpace(4)
    table = []
    pool.allocate_slots(table, 0, 12, [])
    host = pool.swap_out(table, swap, [])
    other = []
    pool.allocate_slots(other, 0, 8, [])
    ops = []
    assert pool.swap_in(host, swap, ops) is None
    assert ops == [] and swap.num_free_blocks() == 1
    assert counts(pool) == (2, 0, 2)
    pool.release(other)
    assert pool.swap_in(host, swap, ops) == [0, 1, 2]
    assert ops == [(SWAP_IN, 0, 0), (SWAP_IN, 1, 1), (SWAP_IN, 2, 2)]
    assert swap.num_free_blocks() == 4


# -- prefix caching disabled --------------------------------------------------------------------


def test_disabled_prefix_caching():
    pool = BlockPool(8, BS, enable_prefix_caching=False)
    t1, hit, _ = admit(pool, A)
    assert hit == PrefixHit([], 0)
    assert pool.lookup(A) == PrefixHit([], 0)
    pool.release(t1)
    assert counts(pool) == (8, 0, 0)
    t2, hit, ops = admit(pool, A)
    assert hit == PrefixHit([], 0) and ops == []
    pool.check_invariants([t2])


# -- invariant checker and swap space -----------------------------------------------------------


def test_check_invariants_detects_a_missing_reference():
    pool = BlockPool(4, BS)
    t = []
    pool.allocate_slots(t, 0, 8, [])
    with pytest.raises(AssertionError, match="ref count"):
        pool.check_invariants([t[:1]])


def test_release_of_a_free_block_asserts():
    pool = BlockPool(4, BS)
    with pytest.raises(AssertionError):
        pool.release([0])


def test_a_swap_in_that_fills_the_free_blocks_exactly_fits():
    pool, swap = BlockPool(4, BS, enable_prefix_caching=False), SwapSpace(4)
    table, ops = [], []
    pool.allocate_slots(table, 0, 16, ops)  # all 4 blocks
    host = pool.swap_out(table, swap, ops)
    assert pool.num_free_blocks() == 4
    back = pool.swap_in(host, swap, ops)
    assert back is not None and len(back) == 4 and pool.num_free_blocks() == 0
    host = pool.swap_out(back, swap, ops)
    other = []
    pool.allocate_slots(other, 0, 1, ops)  # one block taken: the 4 host blocks no longer fit
    assert pool.swap_in(host, swap, ops) is None and swap.num_free_blocks() == 0


def test_a_pool_needs_at_least_one_block_of_at_least_one_token():
    assert BlockPool(1, 1).num_free_blocks() == 1
    for num_blocks, block_size in ((0, BS), (-1, BS), (4, 0)):
        with pytest.raises(AssertionError):
            BlockPool(num_blocks, block_size)
    assert SwapSpace(0).num_free_blocks() == 0  # no swap space at all
    with pytest.raises(AssertionError):
        SwapSpace(-1)


def test_check_invariants_detects_an_index_entry_for_an_unindexed_block():
    pool = BlockPool(8, BS)
    table, _, _ = admit(pool, A)
    pool.check_invariants([table])
    pool._indexed[table[0]] = False  # the index still maps block 0's hash to it
    with pytest.raises(AssertionError, match="stale"):
        pool.check_invariants([table])


def test_check_invariants_detects_a_duplicate_list_that_is_empty_or_has_no_indexed_block():
    def with_duplicates():
        pool = BlockPool(8, BS)
        t1, _, _ = admit(pool, A[:8])
        t2 = []
        assert pool.allocate_slots(t2, 0, 8, [])
        pool.cache_full_blocks(t2, A[:8], 0, 2)  # blocks 2 and 3 duplicate 0 and 1
        pool.check_invariants([t1, t2])
        return pool, [t1, t2]

    pool, tables = with_duplicates()
    h = next(iter(pool._dups))
    pool._dups[h] = []  # the hash keeps an entry with no duplicate in it
    with pytest.raises(AssertionError, match=f"duplicates of hash {h} without its indexed block"):
        pool.check_invariants(tables)
    pool, tables = with_duplicates()
    h = next(iter(pool._dups))
    pool._dups[h + 1] = pool._dups.pop(h)  # duplicates filed under a hash the index lacks
    with pytest.raises(AssertionError, match=f"duplicates of hash {h + 1} without its indexed block"):
        pool.check_invariants(tables)


def test_cached_blocks_counts_the_indexed_prefix_and_nothing_without_prefix_caching():
    chain = block_chain(A + [5], BS, len(A))
    pool = BlockPool(8, BS)
    admit(pool, A)
    assert pool.cached_blocks(chain) == 3
    assert pool.cached_blocks(chain, at_least=3) == 3 and pool.cached_blocks(chain, at_least=4) == 0
    off = BlockPool(8, BS, enable_prefix_caching=False)
    admit(off, A)
    assert off.cached_blocks(chain) == 0


def test_caching_blocks_the_table_or_the_tokens_do_not_fill_is_refused():
    pool = BlockPool(8, BS)
    table = []
    pool.allocate_slots(table, 0, 8, [])  # two blocks
    with pytest.raises(AssertionError, match="not full"):
        pool.cache_full_blocks(table, A, 0, 3)  # a third block the table does not have
    with pytest.raises(AssertionError, match="not full"):
        pool.cache_full_blocks(table, A[:7], 0, 2)  # the second block holds 3 tokens
    pool.cache_full_blocks(table, A[:8], 0, 2)
    assert pool.lookup(A[:8] + [1]) == PrefixHit(table, 8)


def test_same_prefix_compares_hash_tokens_and_extra_key_up_to_a_shared_ancestor():
    root = BlockKey(None, (1, 2, 3, 4), None, 11)
    a = BlockKey(root, (5, 6, 7, 8), None, 22)
    twin = BlockKey(root, (5, 6, 7, 8), None, 22)  # another object for the same prefix
    assert same_prefix(a, a) and same_prefix(a, twin) and same_prefix(None, None)
    assert not same_prefix(a, BlockKey(root, (5, 6, 7, 8), None, 23))  # another hash
    assert not same_prefix(a, BlockKey(root, (5, 6, 7, 9), None, 22))  # other tokens
    assert not same_prefix(a, BlockKey(root, (5, 6, 7, 8), "salt", 22))  # another extra key
    assert not same_prefix(a, None) and not same_prefix(None, a)
    other_root = BlockKey(None, (1, 2, 3, 0), None, 11)
    assert not same_prefix(a, BlockKey(other_root, (5, 6, 7, 8), None, 22))  # the parents differ


def test_the_block_operation_kinds_are_told_apart():
    # a plan's operations are (kind, src, dst) tuples; an executor and the plan's accessors
    # dispatch on the kind, so a copy must never read as a swap
    plan = StepPlan(1, BS)
    plan.block_ops = [(COPY, 1, 2), (SWAP_OUT, 3, 4), (SWAP_IN, 5, 6)]
    assert (plan.copies(), plan.swap_outs(), plan.swap_ins()) == ([(1, 2)], [(3, 4)], [(5, 6)])


def test_swap_space():
    swap = SwapSpace(3)
    assert swap.num_blocks == 3
    assert swap.allocate(4) is None and swap.num_free_blocks() == 3
    assert swap.allocate(0) == []
    assert swap.allocate(2) == [0, 1]
    assert swap.allocate(2) is None
    assert swap.allocate(1) == [2]
    swap.free([1])
    with pytest.raises(AssertionError, match="not allocated"):
        swap.free([1])
    assert swap.num_free_blocks() == 1
    assert swap.allocate(1) == [1]


def test_pool_parts_share_one_slotted_state():
    """The pool's parts (prefix index, swap planning, checks) are mixins over one slotted state: an
    instance has no `__dict__`, so a typo'd attribute is an error rather than a silent new field."""
    pool = BlockPool(4, 2)
    assert not hasattr(pool, "__dict__")
    with pytest.raises(AttributeError):
        pool.num_blocs = 3
