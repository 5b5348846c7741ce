"""The scheduler: one `schedule()` per step turns the queues into a `StepPlan`.

It decides and never touches tensors; policy comes from the plugins' hooks, blocks from the
`BlockPool`. See DESIGN.md, "One step", for the order of the phases.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..kv_backends.block_pool import BlockPool
from ..kv_backends.swap_space import SwapSpace
from .budget import Split
from .config import EngineConfig
from .context import StepContext
from .errors import PluginError
from .plan import StepPlan
from .plugins import PluginManager
from .preemption import PROTECT_AFTER, RECOMPUTE, SWAP, Preempt, is_protected, older
from .sequence import FinishReason, SeqState, Sequence

_RUNNING, _WAITING, _SWAPPED, _FINISHED = (
    SeqState.RUNNING, SeqState.WAITING, SeqState.SWAPPED, SeqState.FINISHED,
)


class Scheduler:
    """Owns the queues (`running`, `waiting`, `swapped`) and the step's decisions."""

    def __init__(self, config: EngineConfig, plugins: PluginManager, pool: BlockPool) -> None:
        self.config = config
        self.plugins = plugins
        self.hook = plugins.hook
        self.pool = pool
        self.swap = SwapSpace(config.swap_space_blocks) if config.swap_space_blocks else None
        self.running: dict[Sequence, None] = {}
        self.waiting: dict[Sequence, None] = {}
        self.swapped: dict[Sequence, None] = {}
        self.ctx = StepContext(config, pool, self.running, self.waiting, self.swapped)
        self.ctx.hooks = plugins.hook
        self._arrived: list[Sequence] = []
        self._ended: list[Sequence] = []
        self._admissions = 0
        self._fork_slots = 0  # slots held for the children of running parents not forked yet
        self._budget = config.max_num_batched_tokens
        self._decode_left = 0
        self._prefill_left = 0
        self._prefills_left = 0
        self.num_decoding = 0
        self.total_preemptions = 0
        self._notified = 0  # how many of the step's preempted sequences `on_preempted` heard of
        # Blocks registered in the prefix index in this step, before their KV is written (the
        # executor writes a step's KV before any attention reads it): registrant -> its
        # `num_cached_blocks` before the step; the blocks; the requests admitted on a hit of them.
        self._registered: dict[Sequence, int] = {}
        self._pending: set[int] = set()
        self._hitters: list[Sequence] = []
        pool.pending = self._pending
        pool.partial_match = config.prefix_match == "token"
        self._admit_after_preemption = config.admit_after_preemption
        self._full_prompt_gate = config.admission_gate == "full_prompt"
        self._caching = config.enable_prefix_caching
        self._offered = False  # this step's plugins asked for something to be served
        self._rescuing = False  # the core serves the oldest request itself (see `_rescue`)
        self.rescues = 0
        self.last_offered = False
        self._pulls_left = 0
        self._candidate: Sequence | None = None  # the waiting request being admitted, and whether
        self._candidate_stale = False  # a victim of its admission took blocks of its hit away

    # --- requests in and out -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """A new sequence joins the waiting queue (policies hear of it at the next step)."""
        self.waiting[seq] = None
        self._arrived.append(seq)

    def finish(self, seq: Sequence, reason: FinishReason, now: float, error: str | None = None) -> None:
        """End `seq` in any state; its blocks are released by the next `reap()`."""
        if seq.state is _FINISHED:
            return
        seq.state = _FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        seq.error = error
        self._ended.append(seq)

    def reap(self) -> list[Sequence]:
        """Take ended sequences out of the queues and release their blocks: the one place where a
        request's blocks are freed. Returns them (and tells the `on_finished` observers)."""
        if not self._ended:
            return []
        ended, self._ended = self._ended, []
        for seq in ended:
            if self.running.pop(seq, 0) is None:
                self._fork_slots -= self._unforked(seq)
                self.pool.release(seq.block_table)
                if seq.finish_reason is FinishReason.FAILED and seq in self._registered:
                    self._unregister(seq)  # its step did not run: the blocks hold no KV
            elif self.swapped.pop(seq, 0) is None:
                self.swap.free(seq.host_table)
            else:
                self.waiting.pop(seq, None)
            seq.block_table = []
            seq.host_table = []
        self.hook.on_finished(ctx=self.ctx, seqs=ended)
        return ended

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self._ended)

    # --- the step ------------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """Split the budget, serve the running sequences, admit waiting ones: the plan.
        (The engine reaps ended sequences just before.)"""
        ctx = self.ctx
        ctx.now = now
        ctx.wakeup = None
        ctx.step += 1
        if self._arrived:
            arrived, self._arrived = self._arrived, []
            self.hook.on_arrival(ctx=ctx, seqs=arrived)
        plan = StepPlan(ctx.step, self.pool.block_size)
        self._notified = 0
        if self._pending:  # last step's registrations: their KV is written now
            self._registered.clear()
            self._pending.clear()
            self._hitters.clear()

        num_decoding = 0
        for queue in (self.running, self.swapped):
            for s in queue:
                n = len(s.token_ids)
                if s.num_computed_tokens == n - 1 and n > s.num_prompt_tokens:  # s.is_decoding
                    num_decoding += 1
        self.num_decoding = num_decoding
        max_chunk = self._split(num_decoding, len(self.running) - num_decoding + len(self.swapped))

        self._offered = bool(self.running)
        if self.running:
            self._serve_running(plan, max_chunk)
        if (self.waiting or self.swapped) and (self._admit_after_preemption or not plan.preempted):
            if plan.preempted:
                self._notify_preempted(plan)  # the victims are back in the queue, in their place
            self._admit(plan, max_chunk)
        if not plan.scheduled and self._offered and ctx.wakeup is None:
            self._rescue(plan)
        self.last_offered = self._offered

        if plan.admitted:
            self.hook.on_admitted(ctx=ctx, seqs=plan.admitted)
        if plan.preempted:
            self.total_preemptions += len(plan.preempted)
            if len(plan.preempted) > self._notified:
                self._notify_preempted(plan)
        return plan

    def _rescue(self, plan: StepPlan) -> None:
        """The one case where the core overrides the plugins: they wanted something served (a
        running request, or an admission candidate) but the step scheduled nothing, and none asked
        to be woken up later. The core serves the oldest unfinished request itself, with the whole
        budget, a prefill chunk of `max_prefill_chunk` and its own victims (the youngest running
        requests), as fcfs would."""
        oldest = None
        for queue in (self.running, self.waiting, self.swapped):
            for s in queue:
                if oldest is None or older(s, oldest):
                    oldest = s
        if oldest is None:
            return
        self.rescues += 1
        if self.config.debug:
            import structlog

            structlog.get_logger("metroline").info(
                "scheduler.rescue", request_id=oldest.seq_id, step=self.ctx.step,
                reason="the plugins scheduled nothing: the core serves the oldest request",
            )
        budget = self._budget
        self._decode_left = self._prefill_left = self._prefills_left = budget
        max_chunk = self.config.prefill_chunk
        self._rescuing = True
        try:
            if oldest.state is _RUNNING:
                decode = oldest.is_decoding
                n = 1 if decode else min(oldest.num_uncomputed_tokens, budget, max_chunk)
                if self._grow(oldest, n, plan):
                    self._schedule(oldest, n, plan, decode)
            else:
                admitted = (self._admit_waiting if oldest.state is _WAITING else self._admit_swapped)(
                    oldest, plan, max_chunk
                )
                if admitted:
                    self._mark_admitted(oldest, plan)
        finally:
            self._rescuing = False
        if len(plan.preempted) > self._notified:
            self._notify_preempted(plan)

    def _notify_preempted(self, plan: StepPlan) -> None:
        """Tell `on_preempted` of the step's victims it has not heard of yet."""
        new = plan.preempted[self._notified :]
        self._notified = len(plan.preempted)
        self.hook.on_preempted(ctx=self.ctx, seqs=new)

    def _split(self, num_decoding: int, num_other: int) -> int:
        budget = self._budget
        split = self.hook.split_budget(
            ctx=self.ctx, budget=budget, num_decoding=num_decoding,
            num_prefilling=num_other, num_waiting=len(self.waiting),
        )
        if not isinstance(split, tuple) or len(split) not in (3, 4):
            raise self.plugins.invalid("split_budget", f"expected Split(decode, prefill, max_chunk), got {split!r}")
        decode, prefill, max_chunk, max_prefills = Split(*split)
        if decode < 0 or prefill < 0 or decode + prefill > budget or max_chunk < 1 or (
            max_prefills is not None and max_prefills < 0
        ):
            raise self.plugins.invalid(
                "split_budget",
                f"{Split(*split)} is outside the budget of {budget} tokens "
                "(shares and max_prefills must be >= 0 and the shares sum to at most the budget, max_chunk >= 1)",
            )
        self._decode_left, self._prefill_left = decode, prefill
        self._prefills_left = budget if max_prefills is None else max_prefills
        return max_chunk

    def _serve_running(self, plan: StepPlan, max_chunk: int) -> None:
        running = list(self.running)
        order = self.hook.order_running(ctx=self.ctx, running=running)
        members = None if order is running else set(running)  # the list as given needs no check
        scheduled, grow, schedule = plan.scheduled, self._grow, self._schedule
        for seq in order:
            if members is not None and seq not in members:
                raise self.plugins.invalid("order_running", f"{seq!r} is not a running sequence")
            if seq.state is not _RUNNING or seq in scheduled:
                continue  # preempted as a victim earlier in this step, or listed twice
            known = len(seq.token_ids)
            computed = seq.num_computed_tokens
            if computed == known - 1 and known > seq.num_prompt_tokens:  # decoding
                if self._decode_left <= 0:
                    continue
                if grow(seq, 1, plan):
                    schedule(seq, 1, plan, True)
                continue
            n = min(known - computed, self._prefill_left, max_chunk)
            if n <= 0 or self._prefills_left <= 0:
                continue
            if grow(seq, n, plan):
                schedule(seq, n, plan, False)

    def _admit(self, plan: StepPlan, max_chunk: int) -> None:
        answer = self.hook.admission(ctx=self.ctx)
        if answer is None:
            return
        head_of_line = getattr(answer, "head_of_line", True)
        candidates: Iterator[Sequence] = iter(answer)
        # a candidate may come back once after a preemption in this step: twice the requests
        self._pulls_left = 2 * (len(self.waiting) + len(self.swapped) + len(self.running)) + 8
        try:
            self._admit_from(candidates, plan, max_chunk, head_of_line)
        finally:
            close = getattr(candidates, "close", None)
            if close is not None:
                close()

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

    def _admit_from(self, candidates: Iterator[Sequence], plan: StepPlan, max_chunk: int, hol: bool) -> None:
        """Admit candidates until one is blocked (head-of-line), slots or budget run out, or the
        candidates do."""
        while self._decode_left > 0 or self._prefill_left > 0:
            if len(plan.preempted) > self._notified:
                if not self._admit_after_preemption:
                    return
                self._notify_preempted(plan)
            seq = self._next_candidate(candidates)
            if seq is None:
                return
            state = seq.state
            if state is _WAITING:
                if seq not in self.waiting:
                    raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's waiting queue")
                self._offered = True
                if self._prefill_left <= 0 or self._prefills_left <= 0:
                    return
                admitted = self._admit_waiting(seq, plan, max_chunk)
            elif state is _SWAPPED:
                if seq not in self.swapped:
                    raise self.plugins.invalid("admission", f"{seq!r} is not in this engine's swapped queue")
                admitted = self._admit_swapped(seq, plan, max_chunk)
            else:
                continue  # stale entry: already running or finished
            self._offered = True
            if admitted is None:
                return
            if not admitted:
                if hol:
                    return
                continue
            self._mark_admitted(seq, plan)

    def _mark_admitted(self, seq: Sequence, plan: StepPlan) -> None:
        seq.state = _RUNNING
        self.running[seq] = None
        self._fork_slots += self._unforked(seq)
        self._admissions += 1
        seq.admitted_seq_no = self._admissions
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = self.ctx.now
        plan.admitted.append(seq)

    def _admit_waiting(self, seq: Sequence, plan: StepPlan, max_chunk: int) -> bool | None:
        """Prefix-match `seq`, then give it a slot and the blocks of its first chunk. True when
        admitted (and scheduled), False when its blocks do not fit, None when nothing more can be
        admitted this step."""
        pool = self.pool
        hit = pool.lookup(seq.token_ids, seq.cache_salt, len(seq.token_ids) - 1)
        hit_blocks, hit_tokens = hit
        if hit_tokens % pool.block_size and not self._partial_hit_fits(seq, hit_blocks):
            hit_blocks = hit_blocks[:-1]  # a prefix hit never makes a request harder to admit
            hit_tokens = len(hit_blocks) * pool.block_size
        if hit_blocks:
            pool.acquire(hit_blocks)
            seq.block_table = list(hit_blocks)
        seq.num_computed_tokens = hit_tokens
        # a readmitted sequence whose cached prefix covers all but its newest token is a decode;
        # it takes a prefill token when the decode share is spent
        decode = seq.is_decoding and self._decode_left > 0
        n = 1 if decode else min(seq.num_uncomputed_tokens, self._prefill_left, max_chunk)
        if n <= 0:
            self._unacquire(seq)
            return None
        self._candidate, self._candidate_stale = seq, False
        try:
            if not self._make_room_for(seq, 1 + self._unforked(seq), plan):
                admitted = None
            elif (self._full_prompt_gate and not self._whole_prompt_fits(seq, plan)) or not self._grow(seq, n, plan):
                admitted = False
            else:
                admitted = True
        finally:
            self._candidate = None
        if self._candidate_stale:
            # a victim of this very admission had registered blocks of the hit in this step, whose
            # KV will now not be written: match again without them
            self._unacquire(seq)
            return self._admit_waiting(seq, plan, max_chunk)
        if not admitted:
            self._unacquire(seq)
            return admitted
        seq.num_cached_blocks = hit_tokens // pool.block_size
        if seq.num_preemptions == 0:
            seq.num_cached_prompt_tokens = min(hit_tokens, seq.num_prompt_tokens)
        else:
            seq.recomputed_tokens += max(0, seq.num_lost_tokens - hit_tokens)
            seq.num_lost_tokens = 0
        del self.waiting[seq]
        if self._pending and not self._pending.isdisjoint(seq.block_table):
            self._hitters.append(seq)
        self._schedule(seq, n, plan, decode)
        return True

    def _admit_swapped(self, seq: Sequence, plan: StepPlan, max_chunk: int) -> bool | None:
        """Bring `seq` back from the host swap space and schedule its next tokens."""
        decode = seq.is_decoding and self._decode_left > 0
        n = 1 if decode else min(seq.num_uncomputed_tokens, self._prefill_left, max_chunk)
        if n <= 0:
            return False
        if not self._make_room_for(seq, 1 + self._unforked(seq), plan):
            return None
        while True:
            table = self.pool.swap_in(seq.host_table, self.swap, plan.block_ops)
            if table is not None:
                break
            victim = self._victim(seq, "blocks")
            if victim is None:
                return False
            self._preempt(victim[0], victim[1], plan)
        seq.block_table, seq.host_table = table, []
        del self.swapped[seq]
        if not self._grow(seq, n, plan):
            # its own blocks came back but the next token's did not: keep it running, unscheduled
            return True
        self._schedule(seq, n, plan, decode)
        return True

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

    @staticmethod
    def _unforked(seq: Sequence) -> int:
        """The slots the children of `seq` will take when it forks (parallel sampling, at its
        first token); 0 for a child or a parent that has forked."""
        return seq.sampling.n - 1 if seq.index == 0 and not seq.children else 0

    def _make_room_for(self, seq: Sequence, slots: int, plan: StepPlan) -> bool:
        """Free `slots` running slots for a candidate, preempting if the policy says so. The slots
        of the children that running parents will fork are taken already."""
        while len(self.running) + self._fork_slots + slots > self.config.max_num_seqs:
            victim = self._victim(seq, "slots")
            if victim is None:
                return False
            self._preempt(victim[0], victim[1], plan)
        return True

    def _whole_prompt_fits(self, seq: Sequence, plan: StepPlan) -> bool:
        """The full-prompt admission gate: the blocks of all of `seq`'s known tokens, beyond those
        it holds (its prefix hit), fit in the free blocks, preempting victims if the policy says
        so (fcfs never does for a waiting request: then it is blocked)."""
        pool = self.pool
        need = -(-len(seq.token_ids) // pool.block_size) - len(seq.block_table)
        while need > pool.num_free_blocks():
            victim = self._victim(seq, "blocks")
            if victim is None:
                return False
            self._preempt(victim[0], victim[1], plan)
        return True

    def _grow(self, seq: Sequence, n: int, plan: StepPlan) -> bool:
        """Give `seq` the blocks for `n` more tokens, preempting victims while blocks are missing.
        False when `seq` could not be served (it was preempted itself, or it is a candidate that
        the policy would not make room for)."""
        pool = self.pool
        while not pool.allocate_slots(seq.block_table, seq.num_computed_tokens, n, plan.block_ops):
            victim = self._victim(seq, "blocks")
            if victim is None:
                return False
            self._preempt(victim[0], victim[1], plan)
            if victim[0] is seq:
                return False
        return True

    def _victim(self, requester: Sequence, reason: str) -> tuple[Sequence, str] | None:
        """Ask `select_victim`; None means the (waiting) requester stays where it is. A protected
        victim (`is_protected`) of a younger requester, or a protected requester named as its own
        victim, is replaced by `_substitute`'s (the no-livelock rule, see `select_victim`)."""
        mode = self.config.preemption_mode
        if self._rescuing:
            answer: Any = self._substitute(requester)
            return None if answer is None else (answer, mode)
        answer = self.hook.select_victim(ctx=self.ctx, requester=requester, reason=reason)
        if isinstance(answer, Preempt):
            answer, mode = answer
            if mode not in (RECOMPUTE, SWAP):
                raise self.plugins.invalid("select_victim", f"unknown preemption mode {mode!r}")
        if answer is None:
            if requester.state is not _RUNNING:
                return None
            answer = requester
        elif not isinstance(answer, Sequence) or answer not in self.running:
            raise self.plugins.invalid("select_victim", f"the victim {answer!r} is not a running sequence")
        if answer.stalls >= PROTECT_AFTER and (answer is requester or older(answer, requester)) and is_protected(answer):
            answer = self._substitute(requester, younger_only=answer is requester)
            if answer is None:
                return None
        return answer, mode

    def _substitute(self, requester: Sequence, younger_only: bool = False) -> Sequence | None:
        """The core's victim for `requester`: the youngest running request other than it that it
        may displace (an unprotected one, else a younger protected one; only younger ones with
        `younger_only`); else the requester yields (itself if running, None if waiting)."""
        best, best_rank = None, None
        for s in self.running:
            if s is requester:
                continue
            if (younger_only or (s.stalls >= PROTECT_AFTER and is_protected(s))) and older(s, requester):
                continue
            if s.stalls >= PROTECT_AFTER and is_protected(s):
                rank = (0, s.arrival_no, s.index)
            else:
                rank = (1, s.arrival_no, s.index)
            if best_rank is None or rank > best_rank:
                best, best_rank = s, rank
        if best is not None:
            return best
        return requester if requester.state is _RUNNING else None

    def _schedule(self, seq: Sequence, n: int, plan: StepPlan, decode: bool) -> None:
        plan.scheduled[seq] = n
        start = seq.num_computed_tokens
        plan.num_context_tokens += start + n
        if decode:
            plan.decodes.add(seq)
            plan.num_decode_tokens += 1
            self._decode_left -= 1
        else:
            plan.num_prefill_tokens += n
            self._prefill_left -= n
            self._prefills_left -= 1
        if self._caching:
            full = (start + n) // plan.block_size
            cached = seq.num_cached_blocks
            if full > cached:
                # indexed now, so that a request admitted later in this step shares them
                self._registered[seq] = cached
                table = seq.block_table
                self._pending.update(table[cached:full])
                self.pool.cache_full_blocks(table, seq.token_ids, cached, full, seq.cache_salt)
                seq.num_cached_blocks = full

    def _unregister(self, seq: Sequence) -> list[Sequence]:
        """Take the blocks that `seq` (whose blocks were just released) registered in this step out
        of the prefix index: their KV will not be written. Returns the running requests admitted
        in this step on a hit of them."""
        first = self._registered.pop(seq)
        stale = self.pool.uncache(seq.block_table[first : seq.num_cached_blocks])
        seq.num_cached_blocks = first
        if not stale:
            return []
        candidate = self._candidate
        if candidate is not None and not stale.isdisjoint(candidate.block_table):
            self._candidate_stale = True
        return [h for h in self._hitters if h.state is _RUNNING and not stale.isdisjoint(h.block_table)]

    def _preempt(self, seq: Sequence, mode: str, plan: StepPlan) -> None:
        """Take `seq` off the running set: back to waiting (recompute) or to the host (swap)."""
        if seq in plan.scheduled:
            n = plan.scheduled.pop(seq)
            plan.num_context_tokens -= seq.num_computed_tokens + n
            if seq in plan.decodes:
                plan.decodes.discard(seq)
                plan.num_decode_tokens -= 1
                self._decode_left += 1
            else:
                plan.num_prefill_tokens -= n
                self._prefill_left += n
                self._prefills_left += 1
            if seq in plan.admitted:
                plan.admitted.remove(seq)
        del self.running[seq]
        self._fork_slots -= self._unforked(seq)
        seq.num_preemptions += 1
        mark = seq.num_computed_tokens
        if mark < seq.max_computed:
            mark = seq.max_computed
        seq.stalls = seq.stalls + 1 if mark <= seq.stall_mark else 1
        seq.stall_mark = seq.max_computed = mark
        host = None
        if mode == SWAP and self.swap is not None:
            host = self.pool.swap_out(seq.block_table, self.swap, plan.block_ops)
        if host is None:
            self.pool.release(seq.block_table)
        hitters = self._unregister(seq) if seq in self._registered else ()
        if host is not None:
            seq.host_table = host
            seq.state = _SWAPPED
            self.swapped[seq] = None
        else:
            seq.num_lost_tokens = max(seq.num_lost_tokens, seq.num_computed_tokens)
            seq.num_computed_tokens = 0
            seq.num_cached_blocks = 0
            seq.state = _WAITING
            self.waiting[seq] = None
        seq.block_table = []
        plan.preempted.append(seq)
        for h in hitters:  # admitted on a hit of blocks that will not be computed: back to waiting
            if h.state is _RUNNING:
                self._preempt(h, RECOMPUTE, plan)

    # --- after the executor ran ----------------------------------------------------------------

    def commit(self, plan: StepPlan) -> None:
        """Advance each scheduled sequence past the tokens the step computed. (The blocks that
        became full were indexed when they were scheduled.)"""
        plan.sample_seqs  # fixed before the sequences advance
        for seq, n in plan.scheduled.items():
            seq.num_computed_tokens += n

    @staticmethod
    def progresses(plan: StepPlan) -> bool:
        """Whether `plan` (not yet committed) makes progress: it samples a token, or computes a
        token past the most a sequence ever had computed before a preemption (`max_computed`,
        kept at preemptions). Recomputing what a preemption lost is not progress."""
        if plan.sample_seqs:
            return True
        for seq, n in plan.scheduled.items():
            if seq.num_computed_tokens + n > seq.max_computed:
                return True
        return False

    def fork(self, parent: Sequence, n: int) -> list[Sequence]:
        """Create the `n - 1` siblings of `parent` (parallel sampling) once its prompt is
        computed: they share every block, the last partial one included (copy-on-write)."""
        self._fork_slots -= self._unforked(parent)
        children = []
        for i in range(1, n):
            child = Sequence(
                parent.request_id, parent.token_ids[: parent.num_prompt_tokens], parent.sampling,
                parent.arrival_time, tenant=parent.tenant, priority=parent.priority,
                deadline=parent.deadline, expected_output_tokens=parent.expected_output_tokens,
                cache_salt=parent.cache_salt, arrival_no=parent.arrival_no,
                seq_id=f"{parent.request_id}#{i}", index=i,
            )
            child.block_table = self.pool.fork(parent.block_table)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_blocks = parent.num_cached_blocks
            child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
            child.first_scheduled_time = parent.first_scheduled_time
            child.prefill_done_time = parent.prefill_done_time
            child.parent = parent
            child.state = _RUNNING
            self._admissions += 1
            child.admitted_seq_no = self._admissions
            self.running[child] = None
            children.append(child)
        parent.children = children
        return children
