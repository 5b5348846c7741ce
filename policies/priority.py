"""`priority`: strict priority with optional aging, and preemption of running requests for urgent
waiting ones; with the option `vllm` (set by `--preset vllm`), exactly vLLM 0.33's priority
scheduler.

Lower `priority` is more urgent (as in `Request`). A request's *effective priority* at time `now` is
`priority - aging_rate * (now - arrival_time)`: every second it waits makes it more urgent.
All requests age at the same rate, so the difference between two effective priorities never
changes; ordering by the static key `priority + aging_rate * arrival_time` is the same order at any
instant. The waiting queue is a heap keyed once, at push (`LazyHeap`), and a preempted request keeps
its original arrival (and so its key).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from metroline.api import (
    ArrivalQueue,
    Candidates,
    LazyHeap,
    PluginOptions,
    RUNNING,
    Sequence,
    StepContext,
    hookimpl,
    take_options,
)


class Priority(ArrivalQueue):
    """Admits by effective priority, then arrival; preempts the least urgent running request.

    Decides:

    - **admission**: waiting (and swapped) requests by effective priority
      `priority - aging_rate * seconds waited` (lower first), ties by arrival. **Head-of-line**: a
      candidate whose KV blocks do not fit stops admission for the step; nothing less urgent
      overtakes it, so the blocks that free up go to it. (Skipping would let a stream of small,
      less urgent requests take every freed block and starve a large urgent one, and it would void
      the aging bound below.)
    - **victim**: the running request with the worst effective priority (the latest arrival among
      equals: the later `arrival_time`, then the later `arrival_no`, then, among the samples of
      one request, the highest `index`), for a running request that needs a block (possibly the
      requester itself).
    - **preemption for waiting requests**: a waiting candidate whose effective priority is better
      than the worst running request's by at least `preempt_threshold` preempts it, both when
      `max_num_seqs` requests already run (reason "slots") and when its blocks do not fit (reason
      "blocks"). Since effective priorities age at the same rate, the gap between two requests is
      constant: a preempted request can never preempt its preemptor back, and preemption chains
      strictly improve the key, so there is no thrashing. With aging the gap shrinks by
      `aging_rate` per second between the two arrivals: a request that has waited long is
      protected (priority 1 arriving before an urgent request, with threshold 1.0, is never
      preempted for it).

    Options: see `Priority.Options` (`aging_rate`, `preempt_threshold`, `vllm`). Aging and
    preemption for waiting requests are this policy's own (not vLLM).

    **vLLM's priority scheduler** (`vllm = true`, which `--preset vllm` sets): waiting requests by
    `(priority, arrival_time, request_id)` (the id compared as a string, as vLLM's `Request.__lt__`),
    head-of-line; a waiting request never preempts (for slots or blocks); the victim of a running
    request that lacks blocks is `max(running, key=(priority, arrival_time))`, i.e. among the worst
    the first in the running list's order (admission order, a re-admitted request at its end).
    With the preset's `admit_after_preemption = false`, nothing is admitted in a step that
    preempted. No aging.

    Aging bound: let `p_min` be the most urgent priority in use and `D = (priority - p_min) /
    aging_rate`. A request R is ordered before every request that arrives at or after
    `arrival(R) + D`, so from then on only the requests already queued ahead of it (`Q` of them)
    are admitted before it. With strict (head-of-line) order, `S = max_num_seqs` slots, no
    preemption and every admitted request holding its slot at most `H` seconds, R waits at most
    `D + ceil((Q + 1) / S) * H` (plus one step for the clock's granularity): in each `H` every slot
    frees at least once and goes to the head of the queue.
    """

    name = "priority"

    class Options(PluginOptions):
        """`[plugin_options.priority]`."""

        aging_rate: float = Field(
            default=0.0, ge=0, allow_inf_nan=False,
            description="priority units gained per second waited; 0: no aging",
        )
        preempt_threshold: float | None = Field(
            default=1.0, gt=0, allow_inf_nan=False,
            description="the gap of effective priority (in priority units; 1.0 is one level) needed to "
            "preempt a running request for a waiting one; None never preempts for waiting requests",
        )
        vllm: bool = Field(
            default=False,
            description="exactly vLLM 0.33's priority scheduler (set by the vllm preset): ties by arrival "
            "time then request id as a string, victim the first of the worst in running order, no "
            "preemption for waiting requests, no aging",
        )

        @model_validator(mode="after")
        def _vllm_has_no_aging_or_threshold(self) -> Priority.Options:
            if self.vllm and self.aging_rate:
                raise ValueError(
                    "aging_rate must be 0 with vllm = true (vLLM's priority scheduler does not age; "
                    "vllm = false gives the policy's own aging)"
                )
            if self.vllm and "preempt_threshold" in self.model_fields_set and self.preempt_threshold is not None:
                raise ValueError(
                    "preempt_threshold must be None with vllm = true (vLLM never preempts for a waiting "
                    "request; vllm = false gives the policy's own threshold)"
                )
            return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.aging_rate = self.options.aging_rate
        self.vllm = self.options.vllm
        self.preempt_threshold = None if self.vllm else self.options.preempt_threshold
        rate = self.aging_rate
        live = frozenset((RUNNING,))
        if self.vllm:
            super().__init__(key=lambda s: (s.priority, s.arrival_time, s.request_id, s.index))
            # worst first; among equals the first admitted (a re-admission re-keys: `rekey`)
            self.running = LazyHeap(key=lambda s: (-s.priority, -s.arrival_time, s.admitted_seq_no), live=live, rekey=True)
            return
        super().__init__(key=lambda s: (s.priority + rate * s.arrival_time, s.arrival_time, s.arrival_no, s.index))
        # the running sequences, worst first (the keys negated): `peek()` is the victim
        self.running = LazyHeap(
            key=lambda s: (-(s.priority + rate * s.arrival_time), -s.arrival_time, -s.arrival_no, -s.index),
            live=live,
        )

    def key(self, seq: Sequence) -> float:
        """The static aging key: effective priority at time `now` is `key - aging_rate * now`."""
        return seq.priority + self.aging_rate * seq.arrival_time

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        push, n = self.running.push, len(ctx.running)
        for s in seqs:
            push(s, num_live=n)

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self.queue.ordered(), head_of_line=True)

    @hookimpl
    def select_victim(self, requester: Sequence) -> Sequence | None:
        worst = self.running.peek()
        if requester.state is RUNNING:
            return worst  # None (cannot happen while requester runs) would preempt the requester
        threshold = self.preempt_threshold
        if threshold is None or worst is None:
            return None
        if self.key(requester) <= self.key(worst) - threshold:
            return worst
        return None
