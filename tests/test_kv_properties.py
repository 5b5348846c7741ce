"""A stateful property test of the block pool against a shadow model of the KV memory.

The shadow model records what each (device block, offset) and each host block holds. The KV of a
token depends on the token, on every token before it and on the extra key (an adapter, a salt), so
the model stores `(extra_key, tuple(tokens[: p + 1]))` written at position p. It applies the pool's
COPY / SWAP_OUT / SWAP_IN ops in order and "writes" every token a request computes into its block
table; every write asserts that the block is owned by one table and not in the prefix index. After
every rule it proves that each live request's blocks hold exactly its prefixes at the positions it
has computed, so prefix hits, copy-on-write, eviction and swapping never hand out wrong KV. The same
machine runs again on a pool whose block hash takes four values, where collisions (of blocks and of
their ancestors) are common.
"""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from metroline.kv_backends import COPY, SWAP_OUT, BlockPool, SwapSpace

PREFIXES = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9],
    [1, 2, 3, 4, 5, 6, 10, 11],
    [1, 2, 12],
    [20, 21, 22, 23, 24],
    [],
]
GARBAGE = -1


class Req:
    __slots__ = ("tokens", "computed", "table", "host", "extra_key")

    def __init__(self, tokens, computed, table, extra_key):
        self.tokens = tokens
        self.computed = computed
        self.table = table
        self.host = None
        self.extra_key = extra_key


class WeakHashPool(BlockPool):
    """Block hashes take 4 values: collisions everywhere, in blocks and in their ancestors."""

    _block_hash = staticmethod(lambda key: hash(key) & 3)


class KVMachine(RuleBasedStateMachine):
    pool_class = BlockPool

    def __init__(self):
        super().__init__()
        self.pool = None

    @initialize(
        num_blocks=st.integers(4, 24),
        block_size=st.sampled_from([1, 2, 4]),
        caching=st.sampled_from([True, True, True, False]),
        swap_blocks=st.integers(0, 16),
    )
    def setup(self, num_blocks, block_size, caching, swap_blocks):
        self.bs = block_size
        self.pool = self.pool_class(num_blocks, block_size, enable_prefix_caching=caching)
        self.swap = SwapSpace(swap_blocks)
        self.kv = {}  # device block -> the prefix written per offset (None: never written)
        self.host = {}  # host block -> the prefix written per offset
        self.live = []
        self.swapped = []

    # -- the shadow model -----------------------------------------------------------------------

    def block(self, b):
        content = self.kv.get(b)
        if content is None:
            content = self.kv[b] = [None] * self.bs
        return content

    def apply(self, ops):
        for kind, src, dst in ops:
            if kind == COPY:
                self.kv[dst] = list(self.block(src))
            elif kind == SWAP_OUT:
                self.host[dst] = list(self.block(src))
            else:
                self.kv[dst] = list(self.host[src])

    def write(self, table, tokens, start, end, extra_key):
        bs, pool = self.bs, self.pool
        for p in range(start, end):
            b = table[p // bs]
            assert pool.ref_count(b) == 1, f"write into block {b} with {pool.ref_count(b)} refs"
            assert not pool._indexed[b], f"write into indexed block {b}"
            assert pool._keys[b] is None, f"write into block {b} that holds a full computed block"
            self.block(b)[p % bs] = (extra_key, tuple(tokens[: p + 1]))

    def holds(self, table, tokens, n, extra_key):
        bs = self.bs
        assert len(table) * bs >= n
        for p in range(n):
            got = self.block(table[p // bs])[p % bs]
            want = (extra_key, tuple(tokens[: p + 1]))
            assert got == want, f"position {p}: block {table[p // bs]} holds {got}, not {want}"

    def snapshot(self):
        pool = self.pool
        return (
            pool.num_free_blocks(),
            pool.num_cached_blocks(),
            pool.num_used_blocks(),
            [pool.ref_count(b) for b in range(pool.num_blocks)],
            self.swap.num_free_blocks(),
        )

    def pick(self, i):
        return self.live[i % len(self.live)]

    def admit(self, prompt, extra_key):
        """Lookup, acquire, allocate the rest, compute it, cache the full blocks."""
        pool, bs = self.pool, self.bs
        hit = pool.lookup(prompt, extra_key, max_tokens=len(prompt) - 1)
        n = hit.num_tokens
        assert n <= len(prompt) - 1
        assert len(hit.block_ids) == -(-n // bs)
        self.holds(hit.block_ids, prompt, n, extra_key)
        pool.acquire(hit.block_ids)
        table = list(hit.block_ids)
        before, ops = self.snapshot(), []
        if not pool.allocate_slots(table, n, len(prompt) - n, ops):
            assert ops == [] and table == hit.block_ids and self.snapshot() == before
            pool.release(table)
            return
        self.apply(ops)
        self.write(table, prompt, n, len(prompt), extra_key)
        pool.cache_full_blocks(table, prompt, n // bs, len(prompt) // bs, extra_key)
        self.live.append(Req(prompt, len(prompt), table, extra_key))

    # -- rules ----------------------------------------------------------------------------------

    @precondition(lambda self: len(self.live) < 8)
    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(1, 3), max_size=6),
        extra_key=st.sampled_from([None, None, "salt"]),
    )
    def new_request(self, prefix, suffix, extra_key):
        prompt = prefix + suffix
        if prompt:
            self.admit(prompt, extra_key)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7), new_tokens=st.lists(st.integers(1, 3), min_size=1, max_size=3))
    def decode(self, i, new_tokens):
        req, pool, bs = self.pick(i), self.pool, self.bs
        before, ops = self.snapshot(), []
        req.tokens = req.tokens + new_tokens
        start, end = req.computed, req.computed + len(new_tokens)
        if not pool.allocate_slots(req.table, start, len(new_tokens), ops):
            assert ops == [] and self.snapshot() == before
            del req.tokens[start:]
            return
        self.apply(ops)
        self.write(req.table, req.tokens, start, end, req.extra_key)
        req.computed = end
        pool.cache_full_blocks(req.table, req.tokens, start // bs, end // bs, req.extra_key)

    @precondition(lambda self: self.live and len(self.live) < 8)
    @rule(i=st.integers(0, 7))
    def fork(self, i):
        req = self.pick(i)
        table = self.pool.fork(req.table)
        self.live.append(Req(list(req.tokens), req.computed, table, req.extra_key))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7))
    def free(self, i):
        req = self.pick(i)
        self.pool.release(req.table)
        self.live.remove(req)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7))
    def recompute(self, i):
        """Preemption by recompute: free the blocks, admit the request's tokens again."""
        req = self.pick(i)
        self.pool.release(req.table)
        self.live.remove(req)
        self.admit(req.tokens, req.extra_key)

    @rule(k=st.integers(1, 30))
    def force_eviction(self, k):
        """Allocate up to k blocks (evicting cached ones), fill them with garbage, release them."""
        pool, bs = self.pool, self.bs
        k = min(k, pool.num_free_blocks())
        table, ops = [], []
        assert pool.allocate_slots(table, 0, k * bs, ops)
        assert ops == [] and len(table) == k
        self.write(table, [GARBAGE] * (k * bs), 0, k * bs, GARBAGE)
        pool.release(table)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 7))
    def swap_out(self, i):
        req = self.pick(i)
        before, ops = self.snapshot(), []
        host = self.pool.swap_out(req.table, self.swap, ops)
        if host is None:
            assert ops == [] and self.snapshot() == before
            return
        assert len(ops) == len(host) == len(req.table)
        self.apply(ops)
        req.table, req.host = None, host
        self.live.remove(req)
        self.swapped.append(req)

    @precondition(lambda self: self.swapped)
    @rule(i=st.integers(0, 7))
    def swap_in(self, i):
        req = self.swapped[i % len(self.swapped)]
        before, ops = self.snapshot(), []
        table = self.pool.swap_in(req.host, self.swap, ops)
        if table is None:
            assert ops == [] and self.snapshot() == before
            return
        assert len(ops) == len(table) == len(req.host)
        self.apply(ops)
        req.table, req.host = table, None
        self.swapped.remove(req)
        self.live.append(req)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(1, 3), max_size=6),
        extra_key=st.sampled_from([None, "salt"]),
    )
    def probe(self, prefix, suffix, extra_key):
        """A lookup alone changes nothing and hands out blocks that hold the prompt's tokens."""
        prompt = prefix + suffix
        before = self.snapshot()
        hit = self.pool.lookup(prompt, extra_key)
        assert self.snapshot() == before
        assert hit.num_tokens <= len(prompt)
        assert len(hit.block_ids) == -(-hit.num_tokens // self.bs)
        self.holds(hit.block_ids, prompt, hit.num_tokens, extra_key)

    # -- checks ---------------------------------------------------------------------------------

    @invariant()
    def consistent(self):
        if self.pool is None:
            return
        self.pool.check_invariants([r.table for r in self.live])
        for req in self.live:
            self.holds(req.table, req.tokens, req.computed, req.extra_key)
        for req in self.swapped:
            bs = self.bs
            for p in range(req.computed):
                want = (req.extra_key, tuple(req.tokens[: p + 1]))
                assert self.host[req.host[p // bs]][p % bs] == want
        on_host = sum(len(r.host) for r in self.swapped)
        assert self.swap.num_free_blocks() + on_host == self.swap.num_blocks

    def teardown(self):
        if self.pool is None:
            return
        pool = self.pool
        for req in self.live:
            pool.release(req.table)
        for req in self.swapped:
            self.swap.free(req.host)
        pool.check_invariants([])
        assert pool.num_used_blocks() == 0
        assert pool.num_free_blocks() == pool.num_blocks
        assert self.swap.num_free_blocks() == self.swap.num_blocks


class CollidingKVMachine(KVMachine):
    pool_class = WeakHashPool


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
KVMachine.TestCase.settings = SETTINGS
CollidingKVMachine.TestCase.settings = SETTINGS
TestKVPool = KVMachine.TestCase
TestKVPoolWithHashCollisions = CollidingKVMachine.TestCase
