"""The core's rescue: the one case where it overrides the plugins (see the `admission` hookspec).

`Rescue` is a part of `Scheduler` (a mixin: it serves and admits with the scheduler's methods).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plugins.preemption import older
from ..requests.sequence import RUNNING, WAITING

if TYPE_CHECKING:
    from ..requests.sequence import Sequence
    from .plan import StepPlan


class Rescue:
    """Serving the oldest unfinished request when the plugins wanted something served but the step
    scheduled nothing."""

    def _needs_rescue(self, plan: StepPlan) -> bool:
        """The plugins wanted something served (a running request, or an admission candidate), the
        step scheduled nothing, and none asked to be woken up later."""
        return not plan.scheduled and self._offered and self.ctx.wakeup is None

    def _rescue(self, plan: StepPlan) -> None:
        """Serve the oldest unfinished request, with the whole budget, a prefill chunk of
        `max_prefill_chunk` and the core's own victims (the youngest running requests), as fcfs
        would."""
        oldest = self._oldest()
        if oldest is None:
            return
        self.rescues += 1
        if self.config.debug:
            import structlog

            structlog.get_logger("metroline").info(
                "scheduler.rescue", request_id=oldest.seq_id, step=self.ctx.step,
                reason="the plugins scheduled nothing: the core serves the oldest request",
            )
        budget = self._budget
        plan.set_budget(budget, budget, budget)
        max_chunk = self.config.prefill_chunk
        self._rescuing = True
        try:
            if oldest.state is RUNNING:
                decode = oldest.is_decoding
                n = 1 if decode else min(oldest.num_uncomputed_tokens, budget, max_chunk)
                if self._grow(oldest, n, plan):
                    self._schedule(oldest, n, plan, decode)
            elif oldest.state is WAITING:
                self._admit_waiting(oldest, plan, max_chunk)
            else:
                self._admit_swapped(oldest, plan, max_chunk)
        finally:
            self._rescuing = False
        self._notify_preempted(plan)  # the rescue's victims, before the step's admissions

    def _oldest(self) -> Sequence | None:
        oldest = None
        for queue in (self.running, self.waiting, self.swapped):
            for s in queue:
                if oldest is None or older(s, oldest):
                    oldest = s
        return oldest
