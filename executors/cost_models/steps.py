"""The `steps` cost model: a fixed time per non-empty step."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...core.step.plan import StepPlan
from .base import StrictConfig, is_empty


class StepsConfig(StrictConfig):
    """`step_time`: seconds per non-empty step."""

    step_time: float = Field(default=0.01, gt=0.0)


class StepsCostModel:
    """Every non-empty step costs `step_time` seconds: the clock counts steps.

    `fixed_step_time` tells the simulated executor that every non-empty step costs the same, so
    it keeps an integer step count and its clock reads exact multiples of the step time."""

    name = "steps"

    def __init__(self, **params: Any) -> None:
        self.config = StepsConfig(**params)
        self._dt = self.config.step_time
        self.fixed_step_time = self._dt

    def step_time(self, plan: StepPlan) -> float:
        return 0.0 if is_empty(plan) else self._dt

    def describe(self) -> dict:
        return {"name": self.name, **self.config.model_dump()}
