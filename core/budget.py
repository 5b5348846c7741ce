"""`Split`: the answer of the `split_budget` hook."""

from __future__ import annotations

from typing import NamedTuple


class Split(NamedTuple):
    """A step's token budget split: at most `decode` decode tokens and `prefill` prefill tokens,
    with no prefill chunk longer than `max_chunk` tokens."""

    decode: int
    prefill: int
    max_chunk: int
