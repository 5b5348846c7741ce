"""`LazyHeap`: the incremental waiting queue most policies keep.

Policies push a sequence when it becomes waiting (`on_arrival`, `on_preempted`) and hand
`ordered()` to the scheduler as their `admission` answer. Admitted, finished and cancelled
sequences are dropped lazily when they reach the top, so no hook has to remove them, and the
scheduler's partial consumption costs O(k log n) for the k candidates it looks at.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from .hookspecs import hookimpl
from .sequence import SeqState, Sequence

_WAITING = (SeqState.WAITING, SeqState.SWAPPED)


def arrival_key(seq: Sequence) -> tuple[float, int, int]:
    """Arrival order: time, then submission order, then sample index (for `n > 1`)."""
    return (seq.arrival_time, seq.arrival_no, seq.index)


class LazyHeap:
    """A min-heap of waiting sequences ordered by `key(seq)` (ties: first pushed first).

    The key is computed once, at push; a policy whose keys change over time pushes again or uses
    a key that stays valid (for aging: `priority + rate * arrival` orders exactly like
    `priority - rate * (now - arrival)`).
    """

    __slots__ = ("_heap", "_key", "_members", "_tie")

    def __init__(self, key: Callable[[Sequence], Any]) -> None:
        self._heap: list[tuple[Any, int, Sequence]] = []
        self._key = key
        self._members: set[Sequence] = set()
        self._tie = itertools.count()

    def push(self, seq: Sequence) -> None:
        """Add `seq` (no-op when it is already queued)."""
        if seq not in self._members:
            self._members.add(seq)
            heapq.heappush(self._heap, (self._key(seq), next(self._tie), seq))

    def __len__(self) -> int:
        return len(self._members)

    def peek(self) -> Sequence | None:
        """The first still-waiting sequence, or None."""
        heap = self._heap
        while heap and heap[0][2].state not in _WAITING:
            self._members.discard(heapq.heappop(heap)[2])
        return heap[0][2] if heap else None

    def ordered(self) -> Iterator[Sequence]:
        """Yield waiting sequences in key order. Those still waiting when the consumer stops (or
        closes the generator) are put back; the others are dropped."""
        heap, members = self._heap, self._members
        taken: list[tuple[Any, int, Sequence]] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                if entry[2].state not in _WAITING:
                    members.discard(entry[2])
                    continue
                taken.append(entry)
                yield entry[2]
        finally:
            for entry in taken:
                if entry[2].state in _WAITING:
                    heapq.heappush(heap, entry)
                else:
                    members.discard(entry[2])


class ArrivalQueue:
    """A base for policies that keep the waiting requests in arrival order: `self.queue` is a
    `LazyHeap` by `arrival_key`, fed by `on_arrival` and `on_preempted` (a preempted request
    keeps its place). A subclass that overrides either hook must mark it `@hookimpl` again."""

    def __init__(self) -> None:
        self.queue = LazyHeap(key=arrival_key)

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.queue.push(s)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.queue.push(s)
