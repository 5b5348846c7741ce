"""`StepPlan`: what one step asks the executor to do, and `StepResult`: what it gave back."""

from __future__ import annotations

from typing import Any

from ..kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT
from .sequence import Sequence


class StepPlan:
    """The decisions of one scheduler step, for the executor.

    - `scheduled`: sequence -> number of tokens to compute this step, in batch order. A sequence's
      tokens are `seq.token_ids[start:start + n]` at positions `start...start + n - 1`, with
      `start = seq.num_computed_tokens` (the scheduler advances it only after the step ran).
    - `decodes`: the scheduled sequences whose one token is charged to the decode share.
    - `block_ops`: `(kind, src, dst)` copies and swaps to run, in order, before the forward pass
      (kinds in `metroline.kv_backends.block_ops`).
    - `sample_seqs`: the scheduled sequences that reach the end of their known tokens this step
      (a decode, or the last chunk of a prefill): the executor returns one row of logits for each,
      in this order.
    - token counts for cost models and metrics: `num_prefill_tokens`, `num_decode_tokens`, and
      `num_context_tokens` (KV tokens the attention reads: the sum of `start + n`).
    """

    __slots__ = (
        "step", "scheduled", "decodes", "block_ops", "num_prefill_tokens", "num_decode_tokens",
        "num_context_tokens", "preempted", "admitted", "block_size", "_sample_seqs",
    )

    def __init__(self, step: int, block_size: int) -> None:
        self.step = step
        self.block_size = block_size
        self.scheduled: dict[Sequence, int] = {}
        self.decodes: set[Sequence] = set()
        self.block_ops: list[tuple[int, int, int]] = []
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.num_context_tokens = 0
        self.preempted: list[Sequence] = []
        self.admitted: list[Sequence] = []
        self._sample_seqs: list[Sequence] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.block_ops

    @property
    def sample_seqs(self) -> list[Sequence]:
        if self._sample_seqs is None:
            self._sample_seqs = [
                s for s, n in self.scheduled.items() if s.num_computed_tokens + n == len(s.token_ids)
            ]
        return self._sample_seqs

    def copies(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == COPY]

    def swap_outs(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == SWAP_OUT]

    def swap_ins(self) -> list[tuple[int, int]]:
        return [(s, d) for k, s, d in self.block_ops if k == SWAP_IN]

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
    """

    __slots__ = ("time", "logits")

    def __init__(self, time: float, logits: Any = None) -> None:
        self.time = time
        self.logits = logits
