"""The admission phase of the scheduler: pull the `admission` hook's candidates and admit them.

`Admission` is a part of `Scheduler` (a mixin: it uses the scheduler's queues, pool, swap space,
hook relay and victim loop). Each candidate's attempt ends in an `Outcome`.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING

from ..errors import PluginError
from ..plugins.candidates import close_candidates
from ..requests.sequence import RUNNING, SWAPPED, WAITING, Sequence
from .forking import unforked

if TYPE_CHECKING:
    from .plan import StepPlan


class Outcome(Enum):
    """How the admission of one candidate (waiting or swapped) ended."""

    ADMITTED = "admitted"
    """It runs now (with its first tokens scheduled, unless a swapped one got its own blocks back
    but not the next token's)."""
    BLOCKED = "blocked"
    """It does not fit (its blocks, or no tokens for it): under head-of-line admission stops,
    otherwise the next candidate is tried."""
    STOP = "stop"
    """Nothing more can be admitted in this step (no slot the policy would free, or no prefill
    budget)."""


ADMITTED, BLOCKED, STOP = Outcome.ADMITTED, Outcome.BLOCKED, Outcome.STOP


class Admission:
    """Admitting waiting and swapped candidates into `running`."""

    def _admit(self, plan: StepPlan, max_chunk: int) -> None:
        """Ask `admission` for candidates and admit them until one is blocked (head-of-line),
        admission stops, or the candidates or the budget run out."""
        answer = self.plugins.hook.admission(ctx=self.ctx)
        if answer is None:
            return
        head_of_line = getattr(answer, "head_of_line", True)
        candidates: Iterator[Sequence] = iter(answer)
        # a candidate may come back once after a preemption in this step: twice the requests
        self._pulls_left = 2 * (len(self.waiting) + len(self.swapped) + len(self.running)) + 8
        try:
            reserves = self._reserves
            if reserves is not None and reserves.prefill_outstanding() and not self._admit_reserved_first(
                candidates, plan, max_chunk, head_of_line
            ):
                return
            while plan.decode_left > 0 or plan.prefill_left > 0:
                if len(plan.preempted) > self._notified and not self._victims_back(plan):
                    return
                seq = self._next_candidate(candidates)
                if seq is None:
                    return
                outcome = self._admit_candidate(seq, plan, max_chunk)
                if outcome is STOP or (outcome is BLOCKED and head_of_line):
                    return
        finally:
            close_candidates(candidates)  # the policy's generator gets its cleanup

    def _victims_back(self, plan: StepPlan) -> bool:
        """After a preemption in this step: False when admission must end there (the preset's
        `admit_after_preemption` is off); otherwise the victims are told (`on_preempted`), so
        they are back in their policy's queue, in their place, before the next candidate."""
        if not self._admit_after_preemption:
            return False
        self._notify_preempted(plan)
        return True

    def _next_candidate(self, candidates: Iterator[Sequence]) -> Sequence | None:
        self._pulls_left -= 1
        if self._pulls_left < 0:
            raise self.plugins.invalid(
                "admission", "admission yielded more candidates than are queued (an endless generator?)"
            )
        try:
            return next(candidates, None)
        except PluginError:
            raise
        except Exception as exc:
            raise self.plugins.invalid("admission", f"its candidates raised {type(exc).__name__}: {exc}") from exc

    def _admit_candidate(self, seq: Sequence, plan: StepPlan, max_chunk: int) -> Outcome | None:
        """Try to admit one candidate of `admission`; None for a stale one (running or finished)."""
        state = seq.state
        if state is WAITING:
            if seq not in self.waiting:
                raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's waiting queue")
            self._offered = True
            if plan.prefill_left <= 0 or plan.prefills_left <= 0:
                return STOP
            return self._admit_waiting(seq, plan, max_chunk)
        if state is SWAPPED:
            if seq not in self.swapped:
                raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's swapped queue")
            self._offered = True
            return self._admit_swapped(seq, plan, max_chunk)
        return None

    def _admit_waiting(self, seq: Sequence, plan: StepPlan, max_chunk: int) -> Outcome:
        """Prefix-match `seq`, then give it a slot and the blocks of its first chunk. The hit is
        held only once the admission fits: an admission that does not admit leaves the prefix
        cache's LRU order exactly as it was (a waiting request's hit ages like any cached block)."""
        pool = self.pool
        hit_blocks, hit_tokens = pool.lookup(seq.token_ids, seq.cache_salt, len(seq.token_ids) - 1)
        if hit_tokens % pool.block_size and not self._partial_hit_fits(seq, hit_blocks):
            hit_blocks = hit_blocks[:-1]  # a prefix hit never makes a request harder to admit
            hit_tokens = len(hit_blocks) * pool.block_size
        seq.num_computed_tokens = hit_tokens
        # a readmitted sequence whose cached prefix covers all but its newest token is a decode;
        # it takes a prefill token when the decode share is spent
        decode = seq.is_decoding and plan.decode_left > 0
        n = 1 if decode else min(seq.num_uncomputed_tokens, plan.prefill_left, max_chunk)
        if n <= 0:
            seq.num_computed_tokens = 0
            return STOP
        victims = len(plan.preempted)
        if not self._make_room_for(seq, 1 + unforked(seq), plan):
            outcome = STOP
        elif not self._room_for_admission(seq, hit_blocks, hit_tokens, n, plan):
            outcome = BLOCKED
        else:
            outcome = ADMITTED
        if len(plan.preempted) > victims and not pool.all_indexed(hit_blocks):
            # a victim had registered blocks of the hit in this step, whose KV will now not be
            # written: match again without them
            seq.num_computed_tokens = 0
            return self._admit_waiting(seq, plan, max_chunk)
        if outcome is not ADMITTED:
            seq.num_computed_tokens = 0
            return outcome
        if hit_blocks:
            pool.acquire(hit_blocks)
            seq.block_table = list(hit_blocks)
        prefix = self.prefix
        prefix.candidate, prefix.candidate_stale = seq, False
        try:
            grown = self._grow(seq, n, plan)  # fits without a victim (`_room_for_admission`)
        finally:
            prefix.candidate = None
        if prefix.candidate_stale:
            self._unacquire(seq)
            return self._admit_waiting(seq, plan, max_chunk)
        if not grown:
            self._unacquire(seq)
            return BLOCKED
        seq.num_cached_blocks = hit_tokens // pool.block_size
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = min(hit_tokens, seq.num_prompt_tokens)
        else:
            seq.recomputed_tokens += max(0, seq.num_lost_tokens - hit_tokens)
            seq.num_lost_tokens = 0
        del self.waiting[seq]
        prefix.note_admitted(seq)
        self._schedule(seq, n, plan, decode)
        self._mark_admitted(seq, plan)
        return ADMITTED

    def _admit_swapped(self, seq: Sequence, plan: StepPlan, max_chunk: int) -> Outcome:
        """Bring `seq` back from the host swap space and schedule its next tokens."""
        decode = seq.is_decoding and plan.decode_left > 0
        n = 1 if decode else min(seq.num_uncomputed_tokens, plan.prefill_left, max_chunk)
        if n <= 0:
            return BLOCKED
        if not self._make_room_for(seq, 1 + unforked(seq), plan):
            return STOP
        swapped_in: list[list[int] | None] = [None]

        def swap_in() -> bool:
            swapped_in[0] = self.pool.swap_in(seq.host_table, self.swap, plan.block_ops)
            return swapped_in[0] is not None

        if not self.preempt_for(seq, "blocks", plan, swap_in, len(seq.host_table)):
            return BLOCKED
        seq.block_table, seq.host_table = swapped_in[0], []
        del self.swapped[seq]
        # when its own blocks came back but the next token's did not, it runs, unscheduled
        if self._grow(seq, n, plan):
            self._schedule(seq, n, plan, decode)
        self._mark_admitted(seq, plan)
        return ADMITTED

    def _mark_admitted(self, seq: Sequence, plan: StepPlan) -> None:
        seq.state = RUNNING
        self.running[seq] = None
        self._fork_slots += unforked(seq)
        self._admissions += 1
        seq.admitted_seq_no = self._admissions
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = self.ctx.now
        plan.admitted.append(seq)

    def _room_for_admission(self, seq: Sequence, hit_blocks: list[int], hit_tokens: int, n: int,
                            plan: StepPlan) -> bool:
        """Whether the blocks that admitting `seq` with `n` tokens takes (its first chunk's, a copy
        of a partly matched last block, the unreferenced blocks of its hit, and under the
        full-prompt gate those of all its known tokens) fit in the free blocks, preempting victims
        if the policy says so (fcfs never does for a waiting request: then it is blocked). Nothing
        is held: the hit's blocks keep their place in the LRU."""
        pool = self.pool
        bs = pool.block_size
        have = len(hit_blocks)
        need = -(-(hit_tokens + n) // bs) - have + (1 if hit_tokens % bs else 0)
        if self._full_prompt_gate:
            need = max(need, -(-len(seq.token_ids) // bs) - have)
        return self.preempt_for(
            seq, "blocks", plan, lambda: need + pool.num_unreferenced(hit_blocks) <= pool.num_free_blocks(), need
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
