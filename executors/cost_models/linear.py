"""The `linear` cost model: per-step, per-token and per-block terms added up."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...core.step.plan import StepPlan
from ..base import count_block_ops
from .base import StrictConfig, is_empty


class LinearConfig(StrictConfig):
    """Coefficients of the linear model, in seconds.

    The defaults are estimates for Llama-3-8B in bf16 on one A100 80GB SXM, derived from its
    datasheet (312 TFLOP/s dense bf16, 2.039 TB/s HBM) at 60% of peak FLOP/s and 80% of peak
    bandwidth, not measured:

    - `per_step` 9 ms: reading ~15 GB of matmul weights once per forward.
    - `per_prefill_token` 86 us: 2 x 8e9 FLOPs per token at 187 TFLOP/s.
    - `per_decode_token` 40 us: decode batches sit between memory-bound (marginal cost ~0) and
      compute-bound (86 us); halfway.
    - `per_kv_token` 80 ns: 128 KiB of K and V per context token (2 x 32 layers x 8 KV heads x 128
      x 2 bytes) read at 1.6 TB/s.
    - `per_swap_block` 84 us: a 16-token block (2 MiB) over a 25 GB/s host link, per swap out or in.
    - `per_copy_block` 2.6 us: reading and writing 2 MiB in HBM (copy-on-write).
    """

    per_step: float = Field(default=9e-3, ge=0.0)
    per_prefill_token: float = Field(default=8.6e-5, ge=0.0)
    per_decode_token: float = Field(default=4e-5, ge=0.0)
    per_kv_token: float = Field(default=8e-8, ge=0.0)
    per_swap_block: float = Field(default=8.4e-5, ge=0.0)
    per_copy_block: float = Field(default=2.6e-6, ge=0.0)


class LinearCostModel:
    """`per_step + per_prefill_token x prefill + per_decode_token x decode + per_kv_token x context
    tokens + per_swap_block x (swap outs + swap ins) + per_copy_block x copies`.

    Coefficients and their defaults: `LinearConfig`.
    """

    name = "linear"

    def __init__(self, **params: Any) -> None:
        self.config = c = LinearConfig(**params)
        self._coef = (c.per_step, c.per_prefill_token, c.per_decode_token, c.per_kv_token)
        self._swap, self._copy = c.per_swap_block, c.per_copy_block

    def step_time(self, plan: StepPlan) -> float:
        if is_empty(plan):
            return 0.0
        step, prefill, decode, kv = self._coef
        t = (step + prefill * plan.num_prefill_tokens + decode * plan.num_decode_tokens
             + kv * plan.num_context_tokens)
        if plan.block_ops:
            copies, outs, ins = count_block_ops(plan.block_ops)
            t += self._swap * (outs + ins) + self._copy * copies
        return t

    def describe(self) -> dict:
        return {"name": self.name, **self.config.model_dump()}
