"""`prefix_aware`: longest-prefix-match admission (SGLang's LPM) with aging, so that requests with
nothing cached cannot starve."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field

from metroline.api import (
    ArrivalQueue,
    Candidates,
    PluginOptions,
    SWAPPED,
    Sequence,
    StepContext,
    hookimpl,
    last_admitted_victim,
    take_options,
)


class PrefixAware(ArrivalQueue):
    """Admit the waiting requests whose prompts the prefix cache holds most of, with aging.

    Decides: the admission order. Each step it takes the `window` oldest waiting requests (by
    arrival, so the window always holds the oldest one), asks the prefix cache how many leading
    tokens of each it holds (`ctx.cached_prefix_tokens`; for a swapped request, the tokens it
    brings back), and tries them by descending score

        score = cached tokens + aging_rate * seconds since arrival

    (ties: older first); then the requests behind the window, in arrival order. The score orders
    requests exactly as `aging_rate * arrival - cached tokens` does, so no re-sort over time is
    needed: a cache hit of m tokens is worth m / aging_rate seconds of earlier arrival.

    Bound (no starvation): a request is only ever admitted before an older waiting one if it
    arrived less than `m / aging_rate` seconds after it, m being its cached tokens (at most its
    prompt length - 1). So a request that has waited `max_prompt_len / aging_rate` seconds is
    overtaken by nobody that arrives later: it is admitted after the finite set of requests that
    arrived before that point. With `aging_rate = 0` this is plain LPM, under which a request
    with no cached prefix waits as long as requests with a cached one keep arriving.

    Options: see `PrefixAware.Options` (`window`, `aging_rate`).

    Cost per step: O(window log n) to take the window from the arrival heap (n waiting), one
    prefix-cache lookup per window entry (O(cached blocks + 1) each), O(window log window) to
    sort; only when a slot is free (when none is, a waiting request cannot be admitted without a
    victim, which this policy never takes, so the window is tried in arrival order unscored).
    Requests behind the window cost O(log n) each, only as far as the scheduler pulls.

    Head-of-line: yes. When the best-scored candidate does not fit in the free blocks, admission
    stops for the step (skipping would let any request overtake and void the bound).

    Victim: for a running request that needs a block, the running request admitted last; a
    waiting request never preempts a running one.

    Stacking: it is a base policy (`--policy prefix_aware`). Stack budget, quota or victim plugins
    on it (e.g. `--plugin tenant_quota`, which filters its candidates); stacked over another
    ordering policy its `admission` answer replaces that policy's.
    """

    name = "prefix_aware"

    class Options(PluginOptions):
        """`[plugin_options.prefix_aware]`."""

        window: int = Field(default=64, ge=1, description="how many of the oldest waiting requests are scored")
        aging_rate: float = Field(
            default=1000.0, ge=0, allow_inf_nan=False,
            description="what one second of waiting is worth in cached tokens (tokens per second)",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        super().__init__()
        self.window = self.options.window
        self.aging_rate = self.options.aging_rate

    @hookimpl
    def admission(self, ctx: StepContext) -> Candidates:
        return Candidates(self._ordered(ctx), head_of_line=True)

    def _ordered(self, ctx: StepContext) -> Iterator[Sequence]:
        by_arrival = self.queue.ordered()
        try:
            if len(ctx.running) < ctx.config.max_num_seqs:
                window = []
                for seq in by_arrival:
                    window.append(seq)
                    if len(window) == self.window:
                        break
                if len(window) > 1:
                    window = self.rank(ctx, window)
                yield from window
            yield from by_arrival
        finally:
            by_arrival.close()  # the heap takes back whoever is still waiting

    def rank(self, ctx: StepContext, seqs: list[Sequence]) -> list[Sequence]:
        """`seqs` by descending score (see the class docstring), older first on ties."""
        rate = self.aging_rate
        scored = []
        for i, s in enumerate(seqs):
            cached = s.num_computed_tokens if s.state is SWAPPED else ctx.cached_prefix_tokens(s)
            scored.append((rate * s.arrival_time - cached, i, s))
        scored.sort(key=lambda t: (t[0], t[1]))
        return [t[2] for t in scored]

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        return last_admitted_victim(ctx, requester)
