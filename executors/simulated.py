"""`SimulatedExecutor`: a virtual clock that a cost model advances by each step's duration.

It computes nothing: there are no logits (`StepResult.logits` is None; the engine's sampler gives
stand-in tokens) and block ops are only counted. Its work per step is O(1) plus what the cost model
needs, so a simulated run goes as fast as the scheduler.

The clock never accumulates float error: it is `anchor + busy`, where `anchor` is the start time
or the time of the last idle jump, and `busy` the time of the steps since: `n * step_time` for a
cost model with a fixed step time (`steps`: after n steps from 0 the clock reads exactly
`n * step_time`, so a request arriving at 0.1 s is seen by the step that starts at 0.1 s), and a
compensated (Neumaier) sum of the step times otherwise.
"""

from __future__ import annotations

from ..core.step.plan import StepPlan, StepResult
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
        self._fixed = getattr(cost_model, "fixed_step_time", None)
        self._anchor = start_time
        self._ticks = 0  # steps since the anchor (fixed step time)
        self._sum = 0.0  # seconds since the anchor and the compensation of that sum (otherwise)
        self._comp = 0.0
        self._total_ticks = 0

    @property
    def total_steps(self) -> int:
        return self.stats.total_steps

    @property
    def busy_time(self) -> float:
        if self._fixed is not None:
            return self._total_ticks * self._fixed
        return self.stats.busy_time

    def now(self) -> float:
        return self._clock

    def execute(self, plan: StepPlan) -> StepResult:
        dt = self._step_time(plan)
        if dt:
            fixed = self._fixed
            if fixed is not None:
                assert dt == fixed, f"{self.cost_model!r} promised steps of {fixed} s, gave {dt}"
                self._ticks += 1
                self._total_ticks += 1
                self._clock = self._anchor + self._ticks * fixed
            else:
                self._clock = self._anchor + self._add(dt)
        self.stats.record(plan, dt)
        return StepResult(self._clock, None)

    def _add(self, dt: float) -> float:
        """Add `dt` to the time since the anchor (Neumaier's compensated sum); returns that time."""
        s = self._sum
        t = s + dt
        self._comp += (s - t) + dt if abs(s) >= abs(dt) else (dt - t) + s
        self._sum = t
        return t + self._comp

    def idle_until(self, t: float) -> None:
        if t > self._clock:
            self.stats.record_idle(t - self._clock)
            self._clock = self._anchor = t
            self._ticks = 0
            self._sum = self._comp = 0.0

    def describe(self) -> dict:
        return {
            "name": self.name,
            "cost_model": self.cost_model.describe(),
            "start_time": self.start_time,
            **self.stats.as_dict(),
            **({"busy_time": self._total_ticks * self._fixed} if self._fixed is not None else {}),
        }
