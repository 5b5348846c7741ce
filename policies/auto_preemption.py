"""`auto_preemption`: the preemption mode `auto`, chosen per victim between swap and recompute.

A `wrapper=True` `select_victim` hookimpl: the ordering policy below still picks the victim, this
plugin picks how it is preempted, so it stacks on any policy (`--policy srpt --plugin
auto_preemption`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pydantic import Field

from metroline.api import (
    PluginOptions,
    Preempt,
    RECOMPUTE,
    RUNNING,
    SWAP,
    SWAPPED,
    Sequence,
    StepContext,
    hookimpl,
    take_options,
)


class AutoPreemption:
    """`auto_preemption`: swap victims while few requests are swapped out, recompute beyond.

    Decides the preemption mode only; the victim is the base policy's answer (a `Sequence`, or the
    sequence of a `Preempt`, whose mode is replaced; when the policy answers None for a running
    requester, the requester itself, as the core would). The victim is swapped when, at the moment
    of the decision, `len(ctx.swapped) < max_swapped_share * len(ctx.running)` (the victim still
    counted as running), and recomputed otherwise. Swapping keeps a victim's KV (no recompute when
    it comes back) but each swapped request waits on the host and holds host blocks; capping them
    at a share of the running batch keeps the swapped backlog small, and the victims beyond it pay
    the recompute instead. A swap the host space cannot hold falls back to recompute (the core's
    rule).

    Needs a host swap space: `EngineConfig.swap_space_blocks >= 1` (`--swap-space-blocks N`).
    The plugin cannot see the config when it is built, so it checks at the first step with
    arrivals and raises `ValueError` naming the option (the engine stops with a `PluginError`):
    falling back to recompute silently would make `auto` runs look like `recompute` ones.

    Options: see `AutoPreemption.Options` (`max_swapped_share`).

    Counters: `swaps` and `recomputes`, the preemptions that ended swapped or recomputed.
    No admission order and no budget split.
    """

    name = "auto_preemption"

    class Options(PluginOptions):
        """`[plugin_options.auto_preemption]`."""

        max_swapped_share: float = Field(
            default=0.5, ge=0, allow_inf_nan=False,
            description="the cap on swapped requests as a share of the running ones; 0 always recomputes",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.max_swapped_share = self.options.max_swapped_share
        self.swaps = 0
        self.recomputes = 0
        self._checked = False

    @hookimpl
    def on_arrival(self, ctx: StepContext) -> None:
        if not self._checked:
            if ctx.config.swap_space_blocks < 1:
                raise ValueError(
                    "auto_preemption needs a host swap space: set swap_space_blocks >= 1 "
                    f"(--swap-space-blocks N), got {ctx.config.swap_space_blocks}"
                )
            self._checked = True

    @hookimpl(wrapper=True)
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Generator[None, Any, Any]:
        answer = yield
        if isinstance(answer, Preempt):
            victim = answer[0]
        elif answer is None:
            if requester.state is not RUNNING:
                return None
            victim = requester
        else:
            victim = answer
        if len(ctx.swapped) < self.max_swapped_share * len(ctx.running):
            return Preempt(victim, SWAP)
        return Preempt(victim, RECOMPUTE)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            if s.state is SWAPPED:
                self.swaps += 1
            else:
                self.recomputes += 1
