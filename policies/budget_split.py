"""Budget-split strategies: how a step's token budget is shared between decodes and prefill chunks.

Each class implements `split_budget` only, so it stacks on any ordering policy
(`--policy srpt --plugin decode_first`). The scheduler serves running sequences first (decodes and
the next chunks of running partial prefills, in `order_running` order) and admits waiting ones
after, so a partial prefill always gets its chunk before a new prompt starts.

- `decode_first` (stall-free batching, as in Sarathi-Serve): decodes first, prefill chunks capped;
- `prefill_first` (prefill-prioritizing, as vLLM v0 without chunked prefill): pending prefill work
  takes the budget first and decodes get what is left, so a long-prompt burst stalls decodes;
- `weighted_budget`: decodes first under a weighted cost constraint
  `w_prefill * prefill + w_decode * decode <= capacity` calibrated from a cost model.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from metroline.api import (
    PluginOptions,
    PromptsInFlight,
    Sequence,
    Split,
    StepContext,
    StepPlan,
    hookimpl,
    missing_blocks,
    take_options,
)


def max_partial_prefills_option() -> Any:
    """The `max_partial_prefills` option, which the three strategies share."""
    return Field(
        default=None, ge=1,
        description="at most this many sequences get a prefill chunk per step (`Split.max_prefills`); "
        "running partial prefills are served first, so this also caps how many prompts are in flight "
        "at once; None: no cap",
    )


class DecodeFirst:
    """`decode_first`: stall-free batching (Sarathi-Serve). Decides the budget split only.

    Every step serves one token to each decoding sequence first (`decode = min(num_decoding,
    budget)`), then the rest of the budget goes to prefill: the next chunks of running partial
    prefills (served by the scheduler before any admission), then new prompts. Prefill chunks are
    capped at `max_chunk` tokens, so a long prompt is spread over many steps next to the decodes
    instead of taking whole steps. Whenever a sequence is decoding, the step's decode share is at
    least 1: decodes are never starved by prefill.

    Options: see `DecodeFirst.Options` (`max_chunk`, `max_partial_prefills`).

    No admission order (head-of-line or skip is the base policy's) and no victim rule.
    """

    name = "decode_first"

    class Options(PluginOptions):
        """`[plugin_options.decode_first]`."""

        max_chunk: int = Field(
            default=512, ge=1,
            description="the longest prefill chunk of one sequence in one step (never above the "
            "engine's `max_prefill_chunk`)",
        )
        max_partial_prefills: int | None = max_partial_prefills_option()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.max_chunk = self.options.max_chunk
        self.max_partial_prefills = self.options.max_partial_prefills

    @hookimpl
    def split_budget(self, ctx: StepContext, budget: int, num_decoding: int) -> Split:
        decode = num_decoding if num_decoding < budget else budget
        config = ctx.config
        chunk = config.chunk_cap(len(ctx.running) + len(ctx.waiting) + len(ctx.swapped))
        return Split(decode, budget - decode, min(self.max_chunk, chunk), self.max_partial_prefills)


class PrefillFirst:
    """`prefill_first`: prefill work takes the step budget first, decodes get the rest.

    Decides the budget split only. Each step the plugin estimates the prefill tokens that can run
    now (one chunk each): the running partial prefills, plus the waiting sequences (in arrival
    order, at most `SCAN_LIMIT` of them, while slots last), counting only prompts whose remaining
    KV blocks all fit in the free blocks (a waiting one that does not fit ends the scan). That
    demand, at most the budget, is served first: decodes get `min(num_decoding, budget - demand)`
    and prefill the rest. A short prompt next to a few decodes leaves room for every decode, but a
    prompt burst larger than the budget takes whole steps and every decode stalls until it is
    prefilled: the behaviour of a prefill-prioritizing scheduler (vLLM v0 without chunked
    prefill), kept as the baseline that `decode_first` is measured against.

    Liveness: because only prompts that fit count (vLLM v0 likewise admits a prompt only when its
    blocks fit), starved decodes are not then preempted for the blocks of the prefill that starved
    them. When a step cut the decodes' share and then scheduled no prefill token, or preempted
    (the estimate was wrong, e.g. the base policy's candidate was another one), the next step
    serves decodes first.

    Options: see `PrefillFirst.Options` (`max_partial_prefills`).

    Prefill chunks are capped by the engine's `max_prefill_chunk` (default: the whole budget). No
    admission order (head-of-line or skip is the base policy's) and no victim rule.
    """

    name = "prefill_first"

    SCAN_LIMIT = 32
    """Waiting sequences looked at per step for the demand estimate (the scan also stops once the
    demand reaches the budget or slots run out)."""

    class Options(PluginOptions):
        """`[plugin_options.prefill_first]`."""

        max_partial_prefills: int | None = max_partial_prefills_option()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.max_partial_prefills = self.options.max_partial_prefills
        self._in_flight = PromptsInFlight()
        self._cut_step = -1  # last step whose split took share from decodes for prefill
        self._prefill_step = -1  # last step that scheduled prefill tokens

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        self._in_flight.admitted(seqs)

    @hookimpl
    def on_step_end(self, plan: StepPlan) -> None:
        if plan.num_prefill_tokens and not plan.preempted:
            self._prefill_step = plan.step

    @hookimpl
    def split_budget(self, ctx: StepContext, budget: int, num_decoding: int, num_waiting: int) -> Split:
        config = ctx.config
        chunk = config.chunk_cap(len(ctx.running) + len(ctx.waiting) + len(ctx.swapped))
        demand = 0
        previous = ctx.step - 1
        if num_decoding and not (self._cut_step == previous and self._prefill_step != previous):
            demand = self._demand(ctx, budget, chunk, num_waiting)
        decode = min(num_decoding, budget - demand)
        if decode < num_decoding:
            self._cut_step = ctx.step
        return Split(decode, budget - decode, chunk, self.max_partial_prefills)

    def _demand(self, ctx: StepContext, budget: int, chunk: int, num_waiting: int) -> int:
        """Prefill tokens that could run this step (capped at `budget`): chunks of prompts whose
        remaining blocks all fit in the free blocks, so that no prefill this share feeds can run
        the pool dry and preempt the decodes it starved (vLLM v0 admits a prompt only when its
        blocks fit, for the same reason)."""
        free = ctx.num_free_blocks()
        demand = 0
        for s in self._in_flight:
            need = missing_blocks(ctx, s)
            if need > free:
                continue
            free -= need
            demand += min(s.num_uncomputed_tokens, chunk)
            if demand >= budget:
                return budget
        if not num_waiting:
            return demand
        slots = ctx.config.max_num_seqs - len(ctx.running)
        scanned = 0
        for s in ctx.waiting:
            if slots <= 0 or scanned >= self.SCAN_LIMIT:
                break
            scanned += 1
            rest = s.num_uncomputed_tokens
            need = ctx.blocks_needed(rest)
            if need > free:
                break
            free -= need
            slots -= 1
            demand += min(rest, chunk)
            if demand >= budget:
                return budget
        return demand


class WeightedBudget:
    """`weighted_budget`: decodes first under a weighted step-cost constraint.

    Decides the budget split only. A step's cost is modelled as
    `w_prefill * prefill_tokens + w_decode * decode_tokens`, which must stay within `capacity`
    (and the token counts within the engine's budget). Decodes are served first:
    `decode = min(num_decoding, budget, floor(capacity / w_decode))`, then
    `prefill = min(budget - decode, floor((capacity - w_decode * decode) / w_prefill))`. So the
    step time stays near a target whatever the prefill/decode mix, where a plain token budget lets
    a prefill-heavy step cost far more than a decode-heavy one.

    Calibration: with a `linear` or `calibrated` cost model (step time = per_step +
    per_prefill_token * P + per_decode_token * D + per_kv_token * context + ...), take
    `w_prefill = per_prefill_token`, `w_decode = per_decode_token` and
    `capacity = target step time - per_step - per_kv_token * typical context tokens`, in seconds.
    `weights_from_cost_model(cost_model, target_step_s)` does this. The defaults are the `linear`
    cost model's default coefficients (Llama-3-8B on an A100, estimated) and a 50 ms step target.

    Options: see `WeightedBudget.Options` (`w_prefill`, `w_decode`, `capacity`,
    `max_partial_prefills`).

    Prefill chunks are capped by the engine's `max_prefill_chunk`. No admission order and no
    victim rule.
    """

    name = "weighted_budget"

    class Options(PluginOptions):
        """`[plugin_options.weighted_budget]`: seconds, or any unit used by all three of `w_prefill`,
        `w_decode` and `capacity`."""

        w_prefill: float = Field(
            default=8.6e-5, gt=0, allow_inf_nan=False, description="the cost of one prefill token"
        )
        w_decode: float = Field(default=4e-5, gt=0, allow_inf_nan=False, description="the cost of one decode token")
        capacity: float = Field(
            default=0.041, gt=0, allow_inf_nan=False,
            description="the most a step may cost; at least `w_prefill` and `w_decode`, so that one token "
            "of each kind fits in a step",
        )
        max_partial_prefills: int | None = max_partial_prefills_option()

        @field_validator("capacity")
        @classmethod
        def _fits_one_token(cls, capacity: float, info: ValidationInfo) -> float:
            for option in ("w_prefill", "w_decode"):
                weight = info.data.get(option)
                if weight is not None and capacity < weight:
                    raise ValueError(f"must be at least {option} ({weight!r}): otherwise no such token ever fits in a step")
            return capacity

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = self.options = take_options(self, args, kwargs)
        self.w_prefill, self.w_decode, self.capacity = options.w_prefill, options.w_decode, options.capacity
        self.max_partial_prefills = options.max_partial_prefills
        self._max_decode = self._fit(self.capacity, self.w_decode)

    @staticmethod
    def _fit(room: float, weight: float) -> int:
        """How many tokens of `weight` fit in `room` (rounding error forgiven)."""
        return max(0, math.floor(room / weight + 1e-9))

    def shares(self, budget: int, num_decoding: int) -> tuple[int, int]:
        """`(decode, prefill)` token shares for a step of `budget` tokens and `num_decoding` decodes."""
        decode = min(num_decoding, budget, self._max_decode)
        prefill = min(budget - decode, self._fit(self.capacity - self.w_decode * decode, self.w_prefill))
        return decode, prefill

    @hookimpl
    def split_budget(self, ctx: StepContext, budget: int, num_decoding: int) -> Split:
        decode, prefill = self.shares(budget, num_decoding)
        config = ctx.config
        chunk = config.chunk_cap(len(ctx.running) + len(ctx.waiting) + len(ctx.swapped))
        return Split(decode, prefill, chunk, self.max_partial_prefills)


def weights_from_cost_model(cost_model: Any, target_step_s: float, context_tokens: int = 0) -> dict[str, float]:
    """`weighted_budget` options from a `linear` or `calibrated` cost model: the per-token
    coefficients as weights and, as capacity, what a `target_step_s` step leaves after the fixed
    per-step cost and the attention over `context_tokens` cached tokens."""
    c = cost_model.config
    capacity = target_step_s - c.per_step - c.per_kv_token * context_tokens
    if capacity <= 0:
        raise ValueError(
            f"target_step_s {target_step_s} leaves no capacity after per_step {c.per_step} "
            f"and {context_tokens} context tokens"
        )
    return {"w_prefill": c.per_prefill_token, "w_decode": c.per_decode_token, "capacity": capacity}
