"""`RealtimeExecutor`: the simulated executor on the wall clock, for load tests through HTTP.

Each step lasts the cost model's duration (counted from the moment the step's plan reached the
executor) and the engine clock is the wall clock, so a server on the simulated executor answers at
the request rates and latencies of a real deployment, with stand-in tokens. It imports no torch.

Its `tokenizer` renders the stand-in tokens as text (`StandInTokenizer`: token 17 is `" 17"`), so
the engine detokenises them and applies stop strings itself, as it does for a real model: a stop
string ends a request as `stop`, not as a cancellation by the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..core.serving.tokens import StandInTokenizer
from ..core.step.plan import StepPlan, StepResult
from .simulated import SimulatedExecutor


class RealtimeExecutor:
    """Wraps a `SimulatedExecutor`: same cost model and stats, wall-clock time.

    `now()` is seconds since the executor was made (`clock()`, monotonic). `execute(plan)` takes
    `cost_model.step_time(plan)` seconds from the moment it was called (a step that already took
    longer, because the scheduler was slow, takes no more):

    - by default it sleeps until then (`sleep`), as a blocking device call would;
    - with `deferred = True` it returns at once, its result stamped at the end time, and
      `ready_at` says when (engine clock) that result is due: the caller waits until then before
      it hands the tokens out. An asyncio loop waits with `asyncio.sleep` and keeps serving
      meanwhile, with no thread (`AsyncEngine` does this).

    `idle_until(t)` sleeps until `t`.
    """

    name = "sim"

    def __init__(
        self,
        inner: SimulatedExecutor,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tokenizer: Any = None,
    ) -> None:
        self.inner = inner
        self.cost_model = inner.cost_model
        self.stats = inner.stats
        self.tokenizer = tokenizer if tokenizer is not None else StandInTokenizer()
        self.deferred = False
        self.ready_at = 0.0
        self._clock = clock
        self._sleep = sleep
        self._t0 = clock()
        self._step_time = inner.cost_model.step_time

    def now(self) -> float:
        return self._clock() - self._t0

    def bind(self, config: Any) -> None:
        """The engine's config: speculative decoding's acceptance model and draft cost (as the
        simulator's, see `SimulatedExecutor.bind`)."""
        self.inner.bind(config)

    def execute(self, plan: StepPlan) -> StepResult:
        start = self.now()
        dt = self._step_time(plan)
        accepted = None
        if plan.drafts:
            accepted, extra = self.inner._speculate(plan)
            dt += extra
        self.stats.record(plan, dt)
        if self.deferred:
            self.ready_at = start + dt
            return StepResult(self.ready_at, None, accepted=accepted)
        left = start + dt - self.now()
        if left > 0:
            self._sleep(left)
        return StepResult(self.now(), None, accepted=accepted)

    def idle_until(self, t: float) -> None:
        left = t - self.now()
        if left > 0:
            self.stats.record_idle(left)
            self._sleep(left)

    def describe(self) -> dict:
        return {**self.inner.describe(), "clock": "wall"}
