"""`fcfs`: first come, first served.

- admission: arrival order (a preempted request keeps its place), head-of-line: when the oldest
  waiting request does not fit, nothing behind it is admitted;
- victim: the running request admitted last; a waiting request never preempts a running one.
"""

from __future__ import annotations

from typing import Any

from metroline.api import (
    ArrivalQueue,
    Candidates,
    PluginOptions,
    Sequence,
    StepContext,
    hookimpl,
    last_admitted_victim,
    take_options,
)


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
