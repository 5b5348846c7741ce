"""`Preempt`: an answer of the `select_victim` hook that also chooses the preemption mode."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from .sequence import Sequence

RECOMPUTE = "recompute"
SWAP = "swap"


class Preempt(NamedTuple):
    """Preempt `seq` with `mode`: `"recompute"` frees its blocks and sends it back to waiting with
    its tokens kept (its KV is computed again on readmission, minus what the prefix cache still
    holds); `"swap"` copies its blocks to the host swap space (falling back to recompute when the
    swap space is full)."""

    seq: Sequence
    mode: Literal["recompute", "swap"]
