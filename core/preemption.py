"""`Preempt`: an answer of the `select_victim` hook that also chooses the preemption mode; and the
core's no-livelock rule (`is_protected`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from .sequence import Sequence

RECOMPUTE = "recompute"
SWAP = "swap"

PROTECT_AFTER = 2
"""Preemptions in a row without progress after which a readmitted request is protected."""


class Preempt(NamedTuple):
    """Preempt `seq` with `mode`: `"recompute"` frees its blocks and sends it back to waiting with
    its tokens kept (its KV is computed again on readmission, minus what the prefix cache still
    holds); `"swap"` copies its blocks to the host swap space (falling back to recompute when the
    swap space is full)."""

    seq: Sequence
    mode: Literal["recompute", "swap"]


def is_protected(seq: Sequence) -> bool:
    """Whether `seq` is protected from preemption by younger requests (see `select_victim` in
    hookspecs): it was preempted `PROTECT_AFTER` times in a row without computing past the most
    tokens it had ever computed (its mark, `seq.stall_mark`), and has not passed the mark since."""
    return seq.stalls >= PROTECT_AFTER and seq.num_computed_tokens <= seq.stall_mark


def older(a: Sequence, b: Sequence) -> bool:
    """Whether `a` arrived before `b` (samples of one request: lower index first)."""
    return (a.arrival_no, a.index) < (b.arrival_no, b.index)
