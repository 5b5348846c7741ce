"""`static`: static batching, the baseline continuous batching is measured against.

When nothing runs, the (up to) `max_num_seqs` oldest waiting requests form a batch; no other
request is admitted until every member of the batch has finished. Members are admitted in arrival
order (over several steps if the prefill budget asks for it), and a preempted member stays in its
batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from metroline.api import (
    ArrivalQueue,
    Candidates,
    FINISHED,
    PluginOptions,
    QUEUED,
    Sequence,
    StepContext,
    hookimpl,
    last_admitted_victim,
    take_options,
)


class StaticBatching(ArrivalQueue):
    name = "static"

    class Options(PluginOptions):
        """`static` takes no options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        super().__init__()
        self.batch: list[Sequence] = []

    @hookimpl
    def admission(self, ctx: StepContext) -> Candidates:
        self.batch = [s for s in self.batch if s.state is not FINISHED]
        if not self.batch:
            self.batch = self._form(ctx.config.max_num_seqs)
        return Candidates(self._pending(), head_of_line=True)

    def _form(self, size: int) -> list[Sequence]:
        batch = []
        for seq in self.queue.ordered():
            batch.append(seq)
            if len(batch) == size:
                break
        return batch

    def _pending(self) -> Iterator[Sequence]:
        for s in self.batch:
            if s.state in QUEUED:
                yield s

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        return last_admitted_victim(ctx, requester)
