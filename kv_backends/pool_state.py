"""The state of a `BlockPool`: its slots, set up once, which every part of the pool reads.

Every device block is in exactly one state: free (ref count 0, on the free list), evictable (ref
count 0, still in the prefix index, in LRU order) or used (ref count above 0).
"""

from __future__ import annotations

from collections import OrderedDict

from .prefix_keys import BlockKey


class PoolState:
    """The slots of a pool of `num_blocks` device blocks of `block_size` tokens each."""

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
        "_dups",
        "_children",
        "_num_used",
        "_unindexed",
        "_route_epoch",
        "_route_memo",
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
        self.pending: dict[int, int] = {}
        """The blocks registered in the current step whose KV its forward has yet to write ->
        the first offset it writes in each (see `pending`: no block op reads such a slot for a
        sequence that counts it as computed; a lookup shares them whole, never in part)."""
        self.peak_used_blocks = 0
        self._refs = [0] * num_blocks
        # The key of a full, computed block; kept on blocks that are not indexed (a hash collision
        # took the hash) so that their children still chain.
        self._keys: list[BlockKey | None] = [None] * num_blocks
        self._indexed = [False] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._index: dict[int, int] = {}  # hash -> block (the oldest indexed block of that hash)
        # hash -> the later blocks indexed under it, oldest first: a block recomputed while its
        # twin was cached (as vLLM keeps both; a lookup takes the oldest, evicting one keeps the
        # hash alive through the next)
        self._dups: dict[int, list[int]] = {}
        # (parent_hash, extra_key, first token) -> indexed blocks, for token-granular matching.
        self._children: dict[tuple, set[int]] = {}
        self._num_used = 0
        # `cached_blocks`' memo: chained hash -> the key its walks from the root reached there, valid
        # while no block has left the index (`_unindexed` counts removals; the index only gains
        # entries otherwise, never rebinds one, and an indexed block's key never changes).
        self._unindexed = 0
        self._route_epoch = 0
        self._route_memo: dict[int, BlockKey] = {}
