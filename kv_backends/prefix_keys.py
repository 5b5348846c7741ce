"""Prefix keys: what a full cached block holds KV for, compared with its ancestors.

A full block is indexed by a chained hash of `(parent_hash, block_tokens, extra_key)`. Each one also
stores its `BlockKey`: its tokens, extra key and a link to its parent block's key. `same_prefix`
compares keys up the chain, so a hash collision (in a block or in any of its ancestors) can never
hand out wrong KV.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple


class PrefixHit(NamedTuple):
    """The cached prefix of a prompt, as found by `BlockPool.lookup`."""

    block_ids: list[int]
    """Blocks to share, in block-table order: full matched blocks, then possibly one partially
    matched block."""
    num_tokens: int
    """How many leading prompt tokens those blocks hold KV for."""


class BlockKey:
    """What a full block holds KV for: `tokens` after the prefix of `parent`, under `extra_key`."""

    __slots__ = ("parent", "tokens", "extra_key", "hash")

    def __init__(
        self, parent: BlockKey | None, tokens: tuple, extra_key: Hashable, h: int
    ) -> None:
        self.parent = parent
        self.tokens = tokens
        self.extra_key = extra_key
        self.hash = h


def same_prefix(a: BlockKey | None, b: BlockKey | None) -> bool:
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
