"""`residual_sjf`: shortest remaining work first, where the work a prompt still needs is what the
prefix cache does not hold, with an aging term so that long requests are not starved (the residual-
aware and aging-aware SJF proposed to vLLM in PRs #51375 and #29366). It is `srpt` with two
additions; `srpt` keeps every option and rule it has (estimates, the `max_wait_s` promotion, the
victim)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from metroline.api import SWAPPED, Sequence, StepContext
from metroline.policies.srpt import SRPT, tokens_to_prefill


class ResidualSJF(SRPT):
    """Admit the request with the least residual work first, aged by its wait.

    Decides the admission order (everything else is `srpt`'s, see `metroline.policies.srpt.SRPT`).
    A waiting request's key, computed when it joins the queue (its arrival, or its preemption),
    is `residual - aging_rate x seconds waited`, where `residual = prefill_weight x max(0, tokens
    to prefill - tokens the prefix cache holds) + expected output tokens still to generate`:
    least first, ties by arrival. `srpt` counts a prompt at its full length; a prompt whose
    leading blocks are cached (a conversation's next turn, a shared system prompt) costs only the
    rest (`cache_aware`, on by default; a swapped request brings its computed tokens back, so
    only its uncomputed ones count, as in `srpt`). The cache is looked up once, at queueing: a
    prefix cached or evicted while the request waits does not move it.

    Aging: the key orders requests exactly as `residual + aging_rate x arrival_time` does, whatever
    the clock, so the queue is keyed once and never re-sorted. A request with residual `R` is
    admitted after a later arrival with residual `r` only if that one arrived less than
    `(R - r) / aging_rate` seconds after it: no request is overtaken by requests that arrive more
    than `R / aging_rate` seconds after it. `aging_rate = 0` is `srpt` with a cache-aware residual.
    `srpt`'s `max_wait_s` (the hard promotion of PR #51375) may be set as well.

    Options: `srpt`'s (`prior_output_tokens`, `max_wait_s`, `prefill_weight`), and
    `aging_rate`, `cache_aware` (see `ResidualSJF.Options`).

    Cost: one prefix-cache lookup (O(cached blocks + 1)) per request queued; O(log n) per push
    and per candidate pulled, as `srpt`.
    """

    name = "residual_sjf"

    class Options(SRPT.Options):
        """`[plugin_options.residual_sjf]`: `srpt`'s options and two of its own."""

        aging_rate: float = Field(
            default=10.0, ge=0, allow_inf_nan=False,
            description="how much residual work (output tokens, or prefill tokens x prefill_weight) one second "
            "of waiting is worth",
        )
        cache_aware: bool = Field(
            default=True, description="whether the prompt tokens the prefix cache holds are left out of the residual"
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aging_rate = self.options.aging_rate
        self.cache_aware = self.options.cache_aware

    def residual(self, ctx: StepContext, seq: Sequence) -> float:
        """`srpt`'s remaining work less the prefill tokens the prefix cache holds now (weighted)."""
        remaining = self.remaining(ctx, seq)
        if not self.cache_aware or seq.state is SWAPPED:
            return remaining
        weight = self.prefill_weight
        if weight is None:
            weight = 1.0 / ctx.config.max_num_batched_tokens
        to_prefill = tokens_to_prefill(seq)
        return remaining - weight * min(to_prefill, ctx.cached_prefix_tokens(seq))

    def queue_key(self, ctx: StepContext, seq: Sequence) -> tuple:
        return (self.residual(ctx, seq) + self.aging_rate * seq.arrival_time, seq.arrival_time, seq.arrival_no,
                seq.index)
