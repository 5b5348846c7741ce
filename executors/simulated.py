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

from typing import Any

from ..core.step.plan import StepPlan, StepResult
from .base import ExecutorStats
from .cost_models import CostModel
from .speculation_sim import AcceptanceModel, draft_time


class SimulatedExecutor:
    """Runs step plans on a virtual clock that starts at `start_time` seconds.

    `stats` counts the plans executed (`total_steps`), the seconds busy (`busy_time`, the sum of
    step times) and idle (clock jumps by `idle_until`), and the block ops (copies, swap outs, swap
    ins).

    Under speculative decoding (`bind` reads the engine's `speculative_config`), a plan's drafts
    are accepted by an `AcceptanceModel` (`StepResult.accepted`) and the draft model's forwards
    add their time (`draft_time`, also kept in `stats.draft_time`).
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
        self._acceptance: AcceptanceModel | None = None
        self._draft_ratio = 0.0
        self.draft_busy = 0.0  # seconds of draft-model forwards

    def bind(self, config: Any) -> None:
        """Take the engine's `speculative_config` (if any): its acceptance model and draft cost."""
        spec = getattr(config, "speculative_config", None)
        if spec is not None:
            self._acceptance = AcceptanceModel(spec)
            self._draft_ratio = spec.draft_cost_ratio

    @property
    def total_steps(self) -> int:
        return self.stats.total_steps

    @property
    def busy_time(self) -> float:
        if self._fixed is not None:
            return self._total_ticks * self._fixed + self.draft_busy
        return self.stats.busy_time

    def now(self) -> float:
        return self._clock

    def execute(self, plan: StepPlan) -> StepResult:
        dt = self._step_time(plan)
        accepted = extra = None
        if plan.drafts:
            accepted, extra = self._speculate(plan)
        if dt:
            fixed = self._fixed
            if fixed is not None:
                assert dt == fixed, f"{self.cost_model!r} promised steps of {fixed} s, gave {dt}"
                self._ticks += 1
                self._total_ticks += 1
                self._clock = self._anchor + self._ticks * fixed + (self._add(extra) if extra else self._sum + self._comp)
            else:
                self._clock = self._anchor + self._add(dt + extra if extra else dt)
        self.stats.record(plan, dt + extra if extra else dt)
        return StepResult(self._clock, None, accepted=accepted)

    def _speculate(self, plan: StepPlan) -> tuple[dict, float]:
        """How many drafts of each drafting sequence are accepted, and the drafter's seconds."""
        model = self._acceptance
        if model is None:
            raise RuntimeError("a plan with drafts, but the executor was not bound to a speculative_config")
        extra = draft_time(plan, self.cost_model, self._draft_ratio)
        self.draft_busy += extra
        return {seq: model.accepted(seq, k) for seq, k in plan.drafts.items()}, extra

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
            **({"busy_time": self.busy_time} if self._fixed is not None else {}),
            **({"draft_time": self.draft_busy} if self._acceptance is not None else {}),
        }
