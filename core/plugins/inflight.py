"""`PromptsInFlight`: the running sequences still in the middle of their prompt's prefill.

With chunked prefill (`max_prefill_chunk`, `decode_first`'s `max_chunk`) a prompt takes its KV
blocks chunk by chunk over several steps: a plugin that budgets blocks (`reserve`) or prefill
tokens (`prefill_first`) must count what these prompts still need. The tracker is fed from
`on_admitted` and pruned lazily as it is walked: a sequence leaves it once it decodes, is
preempted or ends.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..requests.sequence import RUNNING, Sequence
from ..step.context import StepContext


class PromptsInFlight:
    """Running sequences admitted in the middle of a prefill, in admission order."""

    __slots__ = ("_seqs",)

    def __init__(self) -> None:
        self._seqs: dict[Sequence, None] = {}

    def admitted(self, seqs: list[Sequence]) -> None:
        """Call from `on_admitted`: keeps those of `seqs` that are not decoding yet."""
        tracked = self._seqs
        for s in seqs:
            if not s.is_decoding:
                tracked[s] = None

    def __iter__(self) -> Iterator[Sequence]:
        """The sequences still running and prefilling (the others are dropped as they are met)."""
        tracked = self._seqs
        for s in list(tracked):
            if s.state is not RUNNING or s.is_decoding:
                del tracked[s]
            else:
                yield s

    def blocks_to_come(self, ctx: StepContext) -> int:
        """KV blocks these prompts still need for all their known tokens."""
        return sum(max(0, missing_blocks(ctx, s)) for s in self)


def missing_blocks(ctx: StepContext, seq: Sequence) -> int:
    """Blocks `seq` still needs to hold all its known tokens, beyond those it holds."""
    return ctx.blocks_needed(len(seq.token_ids)) - len(seq.block_table)
