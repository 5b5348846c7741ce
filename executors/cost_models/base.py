"""What every cost model shares: the `CostModel` protocol, the empty-step rule and strict configs."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from ...core.step.plan import StepPlan


class CostModel(Protocol):
    """`step_time(plan)`: seconds the plan takes; `describe()`: name and parameters, JSON-ready."""

    def step_time(self, plan: StepPlan) -> float: ...

    def describe(self) -> dict: ...


def is_empty(plan: StepPlan) -> bool:
    """True for a step with nothing scheduled, no block ops and no tokens: every model costs it 0."""
    return not plan.scheduled and not plan.block_ops and not plan.num_tokens


class StrictConfig(BaseModel):
    """Parameters of a cost model: frozen, and an unknown field is an error naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
