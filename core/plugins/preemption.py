"""`Preempt`: a victim and how it is preempted (an answer of the `select_victim` hook may be one);
and the core's no-livelock rule (`is_protected`, `substitute`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from ..requests.sequence import RUNNING, Sequence

RECOMPUTE = "recompute"
"""`Preempt.mode`: free the victim's blocks; its KV is computed again when it is readmitted."""
SWAP = "swap"
"""`Preempt.mode`: copy the victim's blocks to the host swap space; they are copied back on its return."""

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


def substitute(running: Iterable[Sequence], requester: Sequence, younger_only: bool = False) -> Sequence | None:
    """The core's victim for `requester`: the youngest running request other than it that it may
    displace (an unprotected one, else a younger protected one; only younger ones with
    `younger_only`); else the requester yields (itself if running, None if waiting)."""
    best, best_rank = None, None
    for s in running:
        if s is requester:
            continue
        protected = s.stalls >= PROTECT_AFTER and is_protected(s)
        if (younger_only or protected) and older(s, requester):
            continue
        rank = (0 if protected else 1, s.arrival_no, s.index)
        if best_rank is None or rank > best_rank:
            best, best_rank = s, rank
    if best is not None:
        return best
    return requester if requester.state is RUNNING else None
