"""The victim rule several policies share: the running sequence admitted last.

The sequence admitted last has made the least progress since its admission and, under an
arrival-ordered admission, arrived last of those running: preempting it loses the least work and
keeps the order of service (vLLM's rule). `admitted_seq_no` is stamped at each admission (a fork's
children included), larger is later.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..requests.sequence import RUNNING, Sequence
from ..step.context import StepContext


def last_admitted(seqs: Iterable[Sequence], rank: Callable[[Sequence], Any] | None = None) -> Sequence | None:
    """The sequence of `seqs` admitted most recently (None when there is none). With `rank`, the
    one admitted last among those of the highest `rank(seq)` (e.g. the tenant most over its share)."""
    if rank is None:
        return max(seqs, key=_admission_no, default=None)
    return max(seqs, key=lambda s: (rank(s), s.admitted_seq_no), default=None)


def _admission_no(seq: Sequence) -> int:
    return seq.admitted_seq_no


def last_admitted_victim(ctx: StepContext, requester: Sequence) -> Sequence | None:
    """A whole `select_victim` answer: for a running requester, the running sequence admitted
    last (possibly the requester itself); a waiting requester preempts nobody (None)."""
    if requester.state is not RUNNING:
        return None
    return last_admitted(ctx.running)
