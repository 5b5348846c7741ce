"""`slo_classes`: interactive and batch service classes, stacked on any base policy."""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator
from typing import Any

from ..core.budget import Split
from ..core.candidates import Candidates, close_candidates
from ..core.context import StepContext
from ..core.hookspecs import hookimpl
from ..core.lazy_heap import LazyHeap, arrival_key
from ..core.preemption import Preempt
from ..core.sequence import QUEUED, RUNNING, Sequence

INTERACTIVE = "interactive"
BATCH = "batch"


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

    Options (`[plugin_options.slo_classes]`):

    - `classes` {tenant: "interactive" | "batch"};
    - `interactive_max_priority` (int or None, default 0): priorities <= it are interactive
      (lower is more urgent); None: the priority does not decide the class;
    - `default_class` ("batch" or "interactive", default "batch"): for the other requests;
    - `interactive_decode_share` (0..1, default 0.25): the fraction of the step's token budget
      reserved for interactive decodes.

    Cost per step: O(interactive running) for the split, O(running) for the order (the hook
    hands over the whole running list; nothing is done when no interactive request runs), O(1)
    per admission candidate; victim search walks back from the last admitted batch request.
    """

    name = "slo_classes"

    def __init__(
        self,
        classes: dict[str, str] | None = None,
        interactive_max_priority: int | None = 0,
        default_class: str = BATCH,
        interactive_decode_share: float = 0.25,
    ) -> None:
        if classes is None:
            classes = {}
        if not isinstance(classes, dict):
            raise ValueError(f"slo_classes option classes must be a table {{tenant: class}}, got {classes!r}")
        for tenant, cls in classes.items():
            if cls not in (INTERACTIVE, BATCH):
                raise ValueError(
                    f"slo_classes option classes[{tenant!r}] must be 'interactive' or 'batch', got {cls!r}"
                )
        if interactive_max_priority is not None and (
            isinstance(interactive_max_priority, bool) or not isinstance(interactive_max_priority, int)
        ):
            raise ValueError(
                f"slo_classes option interactive_max_priority must be an integer, got {interactive_max_priority!r}"
            )
        if default_class not in (INTERACTIVE, BATCH):
            raise ValueError(f"slo_classes option default_class must be 'interactive' or 'batch', got {default_class!r}")
        if (
            isinstance(interactive_decode_share, bool) or not isinstance(interactive_decode_share, (int, float))
            or not 0.0 <= interactive_decode_share <= 1.0
        ):
            raise ValueError(
                f"slo_classes option interactive_decode_share must be a number in [0, 1], got {interactive_decode_share!r}"
            )
        self.classes = {str(t): c == INTERACTIVE for t, c in classes.items()}
        self.interactive_max_priority = interactive_max_priority
        self.default_interactive = default_class == INTERACTIVE
        self.interactive_decode_share = float(interactive_decode_share)
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
