"""`StepPrefix`: the blocks a step registers in the prefix index before their KV is written.

The executor writes a step's KV before any attention reads it, so a block that becomes full in
this step is indexed as soon as it is scheduled, and a request admitted later in the same step
shares it. When the registrant is preempted (or its step fails) before the step runs, those blocks
will hold no KV: they leave the index again, and the requests admitted on a hit of them are
preempted too (the scheduler does that with what `unregister` returns).

The registered blocks are the pool's pending ones (`BlockPool.pending`, with the first slot the
forward writes in each), which no block operation of the step reads for a sequence that counts
them as computed: a request admitted on a hit of them and chosen as a victim in the same step
cannot be swapped out (`BlockPool.swap_out` refuses), it is preempted by recompute
(`metroline.kv_backends.pending`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..requests.sequence import RUNNING

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from ..requests.sequence import Sequence


class StepPrefix:
    """This step's registrations: registrant -> its `num_cached_blocks` before the step; the
    blocks registered (the pool's `pending`); the requests admitted on a hit of them; and the
    candidate being admitted, which `unregister` marks `candidate_stale` when it takes away
    blocks of the candidate's hit."""

    __slots__ = ("pool", "registered", "pending", "hitters", "candidate", "candidate_stale")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.registered: dict[Sequence, int] = {}
        self.pending = pool.pending
        self.hitters: list[Sequence] = []
        self.candidate: Sequence | None = None
        self.candidate_stale = False

    def new_step(self) -> None:
        """Last step's registrations have their KV written now: forget them."""
        if self.registered:
            self.registered.clear()
            self.hitters.clear()
        if self.pending:
            self.pool.clear_pending()

    def register(self, seq: Sequence, full: int) -> None:
        """Index `seq`'s blocks up to its `full`-th (which this step fills, from its computed
        tokens on: the pool's pending slots)."""
        cached = seq.num_cached_blocks
        self.registered[seq] = cached
        table = seq.block_table
        pool = self.pool
        pool.mark_pending(table, cached, full, seq.num_computed_tokens)
        pool.cache_full_blocks(table, seq.token_ids, cached, full, seq.cache_salt)
        seq.num_cached_blocks = full

    def note_admitted(self, seq: Sequence) -> None:
        """`seq` was admitted: remember it if its prefix hit holds blocks registered in this step."""
        if self.pending and not self.pending.keys().isdisjoint(seq.block_table):
            self.hitters.append(seq)

    def unregister(self, seq: Sequence) -> list[Sequence]:
        """Take the blocks that `seq` (whose blocks were just released) registered in this step out
        of the prefix index: their KV will not be written. Returns the running requests admitted
        in this step on a hit of them (none when `seq` registered nothing)."""
        if seq not in self.registered:
            return []
        first = self.registered.pop(seq)
        stale = self.pool.uncache(seq.block_table[first : seq.num_cached_blocks])
        seq.num_cached_blocks = first
        if not stale:
            return []
        candidate = self.candidate
        if candidate is not None and not stale.isdisjoint(candidate.block_table):
            self.candidate_stale = True
        return [h for h in self.hitters if h.state is RUNNING and not stale.isdisjoint(h.block_table)]
