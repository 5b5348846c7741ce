"""`Split`: the answer of the `split_budget` hook."""

from __future__ import annotations

from typing import NamedTuple


class Split(NamedTuple):
    """A step's token budget split: at most `decode` decode tokens and `prefill` prefill tokens,
    with no prefill chunk longer than `max_chunk` tokens, and at most `max_prefills` sequences
    getting a prefill chunk (running partial prefills and new admissions together; None: no cap)."""

    decode: int
    prefill: int
    max_chunk: int
    max_prefills: int | None = None
