"""`priority`: strict priority with optional aging, and preemption of running requests for urgent
waiting ones.

Lower `priority` is more urgent (as in `Request`). A request's *effective priority* at time `now` is
`priority - aging_rate * (now - arrival_time)`: every second it waits makes it more urgent.
All requests age at the same rate, so the difference between two effective priorities never
changes; ordering by the static key `priority + aging_rate * arrival_time` is the same order at any
instant. The waiting queue is a heap keyed once, at push (`LazyHeap`), and a preempted request keeps
its original arrival (and so its key).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

from ..core.candidates import Candidates
from ..core.context import StepContext
from ..core.hookspecs import hookimpl
from ..core.lazy_heap import LazyHeap
from ..core.sequence import SeqState, Sequence

_RUNNING = SeqState.RUNNING


class RunningMaxHeap:
    """The running sequences by a static key, largest first: `peek()` is the worst one.

    Sequences are pushed when admitted; those no longer running are dropped lazily when they reach
    the top, and the heap is rebuilt when stale entries outnumber live ones (amortised O(1) per
    admission), so finished sequences that never reach the top do not accumulate.
    """

    __slots__ = ("_heap", "_key", "_members", "_tie")

    def __init__(self, key: Any) -> None:
        self._heap: list[tuple[Any, int, Sequence]] = []
        self._key = key  # key(seq) -> a tuple of negated components: the min-heap pops the worst
        self._members: set[Sequence] = set()
        self._tie = itertools.count()

    def push(self, seq: Sequence, num_running: int) -> None:
        if seq in self._members:
            return  # its entry is still in the heap, and valid again now that it runs
        self._members.add(seq)
        heapq.heappush(self._heap, (self._key(seq), next(self._tie), seq))
        if len(self._heap) > 2 * num_running + 64:
            self._heap = [e for e in self._heap if e[2].state is _RUNNING]
            heapq.heapify(self._heap)
            self._members = {e[2] for e in self._heap}

    def peek(self) -> Sequence | None:
        heap = self._heap
        while heap and heap[0][2].state is not _RUNNING:
            self._members.discard(heapq.heappop(heap)[2])
        return heap[0][2] if heap else None


class Priority:
    """Admits by effective priority, then arrival; preempts the least urgent running request.

    Decides:

    - **admission**: waiting (and swapped) requests by effective priority
      `priority - aging_rate * seconds waited` (lower first), ties by arrival. **Head-of-line**: a
      candidate whose KV blocks do not fit stops admission for the step; nothing less urgent
      overtakes it, so the blocks that free up go to it. (Skipping would let a stream of small,
      less urgent requests take every freed block and starve a large urgent one, and it would void
      the aging bound below.)
    - **victim**: the running request with the worst effective priority (the latest arrival among
      equals), for a running request that needs a block (possibly the requester itself).
    - **preemption for waiting requests**: a waiting candidate whose effective priority is better
      than the worst running request's by at least `preempt_threshold` preempts it, both when
      `max_num_seqs` requests already run (reason "slots") and when its blocks do not fit (reason
      "blocks"). Since effective priorities age at the same rate, the gap between two requests is
      constant: a preempted request can never preempt its preemptor back, and preemption chains
      strictly improve the key, so there is no thrashing. With aging the gap shrinks by
      `aging_rate` per second between the two arrivals: a request that has waited long is
      protected (priority 1 arriving before an urgent request, with threshold 1.0, is never
      preempted for it).

    Options (`[plugin_options.priority]`):

    - `aging_rate` (float >= 0, default 0.0: no aging): priority units gained per second waited.
    - `preempt_threshold` (float > 0 or None, default 1.0: one priority level): the gap needed to
      preempt a running request for a waiting one; None never preempts for waiting requests.

    Aging bound: let `p_min` be the most urgent priority in use and `D = (priority - p_min) /
    aging_rate`. A request R is ordered before every request that arrives at or after
    `arrival(R) + D`, so from then on only the requests already queued ahead of it (`Q` of them)
    are admitted before it. With strict (head-of-line) order, `S = max_num_seqs` slots, no
    preemption and every admitted request holding its slot at most `H` seconds, R waits at most
    `D + ceil((Q + 1) / S) * H` (plus one step for the clock's granularity): in each `H` every slot
    frees at least once and goes to the head of the queue.
    """

    name = "priority"

    def __init__(self, aging_rate: float = 0.0, preempt_threshold: float | None = 1.0) -> None:
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, (int, float)) or not (
            math.isfinite(aging_rate) and aging_rate >= 0
        ):
            raise ValueError(f"aging_rate must be a finite number >= 0 (priority units per second), got {aging_rate!r}")
        if preempt_threshold is not None and (
            isinstance(preempt_threshold, bool)
            or not isinstance(preempt_threshold, (int, float))
            or not (math.isfinite(preempt_threshold) and preempt_threshold > 0)
        ):
            raise ValueError(
                f"preempt_threshold must be a finite number > 0 (priority units) or None, got {preempt_threshold!r}"
            )
        self.aging_rate = float(aging_rate)
        self.preempt_threshold = None if preempt_threshold is None else float(preempt_threshold)
        rate = self.aging_rate
        self.queue = LazyHeap(key=lambda s: (s.priority + rate * s.arrival_time, s.arrival_time, s.arrival_no, s.index))
        self.running = RunningMaxHeap(
            key=lambda s: (-(s.priority + rate * s.arrival_time), -s.arrival_time, -s.arrival_no, -s.index)
        )

    def key(self, seq: Sequence) -> float:
        """The static aging key: effective priority at time `now` is `key - aging_rate * now`."""
        return seq.priority + self.aging_rate * seq.arrival_time

    def effective_priority(self, seq: Sequence, now: float) -> float:
        """`priority - aging_rate * (now - arrival_time)`."""
        return seq.priority - self.aging_rate * (now - seq.arrival_time)

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        push = self.queue.push
        for s in seqs:
            push(s)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        push = self.queue.push
        for s in seqs:
            push(s)

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        push, n = self.running.push, len(ctx.running)
        for s in seqs:
            push(s, n)

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self.queue.ordered(), head_of_line=True)

    @hookimpl
    def select_victim(self, requester: Sequence) -> Sequence | None:
        worst = self.running.peek()
        if requester.state is _RUNNING:
            return worst  # None (cannot happen while requester runs) would preempt the requester
        threshold = self.preempt_threshold
        if threshold is None or worst is None:
            return None
        if self.key(requester) <= self.key(worst) - threshold:
            return worst
        return None
