"""`token_rr`: token round-robin over the running requests."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from metroline.api import (
    ArrivalQueue,
    Candidates,
    PluginOptions,
    RUNNING,
    Sequence,
    Split,
    StepContext,
    StepPlan,
    hookimpl,
    take_options,
)


class TokenRoundRobin(ArrivalQueue):
    """Shares the step's tokens among the running requests in turns.

    - running order: a rotation over the running requests; every request that had its turn in
      the step (a decode token, a full quantum of prefill, or the end of its prompt) moves to the
      back, in the order it was served, and the others keep their place at the front (a prefill
      chunk cut short by the budget does not end the turn). When the decode share cannot serve every
      decoding request, the ones left out are served first next step, so between two decode
      tokens of a request every other request that was decoding all along gets at most one: no
      running request falls more than one token behind another. Newly admitted requests join at
      the back.
    - prefill: each prefilling request gets at most `prefill_quantum` tokens per turn (the
      `split_budget` answer caps chunks at the quantum) and then moves to the back, so a long
      prompt cannot hold the prefill share while shorter ones wait. The split itself is the
      default one: a decode token for every decoding request that the budget allows, the rest to
      prefill. (A budget-split plugin stacked on top replaces this split and its quantum.)
    - admission: arrival order (a preempted request keeps its place), head-of-line: when the
      oldest waiting request does not fit, nothing behind it is admitted.
    - victim: for a running request that needs a block, the running request at the back of the
      rotation -- the one served most recently, furthest from its next turn (it may be the
      requester itself); a waiting request never preempts a running one.

    Options: see `TokenRoundRobin.Options` (`prefill_quantum`).
    """

    name = "token_rr"

    class Options(PluginOptions):
        """`[plugin_options.token_rr]`."""

        prefill_quantum: int = Field(
            default=256, ge=1,
            description="tokens per prefill turn (a larger `max_prefill_chunk` is capped to it, a smaller one wins)",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.prefill_quantum = self.options.prefill_quantum
        super().__init__()
        self.rotation: dict[Sequence, None] = {}  # running requests, next turn first

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.rotation.pop(s, None)
        super().on_preempted(seqs)

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        rotation = self.rotation
        for s in seqs:
            rotation.pop(s, None)
            rotation[s] = None

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.rotation.pop(s, None)

    @hookimpl
    def on_step_end(self, ctx: StepContext, plan: StepPlan) -> None:
        rotation = self.rotation
        quantum = min(self.prefill_quantum, ctx.config.prefill_chunk)
        for s, n in plan.scheduled.items():
            if n < quantum and s.num_uncomputed_tokens > 1:
                continue  # a prefill chunk cut short by the budget: its turn is not over
            if s in rotation:
                del rotation[s]
                rotation[s] = None

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self.queue.ordered(), head_of_line=True)

    @hookimpl
    def split_budget(self, ctx: StepContext, budget: int, num_decoding: int) -> Split:
        decode = min(budget, num_decoding)
        return Split(decode, budget - decode, min(self.prefill_quantum, ctx.config.prefill_chunk))

    @hookimpl
    def order_running(self, running: list[Sequence]) -> list[Sequence]:
        rotation = self.rotation
        if len(rotation) != len(running):
            # a request this policy was not told about (e.g. admitted by a stacked plugin's
            # path it did not see): resynchronise, keeping the known ones' turns first
            members = set(running)
            for s in [s for s in rotation if s not in members]:
                del rotation[s]
            for s in running:
                if s not in rotation:
                    rotation[s] = None
        return list(rotation)

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        if requester.state is not RUNNING:
            return None
        for s in reversed(self.rotation):
            if s.state is RUNNING:
                return s
        return None
