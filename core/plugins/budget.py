"""`Split`: the answer of the `split_budget` hook."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Split(NamedTuple):
    """A step's token budget split: at most `decode` decode tokens and `prefill` prefill tokens,
    with no prefill chunk longer than `max_chunk` tokens, and at most `max_prefills` sequences
    getting a prefill chunk (running partial prefills and new admissions together; None: no cap).

    `shares`: tenant -> fraction of the step's tokens reserved for that tenant's sequences (None:
    no reserve). A tenant with share `f` is served first, up to `floor(f * decode)` decode and
    `floor(f * prefill)` prefill tokens, before the other tenants' sequences get any of that part
    of the budget; what it leaves unused goes to the others in the same step. Fractions are
    finite numbers >= 0 that sum to at most 1 (see `metroline.core.step.reserves`).
    """

    decode: int
    prefill: int
    max_chunk: int
    max_prefills: int | None = None
    shares: Mapping[str, float] | None = None
