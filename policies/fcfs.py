"""`fcfs`: first come, first served.

- admission: arrival order (a preempted request keeps its place), head-of-line: when the oldest
  waiting request does not fit, nothing behind it is admitted;
- victim: the running request admitted last; a waiting request never preempts a running one.
"""

from __future__ import annotations

from typing import Any

from ..core.plugins.candidates import Candidates
from ..core.plugins.hookspecs import hookimpl
from ..core.plugins.lazy_heap import ArrivalQueue
from ..core.plugins.options import PluginOptions, take_options
from ..core.plugins.victims import last_admitted_victim
from ..core.requests.sequence import Sequence
from ..core.step.context import StepContext


class FCFS(ArrivalQueue):
    name = "fcfs"

    class Options(PluginOptions):
        """`fcfs` takes no options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        super().__init__()

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self.queue.ordered(), head_of_line=True)

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        return last_admitted_victim(ctx, requester)
