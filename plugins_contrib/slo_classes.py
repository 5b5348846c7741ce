"""`slo_classes`: interactive and batch service classes, stacked on any base policy."""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Literal

from pydantic import Field

from metroline.api import (
    Candidates,
    LazyHeap,
    PluginOptions,
    Preempt,
    QUEUED,
    RUNNING,
    Sequence,
    Split,
    StepContext,
    arrival_key,
    close_candidates,
    hookimpl,
    take_options,
)

INTERACTIVE = "interactive"
BATCH = "batch"
ServiceClass = Literal["interactive", "batch"]


class SLOClasses:
    """Two service classes: interactive requests decode every step, batch requests take the rest.

    A request's class: its tenant's entry in `classes` if it has one, else interactive when its
    priority is at most `interactive_max_priority`, else `default_class`. With no options,
    requests of priority <= 0 (the default priority) are interactive and the others batch.

    Decides (each as a wrapper around what the base policy answered, so it stacks on any policy,
    e.g. `--policy fcfs --plugin slo_classes`):

    - `split_budget`: keeps a decode share for interactive requests: the decode share is raised
      to at least min(interactive requests decoding, ceil(`interactive_decode_share` x budget)),
      taken from the prefill share; otherwise the base split stands.
    - `order_running`: interactive requests first, then batch ones, each class in the base
      policy's order. The decode share goes to interactive decodes first; batch decodes get the
      rest. So while the interactive requests decoding fit in the reserved share, each of them
      gets a token every step, whatever the base split and however many batch requests run.
    - `admission`: waiting interactive requests are tried first (in arrival order), then the base
      policy's candidates without the interactive ones; the base policy's head-of-line choice
      applies to both. With no interactive request waiting the base answer passes untouched.
    - `select_victim`: never an interactive victim while a batch request runs: when the base
      policy picks an interactive request (or none, which preempts a running requester), the
      batch request admitted last is preempted instead, with the mode the base chose. A waiting
      requester the base would not make room for still waits.

    Options: see `SLOClasses.Options` (`classes`, `interactive_max_priority`, `default_class`,
    `interactive_decode_share`).

    Cost per step: O(interactive running) for the split, O(running) for the order (the hook
    hands over the whole running list; nothing is done when no interactive request runs), O(1)
    per admission candidate; victim search walks back from the last admitted batch request.
    """

    name = "slo_classes"

    class Options(PluginOptions):
        """`[plugin_options.slo_classes]`."""

        classes: dict[str, ServiceClass] = Field(
            default_factory=dict, description="{tenant: class}: the class of every request of the tenant"
        )
        interactive_max_priority: int | None = Field(
            default=0,
            description="priorities <= it are interactive (lower is more urgent); None: the priority does not "
            "decide the class",
        )
        default_class: ServiceClass = Field(default=BATCH, description="the class of the other requests")
        interactive_decode_share: float = Field(
            default=0.25, ge=0, le=1, allow_inf_nan=False,
            description="the fraction of the step's token budget reserved for interactive decodes",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = self.options = take_options(self, args, kwargs)
        self.classes = {t: c == INTERACTIVE for t, c in options.classes.items()}
        self.interactive_max_priority = options.interactive_max_priority
        self.default_interactive = options.default_class == INTERACTIVE
        self.interactive_decode_share = options.interactive_decode_share
        self.interactive_running: dict[Sequence, None] = {}
        """Running interactive sequences, in admission order (as reported by `on_admitted`)."""
        self.batch_running: dict[Sequence, None] = {}
        """Running batch sequences, in admission order."""
        self.interactive_waiting = LazyHeap(key=arrival_key)

    def is_interactive(self, seq: Sequence) -> bool:
        """The class of `seq`: True for interactive."""
        cls = self.classes.get(seq.tenant)
        if cls is not None:
            return cls
        if self.interactive_max_priority is not None and seq.priority <= self.interactive_max_priority:
            return True
        return self.default_interactive

    # --- observers -------------------------------------------------------------------------------

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if self.is_interactive(s):
                self.interactive_waiting.push(s)

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            (self.interactive_running if self.is_interactive(s) else self.batch_running)[s] = None

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if self.is_interactive(s):
                self.interactive_running.pop(s, None)
                self.interactive_waiting.push(s)
            else:
                self.batch_running.pop(s, None)

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.interactive_running.pop(s, None)
            self.batch_running.pop(s, None)

    # --- decisions -------------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def split_budget(self, budget: int) -> Generator[None, Any, Split | None]:
        split = yield
        if split is None or not self.interactive_running:
            return split
        split = Split(*split)
        decode, prefill = split.decode, split.prefill
        reserve = math.ceil(self.interactive_decode_share * budget)
        if decode >= reserve:
            return split
        want = min(reserve, sum(1 for s in self.interactive_running if s.is_decoding))
        if decode >= want:
            return split
        return split._replace(decode=want, prefill=min(prefill, budget - want))

    @hookimpl(wrapper=True)
    def order_running(self) -> Generator[None, Any, Iterable[Sequence] | None]:
        order = yield
        if order is None or not self.interactive_running:
            return order
        interactive = self.interactive_running
        first, rest = [], []
        for s in order:
            (first if s in interactive else rest).append(s)
        first.extend(rest)
        return first

    @hookimpl(wrapper=True)
    def admission(self) -> Generator[None, Any, Any]:
        answer = yield
        if answer is None or self.interactive_waiting.peek() is None:
            return answer
        return Candidates(self._interactive_first(answer), getattr(answer, "head_of_line", True))

    def _interactive_first(self, answer: Iterable[Sequence]) -> Iterator[Sequence]:
        first = self.interactive_waiting.ordered()
        rest = iter(answer)
        try:
            yield from first
            is_interactive = self.is_interactive
            for s in rest:
                if s.state in QUEUED and is_interactive(s):
                    continue  # tried above
                yield s
        finally:
            close_candidates(first)  # the heap takes back the interactive requests still waiting
            close_candidates(rest)

    @hookimpl(wrapper=True)
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Generator[None, Any, Any]:
        answer = yield
        if isinstance(answer, Preempt):
            victim, mode = answer
        else:
            victim, mode = answer, None
        if victim is None:
            if requester.state is not RUNNING:
                return answer  # the base leaves a waiting candidate waiting
            victim = requester  # None preempts a running requester
        if not self.is_interactive(victim):
            return answer
        batch = self._last_batch(ctx)
        if batch is None:
            return answer
        return batch if mode is None else Preempt(batch, mode)

    def _last_batch(self, ctx: StepContext) -> Sequence | None:
        running = ctx.running
        for s in reversed(self.batch_running):
            if s.state is RUNNING and s in running:
                return s
        return None
