"""`StepPlan`: what one step asks the executor to do, and `StepResult`: what it gave back."""

from __future__ import annotations

import sys

from typing import Any

from ...kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT
from ..plugins.deprecations import warn_attribute
from ..requests.sequence import Sequence


class StepPlan:
    """The decisions of one scheduler step, for the executor: a plain output record (the
    scheduler fills it through `metroline.core.step.step_state.StepState`; executors, metrics and
    the `on_step_end` observers read it).

    - `step`: the step number; `block_size`: tokens per KV block.
    - `scheduled`: sequence -> number of tokens to compute this step, in batch order. A sequence's
      tokens are `seq.token_ids[start:start + n]` at positions `start...start + n - 1`, with
      `start = seq.num_computed_tokens` (the scheduler advances it only after the step ran).
    - `decodes`: the scheduled sequences whose tokens are charged to the decode share (one, plus
      their drafts).
    - `drafts`: the decodes that carry draft tokens this step (speculative decoding) -> how many,
      `k`. Such a decode is scheduled `1 + k` tokens: its newest token, at position
      `start = seq.num_computed_tokens`, then the `k` positions after it, whose tokens the
      executor's drafter proposes (`StepResult.draft_tokens`, at most `k`); its KV slots cover
      them (and the config's lookahead). After the step it advances by the accepted drafts plus
      one (`metroline.core.step.speculation`).
    - `block_ops`: `(kind, src, dst)` copies and swaps to run, in order, before the forward pass
      (kinds in `metroline.kv_backends.block_ops`).
    - `sample_seqs`: the scheduled sequences that reach the end of their known tokens this step
      (a decode, or the last chunk of a prefill): the executor returns one row of logits for each,
      in this order.
    - token counts for cost models and metrics: `num_prefill_tokens`, `num_decode_tokens` (drafts
      included), `num_draft_tokens` (the drafts to verify), and
      `num_context_tokens` (KV tokens the attention reads: the sum of `start + n`).
    - `admitted`, `preempted`: the sequences admitted (in admission order) and preempted (in
      preemption order) while the plan was made.
    - `forked`: the samples of `n > 1` parents that sample their first token in this step;
      `fork_rows`: for each, its parent's index in `sample_seqs` (it samples from its parent's row
      of logits).
    - `decode_left`, `prefill_left`, `prefills_left`: the step's budget left unused (decode
      tokens, prefill tokens, prefill chunks) when the plan was complete. Executors ignore them.
    """

    __slots__ = (
        "step", "scheduled", "decodes", "drafts", "num_draft_tokens", "block_ops", "num_prefill_tokens", "num_decode_tokens",
        "num_context_tokens", "preempted", "admitted", "block_size", "sample_seqs",
        "forked", "fork_rows", "decode_left", "prefill_left", "prefills_left",
    )

    def __init__(self, step: int, block_size: int) -> None:
        self.step = step
        self.block_size = block_size
        self.scheduled: dict[Sequence, int] = {}
        self.decodes: set[Sequence] = set()
        self.drafts: dict[Sequence, int] = {}
        self.num_draft_tokens = 0
        self.block_ops: list[tuple[int, int, int]] = []
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.num_context_tokens = 0
        self.preempted: list[Sequence] = []
        self.admitted: list[Sequence] = []
        self.sample_seqs: list[Sequence] = []
        self.forked: list[Sequence] = []
        self.fork_rows: list[int] = []
        self.decode_left = self.prefill_left = self.prefills_left = 0

    # --- deprecated: the scheduler's own bookkeeping, now `StepState`'s -------------------------

    def set_budget(self, decode: int, prefill: int, prefills: int) -> None:
        """Deprecated since 0.2.0, removed in 0.3.0 (the step's budget is the scheduler's
        `StepState`): sets `decode_left`, `prefill_left`, `prefills_left`."""
        warn_attribute("StepPlan.set_budget", None, sys._getframe(1))
        self.decode_left, self.prefill_left, self.prefills_left = decode, prefill, prefills

    def add(self, seq: Sequence, n: int, decode: bool) -> None:
        """Deprecated since 0.2.0, removed in 0.3.0 (the scheduler fills the plan through its
        `StepState`): records `n` tokens of `seq` and spends them from the budget fields."""
        warn_attribute("StepPlan.add", None, sys._getframe(1))
        self.scheduled[seq] = n
        self.num_context_tokens += seq.num_computed_tokens + n
        if decode:
            self.decodes.add(seq)
            self.num_decode_tokens += n
            self.decode_left -= n
        else:
            self.num_prefill_tokens += n
            self.prefill_left -= n
            self.prefills_left -= 1

    def drop(self, seq: Sequence) -> None:
        """Deprecated since 0.2.0, removed in 0.3.0 (the scheduler fills the plan through its
        `StepState`): takes `seq` and its tokens out of the plan, back to the budget fields."""
        warn_attribute("StepPlan.drop", None, sys._getframe(1))
        n = self.scheduled.pop(seq, None)
        if n is None:
            return
        if seq in self.admitted:
            self.admitted.remove(seq)
        self.num_context_tokens -= seq.num_computed_tokens + n
        if seq in self.decodes:
            self.decodes.discard(seq)
            self.num_decode_tokens -= n
            self.decode_left += n
            self.num_draft_tokens -= self.drafts.pop(seq, 0)
        else:
            self.num_prefill_tokens -= n
            self.prefill_left += n
            self.prefills_left += 1

    def seal(self) -> None:
        """Deprecated since 0.2.0, removed in 0.3.0 (the scheduler seals the plan through its
        `StepState`): fixes `sample_seqs` from the scheduled sequences."""
        warn_attribute("StepPlan.seal", None, sys._getframe(1))
        self.sample_seqs = [s for s, n in self.scheduled.items() if s.num_computed_tokens + n == len(s.token_ids)]
        if self.drafts:  # a drafting decode samples its newest token's row first
            self.sample_seqs = [s for s in self.scheduled if s in self.drafts or s.num_computed_tokens
                                + self.scheduled[s] == len(s.token_ids)]

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.block_ops

    def copies(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == COPY]

    def swap_outs(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == SWAP_OUT]

    def swap_ins(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == SWAP_IN]

    def draft_positions(self, seq: Sequence) -> range:
        """The positions of `seq`'s draft tokens this step (empty when it carries none)."""
        start = seq.num_computed_tokens + 1
        return range(start, start + self.drafts.get(seq, 0))

    def positions(self, seq: Sequence) -> range:
        start = seq.num_computed_tokens
        return range(start, start + self.scheduled[seq])

    def slot_mapping(self, seq: Sequence) -> list[int]:
        """Cache slot (block id * block_size + offset) of each token `seq` computes this step."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in self.positions(seq)]


class StepResult:
    """What the executor returns: the clock after the step and one logits row per sample seq.

    `logits` is whatever the sampler understands (a tensor of shape `[len(sample_seqs), vocab]`
    for a real model, None for the simulator, whose tokens are stand-ins).

    With drafts in the plan (`StepPlan.drafts`): a real executor gives `draft_tokens`, each
    drafting sequence's proposed tokens (at most its `k`, in `plan.drafts` order), and
    `draft_logits`, one row per draft token in that order (the target's logits after it: its
    row in `logits` verifies its first draft, its row after draft `j` the draft `j + 1`, and the
    row after its last draft gives the bonus token);
    the simulator gives `accepted` instead, how many drafts of each sequence its acceptance model
    accepts (`metroline.core.step.speculation` verifies either).
    """

    __slots__ = ("time", "logits", "draft_tokens", "draft_logits", "accepted")

    def __init__(
        self, time: float, logits: Any = None, *, draft_tokens: dict[Sequence, list[int]] | None = None,
        draft_logits: Any = None, accepted: dict[Sequence, int] | None = None,
    ) -> None:
        self.time = time
        self.logits = logits
        self.draft_tokens = draft_tokens
        self.draft_logits = draft_logits
        self.accepted = accepted
