"""The core's rescue: the one case where it overrides the plugins (see the `admission` hookspec).

When the plugins wanted something served (a running request, or an admission candidate), the step
scheduled nothing, and no plugin asked to be woken up later, the core serves the oldest unfinished
request itself, as fcfs would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plugins.preemption import older
from ..requests.sequence import RUNNING, WAITING

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..requests.sequence import Sequence
    from .admission import Admission
    from .context import StepContext
    from .queues import Queues
    from .step_state import StepState
    from .victim_loop import VictimLoop


class Rescue:
    """Serving the oldest request of `queues` with the whole budget (`config`'s
    `max_num_batched_tokens`), a chunk of `config.prefill_chunk` and the core's own victims
    (through `room`), admitting it through `admission` when it is not running. The scheduler
    calls it when the plugins wanted something served (a running request, or an admission
    candidate), the step scheduled nothing, and none asked to be woken up later. `rescues` counts
    the steps it served."""

    def __init__(
        self, config: EngineConfig, ctx: StepContext, queues: Queues, room: VictimLoop, admission: Admission
    ) -> None:
        self.config = config
        self.ctx = ctx
        self.queues = queues
        self.room = room
        self.admission = admission
        self.rescues = 0

    def serve(self, step: StepState) -> None:
        """Serve the oldest unfinished request, with the whole budget, a prefill chunk of
        `config.prefill_chunk` (`max_prefill_chunk`, or the whole budget without one) and the
        core's own victims (the youngest running requests), as fcfs would; its victims are
        announced (`on_preempted`)."""
        oldest = self._oldest()
        if oldest is None:
            return
        self.rescues += 1
        config = self.config
        if config.debug:
            import structlog

            structlog.get_logger("metroline").info(
                "scheduler.rescue", request_id=oldest.seq_id, step=self.ctx.step,
                reason="the plugins scheduled nothing: the core serves the oldest request",
            )
        budget = config.max_num_batched_tokens
        step.set_budget(budget, budget, budget)
        max_chunk = config.prefill_chunk
        step.rescuing = True
        try:
            if oldest.state is RUNNING:
                decode = oldest.is_decoding
                n = 1 if decode else min(oldest.num_uncomputed_tokens, budget, max_chunk)
                if self.room.grow(oldest, n, step):
                    step.schedule(oldest, n, decode)
            elif oldest.state is WAITING:
                self.admission.admit_waiting(oldest, step, max_chunk)
            else:
                self.admission.admit_swapped(oldest, step, max_chunk)
        finally:
            step.rescuing = False
        step.announce_preempted()  # the rescue's victims, before the step's admissions

    def _oldest(self) -> Sequence | None:
        oldest = None
        q = self.queues
        for queue in (q.running, q.waiting, q.swapped):
            for s in queue:
                if oldest is None or older(s, oldest):
                    oldest = s
        return oldest
