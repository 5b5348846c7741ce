"""The admission phase of the step: pull the `admission` hook's candidates and admit them.

`Admission` admits waiting and swapped candidates into the running queue, making room through the
`VictimLoop`; while a tenant's reserve of the budget is outstanding, admission goes through
`metroline.core.step.reserves.admit_reserved_first`. Each candidate's attempt ends in an `Outcome`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import PluginError
from ..plugins.candidates import close_candidates
from ..requests.sequence import SWAPPED, WAITING, Sequence
from .forking import unforked
from .outcome import ADMITTED, BLOCKED, STOP, Outcome
from .reserves import admit_reserved_first

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from ...kv_backends.swap_space import SwapSpace
    from ..config import EngineConfig
    from ..plugins.manager import PluginManager
    from .context import StepContext
    from .queues import Queues
    from .speculation import Speculation
    from .step_prefix import StepPrefix
    from .step_state import StepState
    from .victim_loop import VictimLoop


class Admission:
    """Admitting waiting and swapped candidates into `queues.running`: their prefix hits and
    blocks from `pool` (and `swap`, None without a swap space), this step's registrations in
    `prefix`, room made by `room`; the candidates come from `plugins`' `admission` (seen with
    `ctx`). `config` gives the preset's rules (`admit_after_preemption`, `admission_gate`);
    `speculation` (set by the scheduler under speculative decoding) pads an admission one token
    short of decoding under vLLM's rules (`Speculation.padding`)."""

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, ctx: StepContext, queues: Queues, pool: BlockPool,
        swap: SwapSpace | None, prefix: StepPrefix, room: VictimLoop,
    ) -> None:
        self.plugins = plugins
        self.ctx = ctx
        self.queues = queues
        self.pool = pool
        self.swap = swap
        self.prefix = prefix
        self.room = room
        self.admit_after_preemption = config.admit_after_preemption
        self.full_prompt_gate = config.admission_gate == "full_prompt"
        self.chunked_prefill = config.enable_chunked_prefill
        self.speculation: Speculation | None = None

    def admit(self, step: StepState) -> None:
        """Ask `admission` for candidates and admit them until one is blocked (head-of-line),
        admission stops, or the candidates or the budget run out."""
        answer = self.plugins.hook.admission(ctx=self.ctx)
        if answer is None:
            return
        head_of_line = getattr(answer, "head_of_line", True)
        candidates: Iterator[Sequence] = iter(answer)
        # a candidate may come back once after a preemption in this step: twice the requests
        queues = self.queues
        step.pulls_left = 2 * (len(queues.waiting) + len(queues.swapped) + len(queues.running)) + 8
        try:
            reserves = step.reserves
            if reserves is not None and reserves.prefill_outstanding() and not admit_reserved_first(
                self, candidates, step, head_of_line
            ):
                return
            while step.decode_left > 0 or step.prefill_left > 0:
                if step.unannounced() and not self.victims_back(step):
                    return
                seq = self.next_candidate(candidates, step)
                if seq is None:
                    return
                outcome = self.admit_candidate(seq, step)
                if outcome is STOP or (outcome is BLOCKED and head_of_line):
                    return
        finally:
            close_candidates(candidates)  # the policy's generator gets its cleanup

    def victims_back(self, step: StepState) -> bool:
        """After a preemption in this step: False when admission must end there (the preset's
        `admit_after_preemption` is off); otherwise the victims are told (`on_preempted`), so
        they are back in their policy's queue, in their place, before the next candidate."""
        if not self.admit_after_preemption:
            return False
        step.announce_preempted()
        return True

    def next_candidate(self, candidates: Iterator[Sequence], step: StepState) -> Sequence | None:
        """The next of `candidates` (None when they ran out); more than the step allows is a
        `PluginError` (an endless generator)."""
        step.pulls_left -= 1
        if step.pulls_left < 0:
            raise self.plugins.invalid(
                "admission", "admission yielded more candidates than are queued (an endless generator?)"
            )
        try:
            return next(candidates, None)
        except PluginError:
            raise
        except Exception as exc:
            raise self.plugins.invalid("admission", f"its candidates raised {type(exc).__name__}: {exc}") from exc

    def admit_candidate(self, seq: Sequence, step: StepState) -> Outcome | None:
        """Try to admit one candidate of `admission`; None for a stale one (running or finished)."""
        state = seq.state
        if state is WAITING:
            if seq not in self.queues.waiting:
                raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's waiting queue")
            step.offered = True
            if step.prefill_left <= 0 or step.prefills_left <= 0:
                return STOP
            return self.admit_waiting(seq, step, step.max_chunk)
        if state is SWAPPED:
            if seq not in self.queues.swapped:
                raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's swapped queue")
            step.offered = True
            return self.admit_swapped(seq, step, step.max_chunk)
        return None

    def admit_waiting(self, seq: Sequence, step: StepState, max_chunk: int) -> Outcome:
        """Prefix-match `seq`, then give it a slot and the blocks of its first chunk. The hit is
        held only once the admission fits: an admission that does not admit leaves the prefix
        cache's LRU order exactly as it was (a waiting request's hit ages like any cached block)."""
        pool = self.pool
        hit_blocks, hit_tokens = pool.lookup(seq.token_ids, seq.cache_salt, len(seq.token_ids) - 1)
        if hit_tokens % pool.block_size and not self._partial_hit_fits(seq, hit_blocks):
            hit_blocks = hit_blocks[:-1]  # a prefix hit never makes a request harder to admit
            hit_tokens = len(hit_blocks) * pool.block_size
        seq.num_computed_tokens = hit_tokens
        n, decode = self.first_tokens(seq, step, max_chunk)
        pad = 0 if self.speculation is None or seq.num_uncomputed_tokens != 1 else self.speculation.padding(seq, step)
        if n <= 0 or pad < 0:
            seq.num_computed_tokens = 0
            return STOP
        n += pad
        room, preempted = self.room, step.plan.preempted
        victims = len(preempted)
        if not room.make_room_for(seq, 1 + unforked(seq), step):
            outcome = STOP
        elif not self._room_for_admission(seq, hit_blocks, hit_tokens, n, step):
            outcome = BLOCKED
        else:
            outcome = ADMITTED
        if len(preempted) > victims and not pool.all_indexed(hit_blocks):
            # a victim had registered blocks of the hit in this step, whose KV will now not be
            # written: match again without them
            seq.num_computed_tokens = 0
            return self.admit_waiting(seq, step, max_chunk)
        if outcome is not ADMITTED:
            seq.num_computed_tokens = 0
            return outcome
        if hit_blocks:
            pool.acquire(hit_blocks)
            seq.block_table = list(hit_blocks)
        prefix = self.prefix
        prefix.candidate, prefix.candidate_stale = seq, False
        try:
            grown = room.grow(seq, n + (pad and self.speculation.lookahead), step)  # fits without a victim
        finally:
            prefix.candidate = None
        if prefix.candidate_stale:
            self._unacquire(seq)
            return self.admit_waiting(seq, step, max_chunk)
        if not grown:
            self._unacquire(seq)
            return BLOCKED
        seq.num_cached_blocks = hit_tokens // pool.block_size
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = min(hit_tokens, seq.num_prompt_tokens)
        else:
            seq.recomputed_tokens += max(0, seq.num_lost_tokens - hit_tokens)
            seq.num_lost_tokens = 0
        del self.queues.waiting[seq]
        prefix.note_admitted(seq)
        if pad:
            self.speculation.schedule_padded(seq, pad, step)
        else:
            step.schedule(seq, n, decode)
        self._mark_admitted(seq, step)
        return ADMITTED

    def admit_swapped(self, seq: Sequence, step: StepState, max_chunk: int) -> Outcome:
        """Bring `seq` back from the host swap space and schedule its next tokens."""
        n, decode = self.first_tokens(seq, step, max_chunk)
        if n <= 0:
            return BLOCKED
        room = self.room
        if not room.make_room_for(seq, 1 + unforked(seq), step):
            return STOP
        swapped_in: list[list[int] | None] = [None]
        ops = step.plan.block_ops

        def swap_in() -> bool:
            swapped_in[0] = self.pool.swap_in(seq.host_table, self.swap, ops)
            return swapped_in[0] is not None

        if not room.preempt_for(seq, "blocks", step, swap_in, len(seq.host_table)):
            return BLOCKED
        seq.block_table, seq.host_table = swapped_in[0], []
        del self.queues.swapped[seq]
        # when its own blocks came back but the next token's did not, it runs, unscheduled
        if room.grow(seq, n, step):
            step.schedule(seq, n, decode)
        self._mark_admitted(seq, step)
        return ADMITTED

    def first_tokens(self, seq: Sequence, step: StepState, max_chunk: int) -> tuple[int, bool]:
        """The tokens the waiting or swapped `seq` gets if admitted in this step, and whether they
        are a decode's. A readmitted sequence whose computed tokens reach all but its newest is a
        decode (one token) while the decode share lasts; otherwise it takes its uncomputed tokens
        within `max_chunk` and the prefill share left. Without chunked prefill
        (`EngineConfig.enable_chunked_prefill = false`, vLLM's option) they are never cut by the
        share left: 0 when they do not fit whole (admission stops there, as vLLM's does)."""
        if seq.is_decoding and step.decode_left > 0:
            return 1, True
        n = min(seq.num_uncomputed_tokens, max_chunk)
        if n > step.prefill_left:
            n = step.prefill_left if self.chunked_prefill else 0
        return n, False

    def _mark_admitted(self, seq: Sequence, step: StepState) -> None:
        self.queues.start_running(seq)
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = step.now
        step.plan.admitted.append(seq)

    def _room_for_admission(self, seq: Sequence, hit_blocks: list[int], hit_tokens: int, n: int,
                            step: StepState) -> bool:
        """Whether the blocks that admitting `seq` with `n` tokens takes (its first chunk's, a copy
        of a partly matched last block, the unreferenced blocks of its hit, and under the
        full-prompt gate those of all its known tokens) fit in the free blocks, preempting victims
        if the policy says so (fcfs never does for a waiting request: then it is blocked). Nothing
        is held: the hit's blocks keep their place in the LRU."""
        pool = self.pool
        bs = pool.block_size
        have = len(hit_blocks)
        need = -(-(hit_tokens + n) // bs) - have + (1 if hit_tokens % bs else 0)
        if self.full_prompt_gate:
            need = max(need, -(-len(seq.token_ids) // bs) - have)
        return self.room.preempt_for(
            seq, "blocks", step, lambda: need + pool.num_unreferenced(hit_blocks) <= pool.num_free_blocks(), need
        )

    def _partial_hit_fits(self, seq: Sequence, hit_blocks: list[int]) -> bool:
        """Whether sharing the partly matched last block of a hit (copied at its first write)
        still leaves room for all of `seq`'s known tokens: holding it takes a cached block off
        the free ones and the copy takes another, one block more than a cold start would need."""
        pool = self.pool
        taken = sum(1 for b in hit_blocks if pool.ref_count(b) == 0)
        need = -(-len(seq.token_ids) // pool.block_size) - len(hit_blocks) + 1
        return pool.num_free_blocks() - taken >= need

    def _unacquire(self, seq: Sequence) -> None:
        self.pool.release(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
