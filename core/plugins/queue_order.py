"""`queued_in_order`: a lazy walk over the engine's queues that survives their changes.

`ctx.waiting` and `ctx.swapped` are live views of the scheduler's queues. Iterating one inside an
`admission` generator fails ("dictionary changed size during iteration") as soon as the scheduler
admits the first candidate, and copying it (`list(ctx.waiting)`) costs O(queue) every step when
the scheduler looks at a few candidates. `queued_in_order(ctx.swapped, ctx.waiting)` yields what
the copy would, copying only as far as the consumer pulls (and the default admission is exactly
that).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from ..requests.sequence import Sequence

FIRST_CHUNK = 8
"""Sequences copied by the first look at a queue; each further look copies twice as many."""


def queued_in_order(*queues: Collection[Sequence]) -> Iterator[Sequence]:
    """The sequences of `queues` (ordered views such as `ctx.swapped`, `ctx.waiting`), one queue
    after the other, each in its order as it stood at this call: those taken out of it meanwhile
    (admitted) are not yielded once they are gone, and those that join it after the call
    (preempted in this step, at its back) are not yielded. The walk copies a few sequences at a
    time, between two of its yields, so the queues may change while it is suspended. Cost: O(k)
    for the k sequences pulled, plus a rescan of those yielded and still queued at each copy."""
    walks = []
    for queue in queues:
        if queue:
            walks.append((queue, next(reversed(queue)), len(queue)))
    return _walk(walks)


def _walk(walks: list[tuple[Collection[Sequence], Sequence, int]]) -> Iterator[Sequence]:
    for queue, last, count in walks:
        seen: set[Sequence] = set()
        size = FIRST_CHUNK
        while count > 0:
            chunk = []
            for seq in queue:  # a whole pass with no yield inside: the queue cannot change
                if seq in seen:
                    continue
                chunk.append(seq)
                if seq is last or len(chunk) >= size or len(chunk) >= count:
                    break
            if not chunk:
                break
            for seq in chunk:
                seen.add(seq)
                count -= 1
                yield seq
                if seq is last:
                    count = 0
                    break
            size *= 2
