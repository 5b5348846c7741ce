"""`slowdown`: any cost model's step times multiplied by a factor (a planted slowdown or speed-up),
what a power check of a comparison plants in one arm (`--cost-param slowdown=1.03` makes every
step 3% slower)."""

from __future__ import annotations

import math

from ...core.step.plan import StepPlan
from .base import CostModel


class ScaledCostModel:
    """The step times of `base`, each multiplied by `factor` (> 0)."""

    def __init__(self, base: CostModel, factor: float) -> None:
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"slowdown: must be a number > 0 (1.03 is 3% slower), got {factor!r}")
        self.base, self.factor = base, float(factor)
        self.name = getattr(base, "name", "cost model")
        fixed = getattr(base, "fixed_step_time", None)
        self.fixed_step_time = None if fixed is None else self.factor * fixed
        """A fixed step time of the base (`steps`) scaled, which the simulated executor's exact clock reads."""

    def step_time(self, plan: StepPlan) -> float:
        return self.factor * self.base.step_time(plan)

    def describe(self) -> dict:
        return {**self.base.describe(), "slowdown": self.factor}
