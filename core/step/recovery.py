"""Recovery after a `PluginError`: which requests a failed step leaves in doubt, and ending them.

A plugin error can interrupt a step anywhere: after some candidates were given blocks, after a
victim was preempted but before `on_preempted` told the policies, after the forward ran but before
its tokens were appended. The engine then ends the step's requests as `failed` (their blocks are
freed by the next reap, or by `fail` itself where the reap would not find them) and raises; everything else stays queued and consistent, so an engine
that is stepped again serves on.

- An error while scheduling (`in_flight`): the plan is lost with the exception, so the requests
  that may have been touched are failed: this step's arrivals (a policy may not have heard of
  them), every running and swapped sequence (they may hold blocks allocated, copied or swapped for
  the lost plan), and waiting sequences that hold blocks (a half-done admission) or were preempted
  and not readmitted (a policy may not have heard of the preemption). Waiting requests that never
  ran stay queued.
- An error after the forward (`of_plan`): the plan's scheduled, admitted and preempted sequences
  and the samples forked from them (in the plan's step: `plan.forked`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..requests.sequence import FINISHED, RUNNING, SWAPPED, FinishReason, Sequence


def in_flight(live: Iterable[Sequence], arrived: Iterable[Sequence]) -> list[Sequence]:
    """Of the `live` sequences, those an error inside `Scheduler.schedule` may have left
    inconsistent (see the module docstring); `arrived`: those that joined the waiting queue for
    this step."""
    arrived = set(arrived)
    return [
        s for s in live
        if s in arrived or s.state is RUNNING or s.state is SWAPPED or s.block_table or s.num_lost_tokens
    ]


def of_plan(plan) -> list[Sequence]:
    """The sequences of an executed plan, with the samples forked from them."""
    seqs = [*plan.scheduled, *plan.admitted, *plan.preempted]
    seqs += [c for s in plan.scheduled for c in s.children]
    return seqs


def ending(scheduler) -> list[Sequence]:
    """The sequences the next `reap()` will take out (so that an `on_finished` error there does
    not lose their records)."""
    return list(scheduler.ended)


def fail(scheduler, seqs: Iterable[Sequence], now: float, error: str) -> list[Sequence]:
    """End `seqs` as failed; returns those it ended (the others had ended before). Blocks held
    outside the queue that owns them (an admission or a swap in cut short) are given back here;
    the others at the next reap."""
    pool, running, swapped = scheduler.pool, scheduler.running, scheduler.swapped
    failed = []
    for seq in seqs:
        if seq.state is FINISHED:
            continue
        failed.append(seq)
        if seq.block_table and seq not in running:
            pool.release(seq.block_table)
            seq.block_table = []
            seq.num_computed_tokens = 0
        if seq.host_table and seq not in swapped:
            scheduler.swap.free(seq.host_table)
            seq.host_table = []
        scheduler.finish(seq, FinishReason.FAILED, now, error)
    return failed
