"""`least_computed`: under KV pressure, preempt the running request that has computed the fewest
tokens (least-computed-first, the victim rule proposed to vLLM in vLLM RFC #54644)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from metroline.api import PluginOptions, Preempt, RUNNING, Sequence, StepContext, hookimpl, take_options


def least_computed(seqs: Any) -> Sequence | None:
    """The sequence of `seqs` with the fewest computed tokens (`num_computed_tokens`); among
    equals, the one admitted last (the default victim rule's choice). None when `seqs` is empty."""
    return min(seqs, key=lambda s: (s.num_computed_tokens, -s.admitted_seq_no), default=None)


class LeastComputed:
    """Preempt the running request with the least sunk compute when a running request needs a
    KV block and none is free.

    A recompute preemption throws away the victim's KV: every token it had computed is computed
    again when it is readmitted (less what the prefix cache still holds then). vLLM's default
    victim, and metroline's `fcfs`, is the request admitted last, which may be a long prompt
    that has just been prefilled. Least-computed-first picks the running request whose
    `num_computed_tokens` is smallest (ties: the one admitted last), so a preemption wastes as
    little as any single victim can. The waste is reported as the recompute tax of `metroline
    run` and `metroline compare` (recomputed tokens over all tokens the steps computed).

    Decides: `select_victim`, as a wrapper, so it stacks on any base policy (`--policy fcfs
    --plugin least_computed`, or `fcfs+least_computed` in `compare --policies`):

    - for a running requester (the KV-pressure case), the victim is the least-computed running
      request, possibly the requester itself, in the preemption mode the base policy chose;
    - for a waiting or swapped candidate, the base policy's answer stands (whether an admission
      may preempt, and whom, stays the base's choice: `priority`'s lower-priority victims, or
      none under `fcfs`).

    The core's protection of requests preempted twice without progress still applies: a
    protected victim is replaced by the core (`ctx.is_protected`).

    Options: none. Cost: O(running) per victim asked for.
    """

    name = "least_computed"

    class Options(PluginOptions):
        """`least_computed` takes no options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)

    @hookimpl(wrapper=True)
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Generator[None, Any, Any]:
        answer = yield
        if requester.state is not RUNNING:
            return answer
        victim = least_computed(ctx.running)
        if victim is None:
            return answer
        return Preempt(victim, answer.mode) if isinstance(answer, Preempt) else victim
