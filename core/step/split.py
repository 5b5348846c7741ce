"""The split phase of the step: `split_budget` divides the step's token budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plugins.budget import Split
from .step_state import Reserves

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager
    from .context import StepContext
    from .queues import Queues
    from .step_state import StepState


def split_budget(plugins: PluginManager, ctx: StepContext, queues: Queues, budget: int, step: StepState) -> int:
    """Ask `plugins`' `split_budget` to divide `budget` tokens between the decodes and the prefills
    of `queues`; sets the step's budget, chunk cap and reserves (`Split.shares`) on `step`.
    Returns how many sequences decode (running or swapped). An answer outside the budget is a
    `PluginError`. Under `EngineConfig.budget_mode = "one"` the two shares are one budget, their
    sum (`StepState.one_budget`)."""
    num_decoding = 0
    for queue in (queues.running, queues.swapped):
        for s in queue:
            n = len(s.token_ids)
            if s.num_computed_tokens == n - 1 and n > s.num_prompt_tokens:  # s.is_decoding
                num_decoding += 1
    split = plugins.hook.split_budget(
        ctx=ctx, budget=budget, num_decoding=num_decoding,
        num_prefilling=len(queues.running) - num_decoding + len(queues.swapped), num_waiting=len(queues.waiting),
    )
    if not isinstance(split, tuple) or not 3 <= len(split) <= 5:
        raise plugins.invalid("split_budget", f"expected Split(decode, prefill, max_chunk), got {split!r}")
    decode, prefill, max_chunk, max_prefills, shares = Split(*split)
    if decode < 0 or prefill < 0 or decode + prefill > budget or max_chunk < 1 or (
        max_prefills is not None and max_prefills < 0
    ):
        raise plugins.invalid(
            "split_budget",
            f"{Split(*split)} is outside the budget of {budget} tokens "
            "(shares and max_prefills must be >= 0 and the shares sum to at most the budget, max_chunk >= 1)",
        )
    step.reserves = Reserves(shares, decode, prefill) if shares else None
    if step.one_budget:  # EngineConfig.budget_mode "one": both shares see their sum
        decode = prefill = decode + prefill
    step.set_budget(decode, prefill, budget if max_prefills is None else max_prefills)
    step.max_chunk = max_chunk
    return num_decoding
