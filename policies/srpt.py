"""`srpt`: shortest remaining processing time first, with an optional starvation guard.

A request's remaining processing time is `prefill_weight x tokens still to prefill + output tokens
still to generate`. Tokens to prefill are its prompt, or after a recompute preemption everything it
must compute again. The weight says what a prefill token costs next to an output token: a step
decodes one token per request but prefills up to `max_num_batched_tokens` tokens, so the default
weight, `1 / max_num_batched_tokens`, counts the remaining time in steps; 1.0 counts tokens alike
(which, on prompts several times longer than outputs, orders mostly by prompt length).

The expected output length is the request's `expected_output_tokens` hint when it has one
(`--oracle-lengths` sets it to the true length in simulation), else the answer of the
`estimate_output_tokens` hook (a stacked estimator: `--plugin length_mean`, `--plugin
length_regression`, see `policies/length_estimators.py`), else, when no plugin answers, `srpt`'s own
running mean per tenant of completed requests' output lengths (a private `LengthMean`). An estimate
above `max_new_tokens` counts as `max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from metroline.api import (
    Candidates,
    LazyHeap,
    PluginOptions,
    RUNNING,
    Sequence,
    StepContext,
    arrival_key,
    hookimpl,
    take_options,
)
from .length_estimators import LengthMean


def tokens_to_prefill(seq: Sequence) -> int:
    """Known tokens still to compute before `seq` decodes: its prompt when new, the rest of it in
    the middle of a prefill, every known token but the newest after a recompute preemption, 0 while
    decoding."""
    n = seq.num_uncomputed_tokens
    if len(seq.token_ids) > seq.num_prompt_tokens:
        n -= 1  # the newest output token is the input of the next decode, not prefill
    return max(0, n)


class SRPT:
    """Admits the request with the shortest remaining processing time first.

    Decides:

    - **admission**: waiting (and swapped) requests by remaining processing time,
      `prefill_weight x tokens still to prefill + expected output tokens still to generate`
      (least first), ties by arrival. It is computed when the request joins the queue (arrival,
      preemption) and kept while it waits: the queue is a heap keyed at push, never re-sorted.
      **Head-of-line**: a candidate whose KV blocks do not fit stops admission for the step
      (so the cost of a step stays proportional to what it admits, and freed blocks go to the
      shortest request rather than to ever smaller ones).
    - **starvation guard** (`max_wait_s`): a request that has waited longer than `max_wait_s`
      seconds since its arrival is promoted ahead of every other candidate, first come first served
      among the promoted ones, head-of-line like the rest.
    - **victim**: for a running request that needs a KV block, the running request with the longest
      remaining processing time (ties: the later `arrival_time`, then the later `arrival_no`, then
      the higher sample `index`; possibly the requester itself). A waiting request never preempts a
      running one (SRPT here is non-preemptive at admission).
    - **expected output length**: the request's hint, else the `estimate_output_tokens` hook's
      answer (a stacked estimator plugin), else, when no plugin answers, the rounded mean output
      length of the requests of the same tenant that completed so far (`prior_output_tokens` until
      the tenant has one): the estimate of `length_mean`, which `srpt` keeps privately in
      `mean_lengths` (it does not answer the hook for other plugins).

    Options: see `SRPT.Options` (`prior_output_tokens`, `max_wait_s`, `prefill_weight`).

    Guard bound: let R become overdue at `t = arrival(R) + max_wait_s`. Requests arriving later
    become overdue later and queue behind it, so only the `Q` requests that arrived before R and
    are still waiting at `t` are admitted before it. With `S = max_num_seqs` slots, no preemption
    and every admitted request holding its slot at most `H` seconds, R waits at most
    `max_wait_s + step + ceil((Q + 1) / S) * H` (`step`: the promotion is seen at the next step).
    """

    name = "srpt"

    class Options(PluginOptions):
        """`[plugin_options.srpt]`."""

        prior_output_tokens: int = Field(
            default=128, ge=0, description="the expected output length for a tenant with no finished request yet"
        )
        max_wait_s: float | None = Field(
            default=None, ge=0, allow_inf_nan=False,
            description="the wait in seconds after which a request is promoted; None: no guard",
        )
        prefill_weight: float | None = Field(
            default=None, ge=0, allow_inf_nan=False,
            description="what one token to prefill counts for, next to one output token to generate; "
            "None: `1 / max_num_batched_tokens`",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        prior_output_tokens, max_wait_s, prefill_weight = (
            self.options.prior_output_tokens, self.options.max_wait_s, self.options.prefill_weight
        )
        self.mean_lengths = LengthMean(prior_output_tokens)  # the estimate when no plugin answers
        self.prior_output_tokens = prior_output_tokens
        self.prefill_weight = None if prefill_weight is None else float(prefill_weight)
        self.max_wait_s = None if max_wait_s is None else float(max_wait_s)
        self.expected: dict[Sequence, int] = {}  # total output tokens expected, per live sequence
        self.queue = LazyHeap(rekey=True)  # by (remaining, arrival), keyed at each push
        self.by_arrival = None  # the guard's queue, by arrival
        if max_wait_s is not None:
            self.by_arrival = LazyHeap(key=arrival_key)

    # --- estimates -----------------------------------------------------------------------------

    def expected_output(self, ctx: StepContext, seq: Sequence) -> int:
        """The total output length expected of `seq` (the hint, else the hook, else the tenant's
        mean), cached per sequence. A plugin's answer that is not an int >= 0 never reaches here:
        the hook relay refuses it with a `PluginError` naming the plugin (`answers.CHECKS`)."""
        est = self.expected.get(seq)
        if est is None:
            est = seq.expected_output_tokens
            if est is None:
                est = ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)
                if est is None:
                    est = self.mean_lengths.estimate_output_tokens(seq)
            self.expected[seq] = est
        return est

    def remaining(self, ctx: StepContext, seq: Sequence) -> float:
        """`prefill_weight` x tokens still to prefill + expected output tokens still to generate."""
        weight = self.prefill_weight
        if weight is None:
            weight = 1.0 / ctx.config.max_num_batched_tokens
        return weight * tokens_to_prefill(seq) + seq.remaining_output_tokens(self.expected_output(ctx, seq))

    # --- observers -----------------------------------------------------------------------------

    def queue_key(self, ctx: StepContext, seq: Sequence) -> tuple:
        """The admission key of `seq`, computed when it joins the queue (least first):
        `(remaining, arrival_time, arrival_no, index)`. A subclass may key otherwise
        (`metroline.plugins_contrib.residual_sjf` adds the prefix cache and aging)."""
        return (self.remaining(ctx, seq), seq.arrival_time, seq.arrival_no, seq.index)

    def _push(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        push, key = self.queue.push, self.queue_key
        n = len(ctx.waiting) + len(ctx.swapped)
        for s in seqs:
            push(s, key(ctx, s), n)
        if self.by_arrival is not None:
            push = self.by_arrival.push
            for s in seqs:
                push(s)

    @hookimpl
    def on_arrival(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._push(ctx, seqs)

    @hookimpl
    def on_preempted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._push(ctx, seqs)

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        expected, discard = self.expected, self.queue.discard
        for s in seqs:
            expected.pop(s, None)
            discard(s)
        self.mean_lengths.on_finished(seqs)

    # --- decisions -----------------------------------------------------------------------------

    @hookimpl
    def admission(self, ctx: StepContext) -> Candidates:
        if self.by_arrival is None:
            return Candidates(self.queue.ordered(), head_of_line=True)
        return Candidates(self._guarded(ctx.now - self.max_wait_s), head_of_line=True)

    def _guarded(self, overdue_before: float) -> Iterator[Sequence]:
        """The overdue requests (arrived before `overdue_before`) first come first served, then the
        rest shortest first."""
        oldest = self.by_arrival.ordered()
        try:
            for seq in oldest:
                if seq.arrival_time >= overdue_before:
                    break
                yield seq
        finally:
            oldest.close()  # puts back the first one that is not overdue
        yield from self.queue.ordered()

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        if requester.state is not RUNNING:
            return None
        remaining = self.remaining
        return max(ctx.running, key=lambda s: (remaining(ctx, s), s.arrival_time, s.arrival_no, s.index))
