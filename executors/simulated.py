"""`SimulatedExecutor`: a virtual clock that a cost model advances by each step's duration.

It computes nothing: there are no logits (`StepResult.logits` is None; the engine's sampler gives
stand-in tokens) and block ops are only counted. Its work per step is O(1) plus what the cost model
needs, so a simulated run goes as fast as the scheduler.
"""

from __future__ import annotations

from ..core.plan import StepPlan, StepResult
from .base import ExecutorStats
from .cost_models import CostModel


class SimulatedExecutor:
    """Runs step plans on a virtual clock that starts at `start_time` seconds.

    `stats` counts the plans executed (`total_steps`), the seconds busy (`busy_time`, the sum of
    step times) and idle (clock jumps by `idle_until`), and the block ops (copies, swap outs, swap
    ins).
    """

    name = "sim"

    def __init__(self, cost_model: CostModel, start_time: float = 0.0) -> None:
        self.cost_model = cost_model
        self.start_time = start_time
        self.stats = ExecutorStats()
        self._clock = start_time
        self._step_time = cost_model.step_time

    @property
    def total_steps(self) -> int:
        return self.stats.total_steps

    @property
    def busy_time(self) -> float:
        return self.stats.busy_time

    def now(self) -> float:
        return self._clock

    def execute(self, plan: StepPlan) -> StepResult:
        dt = self._step_time(plan)
        self._clock += dt
        self.stats.record(plan, dt)
        return StepResult(self._clock, None)

    def idle_until(self, t: float) -> None:
        if t > self._clock:
            self.stats.record_idle(t - self._clock)
            self._clock = t

    def describe(self) -> dict:
        return {
            "name": self.name,
            "cost_model": self.cost_model.describe(),
            "start_time": self.start_time,
            **self.stats.as_dict(),
        }
