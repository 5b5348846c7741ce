"""`LazyHeap`: a heap of sequences that drops stale entries lazily and puts back what a consumer
did not take; `ArrivalQueue`, the arrival-ordered waiting queue most policies keep on it.

Every queue a policy keeps is one of these:

- a waiting queue keyed once, at push (`LazyHeap(key)`: fcfs, priority, weighted_fair's
  per-tenant queues). A sequence pushed again while its entry is still in the heap (preempted
  before its admission entry reached the top) keeps its entry, and so its place;
- a waiting queue re-keyed at each push (`LazyHeap(rekey=True)`, keys given to `push`: srpt,
  whose key, the remaining work, changes with a preemption). The newest entry of a sequence is
  its only live one;
- the running sequences, worst first (`LazyHeap(key, live=frozenset({RUNNING}))`: priority's
  victim).

An entry is *live* while its sequence's state is in `live` (default `QUEUED`: waiting or swapped)
and it is the sequence's newest entry. The others (admitted, finished, cancelled, re-keyed) are
dropped when they reach the top, so no hook has to remove them; `push(..., num_live=n)` also
rebuilds the heap when it holds more than `2n + 64` entries, so that dead entries that never
reach the top (running sequences that finished) do not pile up.

`ordered()` is what a policy hands to the scheduler as its `admission` answer: a generator that
pops live entries in key order and, when the consumer stops (or closes it), pushes back those
still live. The scheduler's partial consumption costs O(k log n) for the k candidates it looks
at, whatever the queue's length.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from ..requests.sequence import QUEUED, Sequence
from .hookspecs import hookimpl


def arrival_key(seq: Sequence) -> tuple[float, int, int]:
    """Arrival order: time, then submission order, then sample index (for `n > 1`)."""
    return (seq.arrival_time, seq.arrival_no, seq.index)


class LazyHeap:
    """A min-heap of sequences by key (ties: first pushed first); see the module docstring.

    - `key(seq)`: the key of a pushed sequence, computed once at push (a policy whose keys change
      over time uses `rekey=True` and pushes again, or a key that stays valid: for aging,
      `priority + rate * arrival` orders exactly like `priority - rate * (now - arrival)`);
      it may be omitted when every `push` gives the key.
    - `live`: the states in which an entry counts (default `QUEUED`).
    - `rekey`: whether pushing a sequence that has an entry replaces it (True) or is a no-op.
    """

    __slots__ = ("_heap", "_key", "_live", "_rekey", "_current", "_tie")

    def __init__(
        self, key: Callable[[Sequence], Any] | None = None, *, live: frozenset = QUEUED, rekey: bool = False
    ) -> None:
        self._heap: list[tuple[Any, int, Sequence]] = []
        self._key = key
        self._live = live
        self._rekey = rekey
        self._current: dict[Sequence, tuple[Any, int, Sequence]] = {}  # each sequence's newest entry
        self._tie = itertools.count()

    def push(self, seq: Sequence, key: Any = None, num_live: int | None = None) -> None:
        """Add `seq` with `key` (default: `key(seq)`). Without `rekey`, a no-op when `seq` has an
        entry already. `num_live`: how many sequences are live now (e.g. `len(ctx.running)`); when
        given, the heap is rebuilt without dead entries once it holds more than `2 * num_live + 64`."""
        current = self._current
        if not self._rekey and seq in current:
            return  # its entry is still in the heap, and counts again now that `seq` is live
        entry = (self._key(seq) if key is None else key, next(self._tie), seq)
        current[seq] = entry
        heapq.heappush(self._heap, entry)
        if num_live is not None and len(self._heap) > 2 * num_live + 64:
            self._compact()

    def _compact(self) -> None:
        live, current = self._live, self._current
        # in place: a running `ordered()` holds the list and pushes its entries back into it
        self._heap[:] = [e for e in self._heap if e[2].state in live and current.get(e[2]) is e]
        heapq.heapify(self._heap)
        self._current = {s: e for s, e in current.items() if s.state in live}

    def discard(self, seq: Sequence) -> None:
        """Forget `seq` (its entries become dead), e.g. when it ends."""
        self._current.pop(seq, None)

    def __len__(self) -> int:
        """Sequences with an entry (live, or dead but not dropped yet)."""
        return len(self._current)

    @property
    def num_entries(self) -> int:
        """Entries in the heap, dead ones included (what the rebuild bounds)."""
        return len(self._heap)

    def peek(self) -> Sequence | None:
        """The first live sequence, or None (dead entries above it are dropped)."""
        heap, live, current = self._heap, self._live, self._current
        while heap:
            entry = heap[0]
            seq = entry[2]
            if current.get(seq) is entry:
                if seq.state in live:
                    return seq
                del current[seq]
            heapq.heappop(heap)
        return None

    def ordered(self) -> Iterator[Sequence]:
        """Yield the live sequences in key order. Those still live when the consumer stops (or
        closes the generator) are put back; the others are dropped."""
        heap, live, current = self._heap, self._live, self._current
        taken: list[tuple[Any, int, Sequence]] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                seq = entry[2]
                if current.get(seq) is not entry:
                    continue
                if seq.state not in live:
                    del current[seq]
                    continue
                taken.append(entry)
                yield seq
        finally:
            for entry in taken:
                seq = entry[2]
                if current.get(seq) is entry:
                    if seq.state in live:
                        heapq.heappush(heap, entry)
                    else:
                        del current[seq]


class ArrivalQueue:
    """A base for policies that keep the waiting requests in one queue keyed once: `self.queue`
    is a `LazyHeap` by `key` (default `arrival_key`: arrival order), fed by `on_arrival` and
    `on_preempted` (a preempted request keeps its key, and so its place). A subclass that
    overrides either hook must mark it `@hookimpl` again."""

    def __init__(self, key: Callable[[Sequence], Any] = arrival_key) -> None:
        self.queue = LazyHeap(key=key)

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.queue.push(s)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.queue.push(s)
