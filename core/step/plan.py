"""`StepPlan`: what one step asks the executor to do, and `StepResult`: what it gave back."""

from __future__ import annotations

from typing import Any

from ...kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT
from ..requests.sequence import Sequence


class StepPlan:
    """The decisions of one scheduler step, for the executor.

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
      in this order. Fixed by `seal()` once the plan is complete, before the sequences advance.
    - token counts for cost models and metrics: `num_prefill_tokens`, `num_decode_tokens` (drafts
      included), `num_draft_tokens` (the drafts to verify), and
      `num_context_tokens` (KV tokens the attention reads: the sum of `start + n`). `add` and
      `drop` keep them; nothing else writes them.
    - `admitted`, `preempted`: the sequences admitted (in admission order) and preempted (in
      preemption order) while the plan was made.
    - `forked`: the samples of `n > 1` parents that sample their first token in this step (made
      when the plan was sealed); `fork_rows`: for each, its parent's index in `sample_seqs` (it
      samples from its parent's row of logits).
    - `decode_left`, `prefill_left`, `prefills_left`: what is left of the step's budget (decode
      tokens, prefill tokens, prefill chunks) while the scheduler fills the plan; `add` spends it,
      `drop` gives it back. Executors ignore them.
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

    def set_budget(self, decode: int, prefill: int, prefills: int) -> None:
        """What the step may still schedule: `decode` decode tokens, `prefill` prefill tokens in
        at most `prefills` chunks."""
        self.decode_left, self.prefill_left, self.prefills_left = decode, prefill, prefills

    def add(self, seq: Sequence, n: int, decode: bool, drafts: int = 0) -> None:
        """Schedule `n` tokens of `seq` from `seq.num_computed_tokens` on (`decode`: they are
        charged to the decode share; `drafts`: the last `drafts` of them are draft tokens)."""
        self.scheduled[seq] = n
        self.num_context_tokens += seq.num_computed_tokens + n
        if decode:
            self.decodes.add(seq)
            self.num_decode_tokens += n
            self.decode_left -= n
            if drafts:
                self.drafts[seq] = drafts
                self.num_draft_tokens += drafts
        else:
            self.num_prefill_tokens += n
            self.prefill_left -= n
            self.prefills_left -= 1

    def drop(self, seq: Sequence) -> None:
        """Take `seq` out of the plan (it was preempted while the plan was made): its tokens, and
        its admission if it was admitted in this step; its tokens go back to the budget. A
        sequence that was not scheduled stays in `admitted` (a swapped-in sequence that got no
        tokens is running all the same)."""
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
        """Fix `sample_seqs` from the scheduled sequences; called once the plan is complete and
        before the sequences advance past the step's tokens."""
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
