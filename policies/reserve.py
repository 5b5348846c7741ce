"""`reserve`: admission that keeps KV blocks in reserve, so that requests are not admitted only to
be preempted a few steps later when the running ones grow.

A `wrapper=True` `admission` hookimpl: it filters, lazily and in order, the candidates that the
ordering policy below it answers, so it stacks on any policy (`--policy srpt --plugin reserve`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from metroline.api import (
    Candidates,
    PluginOptions,
    PromptsInFlight,
    QUEUED,
    SWAPPED,
    Sequence,
    StepContext,
    hookimpl,
    take_options,
)


class ReserveBlocks:
    """`reserve`: admit a candidate only if the KV pool keeps a reserve after it.

    Decides which of the base policy's admission candidates may be admitted (order unchanged).
    When the scheduler pulls a candidate, it passes only if, after the blocks of its whole
    remaining prompt (a waiting sequence's uncomputed tokens, minus what the prefix cache holds; a
    swapped sequence's host blocks), the free blocks (`ctx.num_free_blocks()` at that moment, the
    scheduler admitting lazily) stay at or above

    - a watermark of `watermark * num_blocks` blocks (vLLM's `watermark`), plus
    - the prompt blocks still to come of the prompts in flight: running partial prefills (a
      chunked prompt takes its blocks chunk by chunk) and the candidates admitted earlier in the
      same step, plus
    - with `new_token_ratio` set (SGLang style), the blocks of `new_token_ratio x` the output
      tokens still to come (`max_new_tokens - output so far`) of every running sequence and of the
      candidate.

    A refused candidate is treated like one that does not fit in the free blocks: under a
    head-of-line answer it stops admission for the step (nothing overtakes it); under a skipping
    answer (`Candidates(..., head_of_line=False)`) it is skipped. The inner answer's head-of-line
    flag is kept. When nothing runs and nothing was admitted yet in the step, the first candidate
    passes whatever the reserve: there is no running request to protect, and refusing it could
    stall the engine forever (its blocks are still checked by the scheduler).

    Options: see `ReserveBlocks.Options` (`watermark`, `new_token_ratio`).

    No budget split, no victim rule: preemption still happens (a reserve based on a ratio is an
    estimate), just less often.
    """

    name = "reserve"

    class Options(PluginOptions):
        """`[plugin_options.reserve]`."""

        watermark: float = Field(
            default=0.01, ge=0, lt=1, allow_inf_nan=False, description="the share of the pool kept free"
        )
        new_token_ratio: float | None = Field(
            default=None, gt=0, le=1, allow_inf_nan=False,
            description="the share of the remaining output tokens reserved (e.g. 0.4); None reserves no "
            "output tokens",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.watermark = self.options.watermark
        self.new_token_ratio = self.options.new_token_ratio
        # Sum over running sequences of their remaining output tokens (max_new_tokens - output):
        # +remaining at admission, -1 per token, -remaining when they stop running.
        self._running: set[Sequence] = set()
        self._remaining_outputs = 0
        self._in_flight = PromptsInFlight()
        self.refused = 0
        """How many times a candidate was refused (a counter for tests and reports)."""

    # --- the running sequences' remaining outputs, kept incrementally --------------------------

    @staticmethod
    def _remaining(seq: Sequence) -> int:
        return max(0, seq.sampling.max_new_tokens - (len(seq.token_ids) - seq.num_prompt_tokens))

    @classmethod
    def _expected(cls, seq: Sequence) -> int:
        """Output tokens still to come of `seq` and, before they are forked, its `n - 1` siblings."""
        n = seq.sampling.n
        return cls._remaining(seq) * (n if n > 1 and not seq.children and seq.index == 0 else 1)

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        self._in_flight.admitted(seqs)
        if self.new_token_ratio is None:
            return
        running = self._running
        for s in seqs:
            if s not in running:
                running.add(s)
                self._remaining_outputs += self._remaining(s)

    @hookimpl
    def on_tokens(self, seqs: list[Sequence]) -> None:
        if self.new_token_ratio is not None:
            self._remaining_outputs -= len(seqs)  # every sequence that got a token is running

    def _stop(self, seqs: list[Sequence]) -> None:
        running = self._running
        for s in seqs:
            if s in running:
                running.discard(s)
                self._remaining_outputs -= self._remaining(s)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        if self.new_token_ratio is not None:
            self._stop(seqs)

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        if self.new_token_ratio is not None:
            self._stop(seqs)

    # --- admission -----------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def admission(self, ctx: StepContext) -> Any:
        answer = yield
        if answer is None:
            return None
        step = _StepReserve(self, ctx)
        return Candidates.of(answer).gate(step.admit, admitted=step.admitted)

    def _in_flight_prompt_blocks(self, ctx: StepContext) -> int:
        """Blocks the running partial prefills still need for the rest of their prompts."""
        return self._in_flight.blocks_to_come(ctx)


class _StepReserve:
    """One step's reserve: what the candidates admitted so far in the step still need."""

    __slots__ = ("plugin", "ctx", "watermark", "caching", "reserved_tokens", "pending_blocks", "unprotected", "needs")

    def __init__(self, plugin: ReserveBlocks, ctx: StepContext) -> None:
        self.plugin, self.ctx = plugin, ctx
        self.watermark = int(plugin.watermark * ctx.num_blocks)
        self.caching = ctx.config.enable_prefix_caching
        ratio = plugin.new_token_ratio
        self.reserved_tokens = plugin._remaining_outputs * ratio if ratio is not None else 0.0
        self.pending_blocks = plugin._in_flight_prompt_blocks(ctx)
        self.unprotected = not ctx.running  # nothing runs: the first candidate passes
        self.needs: dict[Sequence, int] = {}

    def admit(self, seq: Sequence) -> bool:
        if seq.state not in QUEUED:
            return True  # stale (already running or finished): the scheduler skips it
        ctx, plugin, block_size = self.ctx, self.plugin, self.ctx.block_size
        if seq.state is SWAPPED:
            need = total_need = len(seq.host_table) + 1
        else:
            cached = ctx.cached_prefix_tokens(seq) if self.caching else 0
            total_need = ctx.blocks_needed(len(seq.token_ids))
            need = total_need - cached // block_size
        if not self.unprotected:
            reserve = self.watermark + self.pending_blocks
            ratio = plugin.new_token_ratio
            if ratio is not None:
                reserve += math.ceil((self.reserved_tokens + ratio * plugin._expected(seq)) / block_size)
            if ctx.num_free_blocks() - need < reserve:
                plugin.refused += 1
                return False
        self.needs[seq] = total_need
        return True

    def admitted(self, seq: Sequence) -> None:
        """The scheduler admitted `seq`: its first chunk's blocks are now taken from the free
        count; the rest of its prompt and its outputs stay reserved."""
        self.pending_blocks += max(0, self.needs[seq] - len(seq.block_table))
        ratio = self.plugin.new_token_ratio
        if ratio is not None:
            self.reserved_tokens += ratio * self.plugin._expected(seq)
        self.unprotected = False
