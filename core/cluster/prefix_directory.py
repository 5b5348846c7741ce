"""A cluster's prefix directory: which replicas were sent each prompt block, kept by whoever routes
(the simulated cluster, the front of `metroline serve --replicas`) so that a cache-aware router
finds the replicas holding the longest prefix of a prompt in one pass over the prompt's block
hashes, without asking each replica. SGLang's cache-aware router keeps an approximate radix tree per
worker for the same purpose; this is that tree flattened: one dict from a block's chained hash
(`metroline.core.cluster.view.RouteRequest.block_chain`, from a tenant's salt when the prompt is
salted) to the bitmask of the replicas the block was routed to.

It is an estimate of the replicas' caches, not a copy: a block counts from the moment a prompt
holding it is routed (before the replica has computed it) until the directory ages it out, whether
or not the replica has evicted it since. Aging keeps the directory bounded: blocks are written to a
young generation; when it holds `capacity // 2` blocks it becomes the old one and the previous old
one is dropped, so a block routed within the last `capacity // 2` new blocks is always remembered
and at most about `capacity` are (LRU-like, as the routing of a prompt renews its blocks).

Invariant (what makes a lookup a binary search): for each replica, the blocks of a prompt it holds
are a prefix of the prompt's chain. Recording a prompt writes all its blocks into the young
generation (those already there for that replica are skipped: they are a prefix too), and a
generation is dropped whole, so each generation holds, per replica, whole prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_ESTIMATE_BLOCKS = 64
"""The directory looks at most this many leading blocks of a prompt (1,024 tokens at 16 a block):
it records and probes no more of a long prompt per request, and two replicas that both hold more
of it count as equal there (the load bound decides)."""



class PrefixDirectory:
    """Block hash -> bitmask of the replicas it was routed to, for the first `max_blocks` blocks of
    each prompt, at `block_size` tokens a block; bounded by `capacity` blocks (module docstring).
    Each replica has a bit (`new_bit`)."""

    __slots__ = ("_free", "_hints", "_next_bit", "_old", "_rotations", "_young", "block_size", "capacity",
                 "max_blocks")

    def __init__(self, capacity: int = 1 << 20, block_size: int = 16, max_blocks: int = MAX_ESTIMATE_BLOCKS) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 blocks (got {capacity})")
        if block_size < 1 or max_blocks < 1:
            raise ValueError(f"block_size and max_blocks must be >= 1 (got {block_size}, {max_blocks})")
        self.capacity = capacity
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._young: dict[int, int] = {}
        self._old: dict[int, int] = {}
        self._hints: dict[int, int] = {}  # a prompt's first block -> where the last lookup found its end
        self._rotations = 0
        self._next_bit = 1
        self._free: list[tuple[int, int]] = []  # (rotation it was retired at, bit)

    def new_bit(self) -> int:
        """A replica's bit: one no block holds (a retired bit once both generations it could be in
        are gone)."""
        free = self._free
        if free and free[0][0] + 2 <= self._rotations:
            return free.pop(0)[1]
        bit = self._next_bit
        self._next_bit <<= 1
        return bit

    def retire(self, bit: int) -> None:
        """Forget a replica's blocks (it restarted with an empty cache, or left): its bit is no
        longer asked about and is handed out again once it has aged out."""
        self._free.append((self._rotations, bit))

    def set_block_size(self, block_size: int) -> None:
        """Hash at `block_size` tokens a block from now on (what was recorded at another size is
        forgotten)."""
        if block_size != self.block_size:
            if block_size < 1:
                raise ValueError(f"block_size must be >= 1 (got {block_size})")
            self.block_size = block_size
            self._young, self._old, self._hints = {}, {}, {}

    def record(self, chain: Sequence[tuple[int, tuple]], bit: int) -> None:
        """A prompt whose block chain is `chain` was routed to the replica of `bit`."""
        young = self._young
        get = young.get
        n = min(len(chain), self.max_blocks)
        # The leading blocks young holds for this replica are a prefix: skip them.
        if not n or get(chain[n - 1][0], 0) & bit:
            return
        lo, hi = 0, n - 1  # the count held is in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if get(chain[mid - 1][0], 0) & bit:
                lo = mid
            else:
                hi = mid - 1
        for k in range(lo, n):
            h = chain[k][0]
            young[h] = get(h, 0) | bit
        if len(young) >= self.capacity >> 1:
            self._old, self._young = young, {}
            self._rotations += 1
            self._hints.clear()  # (only guesses: bounded with the generations)

    def longest(self, chain: Sequence[tuple[int, tuple]], among: int) -> tuple[int, int]:
        """(blocks, mask): the longest prefix of `chain` that some replica of the mask `among` was
        routed, in blocks, and the mask of those replicas (0, 0 when none was).

        A binary search over the chain's first `max_blocks` blocks (a block is held by some replica
        of `among` exactly up to the answer, by the module's invariant), started at the answer of
        the last search of a prompt with the same first block: prompts that share a system prompt
        usually share how far they are held, and then two probes find it (one when the whole
        chain is held)."""
        young, old = self._young.get, self._old.get
        n = len(chain)
        if n > self.max_blocks:
            n = self.max_blocks
        elif not n:
            return 0, 0
        root = chain[0][0]
        hints = self._hints
        guess = hints.get(root, n)
        if guess > n:
            guess = n
        lo, hi = 0, n  # the first lo blocks are held, the answer is at most hi
        h = chain[guess - 1][0]
        mask = (young(h, 0) | old(h, 0)) & among
        if mask:
            if guess == n:
                return n, mask
            h = chain[guess][0]
            if not (young(h, 0) & among or old(h, 0) & among):
                return guess, mask
            lo = guess + 1
        else:
            hi = guess - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            h = chain[mid - 1][0]
            if young(h, 0) & among or old(h, 0) & among:
                lo = mid
            else:
                hi = mid - 1
        if lo != guess:
            hints[root] = lo or n
        if not lo:
            return 0, 0
        h = chain[lo - 1][0]
        return lo, (young(h, 0) | old(h, 0)) & among

    def hit_blocks(self, chain: Sequence[tuple[int, tuple]], bit: int) -> int:
        """How many leading blocks of `chain` were routed to the replica of `bit`."""
        return self.longest(chain, bit)[0]

    def __len__(self) -> int:
        """The blocks remembered (a block in both generations counted twice)."""
        return len(self._young) + len(self._old)
