"""`RealtimeExecutor`: the simulated executor on the wall clock, for load tests through HTTP.

Each step sleeps the cost model's duration (counted from the moment the step's plan reached the
executor) and the engine clock is the wall clock, so a server on the simulated executor answers at
the request rates and latencies of a real deployment, with stand-in tokens. It imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..core.plan import StepPlan, StepResult
from .simulated import SimulatedExecutor


class RealtimeExecutor:
    """Wraps a `SimulatedExecutor`: same cost model and stats, wall-clock time.

    `now()` is seconds since the executor was made (`clock()`, monotonic). `execute(plan)` sleeps
    until `cost_model.step_time(plan)` seconds after it was called (a step that already took longer,
    because the scheduler was slow, does not sleep). `idle_until(t)` sleeps until `t`.
    """

    name = "sim"

    def __init__(
        self,
        inner: SimulatedExecutor,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inner = inner
        self.cost_model = inner.cost_model
        self.stats = inner.stats
        self._clock = clock
        self._sleep = sleep
        self._t0 = clock()
        self._step_time = inner.cost_model.step_time

    def now(self) -> float:
        return self._clock() - self._t0

    def execute(self, plan: StepPlan) -> StepResult:
        start = self.now()
        dt = self._step_time(plan)
        self.stats.record(plan, dt)
        left = start + dt - self.now()
        if left > 0:
            self._sleep(left)
        return StepResult(self.now(), None)

    def idle_until(self, t: float) -> None:
        left = t - self.now()
        if left > 0:
            self.stats.record_idle(left)
            self._sleep(left)

    def describe(self) -> dict:
        return {**self.inner.describe(), "clock": "wall"}
