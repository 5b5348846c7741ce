"""`fcfs`: first come, first served.

- admission: arrival order (a preempted request keeps its place), head-of-line: when the oldest
  waiting request does not fit, nothing behind it is admitted;
- victim: the running request admitted last; a waiting request never preempts a running one.
"""

from __future__ import annotations

from ..core.candidates import Candidates
from ..core.context import StepContext
from ..core.hookspecs import hookimpl
from ..core.lazy_heap import ArrivalQueue
from ..core.sequence import SeqState, Sequence


def last_admitted(ctx: StepContext) -> Sequence:
    """The running sequence admitted most recently."""
    return max(ctx.running, key=lambda s: s.admitted_seq_no)


class FCFS(ArrivalQueue):
    name = "fcfs"

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self.queue.ordered(), head_of_line=True)

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        if requester.state is not SeqState.RUNNING:
            return None
        return last_admitted(ctx)
