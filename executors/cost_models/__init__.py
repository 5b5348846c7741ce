"""Cost models: how many seconds a step plan takes, for the simulated executor.

`make_cost_model(name, **params)` builds one by name:

- `steps`: a fixed time per step.
- `linear`: per-step, per-token and per-block terms added up.
- `roofline`: the slower of compute and memory traffic for a model shape on a GPU.
- `calibrated`: the linear model fitted to a real executor (a `metroline calibrate` fit file, or a
  real run's step log).

Any model takes `slowdown` (a factor > 0, `scaled.py`): its step times multiplied by it, a
planted slowdown for a power check. Every model costs an empty step (nothing scheduled, no block ops) 0 seconds. Parameters are checked
by pydantic (`extra="forbid"`), so a typo or an out-of-range value is an error naming the field.

The package has one module per model (`steps`, `linear`, `roofline` with its `hardware` presets,
`calibrated` with its `least_squares` fit) and their shared `base`; every public name is importable
from here.
"""

from __future__ import annotations

from typing import Any

from .base import CostModel, StrictConfig, is_empty
from .calibrated import (
    FITTED,
    STEP_LOG_COLUMNS,
    CalibratedConfig,
    CalibratedCostModel,
    calibrated_cost_model,
    read_step_log,
)
from .hardware import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelShape
from .least_squares import fit_linear
from .linear import LinearConfig, LinearCostModel
from .roofline import RooflineConfig, RooflineCostModel, attention_pairs
from .scaled import ScaledCostModel
from .steps import StepsConfig, StepsCostModel

__all__ = [
    "COST_MODELS", "FITTED", "GPU_PRESETS", "MODEL_PRESETS", "STEP_LOG_COLUMNS",
    "CalibratedConfig", "CalibratedCostModel", "CostModel", "GpuSpec", "LinearConfig",
    "LinearCostModel", "ModelShape", "RooflineConfig", "RooflineCostModel", "ScaledCostModel", "StepsConfig",
    "StepsCostModel", "StrictConfig", "attention_pairs", "calibrated_cost_model", "fit_linear",
    "is_empty", "make_cost_model", "read_step_log",
]

COST_MODELS = {
    "steps": StepsCostModel,
    "linear": LinearCostModel,
    "roofline": RooflineCostModel,
    "calibrated": calibrated_cost_model,
}
"""Cost model name -> factory taking the model's parameters as keywords."""


def make_cost_model(name: str, **params: Any) -> CostModel:
    """Build the cost model `name` (one of `COST_MODELS`) from its parameters.

    Raises ValueError for an unknown name, and pydantic's ValidationError (a ValueError) naming the
    field for a bad or unknown parameter or an unknown preset. `slowdown` (any model) multiplies
    its step times (`ScaledCostModel`).
    """
    try:
        factory = COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; valid: {', '.join(COST_MODELS)}") from None
    if "slowdown" in params:
        factor = params.pop("slowdown")
        return ScaledCostModel(factory(**params), factor)
    return factory(**params)
