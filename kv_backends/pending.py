"""The step's pending slots: KV that the current step's forward pass is yet to write.

A step's block operations (copies, swaps) run before its forward pass, and the scheduler indexes
the blocks a step fills as soon as it schedules them, so that a request admitted later in the same
step shares them (`metroline.core.step.step_prefix`). Between scheduling and the forward, such a
block holds KV only up to where the registrant had computed before the step; its later slots are
pending: the forward writes them.

The rule the pool keeps: **no block operation reads a pending slot on behalf of a sequence that
counts that slot as computed.** Such a read would copy whatever the slot held before the forward
(another request's KV, or nothing), and the reader would attend to it later.

- `swap_out` refuses (returns None, nothing changed) a table whose computed positions reach a
  pending slot: a request admitted in this step on a hit of blocks registered in this step holds
  KV that exists only after the forward. The caller preempts it by recompute instead (the
  victim loop does). The registrant itself may be swapped out: its computed positions end where
  its pending slots begin (its own tokens of the step are dropped with it).
- A copy-on-write never reads one: `lookup` shares a pending block whole, never in part (a
  partly matched block is the one copied), and a hit is never written by its holder.
  `allocate_slots` asserts it.

`pending` maps block -> the first offset in it the forward writes (the step's registrations set
it, `mark_pending`; `clear_pending` when the step's KV is written; a block leaves it when it is
taken out of the index or handed out again).
"""

from __future__ import annotations

from .pool_state import PoolState


class PendingSlots(PoolState):
    """The pending part of `BlockPool` (a mixin over the pool's state, `PoolState`)."""

    __slots__ = ()

    def mark_pending(self, block_table: list[int], start_block: int, end_block: int, num_computed: int) -> None:
        """`block_table[start_block:end_block]` are filled by this step's forward from position
        `num_computed` on (the registrant's computed tokens before the step)."""
        bs, pending = self.block_size, self.pending
        for i in range(start_block, end_block):
            first = num_computed - i * bs
            pending[block_table[i]] = first if first > 0 else 0

    def clear_pending(self) -> None:
        """The step's forward ran: its KV is written, nothing is pending."""
        self.pending.clear()

    def reads_pending(self, block_table: list[int], num_computed: int | None = None) -> bool:
        """Whether reading the table's first `num_computed` positions (None: all its slots) would
        read a slot this step's forward is yet to write."""
        pending = self.pending
        if not pending:
            return False
        bs = self.block_size
        end = len(block_table) * bs if num_computed is None else num_computed
        for i, b in enumerate(block_table):
            first = pending.get(b)
            if first is not None and first < bs and end > i * bs + first:
                return True
        return False
