"""The victim loop of the scheduler: ask the policy for a victim (`select_victim`), preempt it.

`VictimLoop` is a part of `Scheduler` (a mixin: it uses the scheduler's queues, pool, swap space,
config, hook relay and `StepPrefix`). Every place that lacks a slot or a block goes through one
loop, `preempt_for`; a victim is a `Preempt` (sequence and mode).

The bound on a step's victim requests for candidates (see `select_victim` in hookspecs): once the
policy declined to make room for a waiting or swapped candidate that needed `need` blocks, a later
candidate of the step is offered preemption only when it needs fewer blocks, and after
`REFUSALS_PER_STEP` refusals none is. (Candidates come most deserving first: a later one that needs
at least as much room would be declined too.) So under `head_of_line=False` the refusals of a
step do not grow with the queue; under head-of-line the first refusal ends admission anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..plugins.preemption import PROTECT_AFTER, RECOMPUTE, SWAP, Preempt, is_protected, older, substitute
from ..requests.sequence import RUNNING, SWAPPED, WAITING, Sequence
from .forking import unforked

if TYPE_CHECKING:
    from .plan import StepPlan

REFUSALS_PER_STEP = 4
"""How many times in one step the policy may decline (`select_victim` answers None) to make room
for a waiting or swapped candidate's blocks before no later candidate of the step is offered
preemption."""

NO_REFUSAL = 1 << 62


class VictimLoop:
    """Making room: slots and blocks for a requester, by preempting victims."""

    def preempt_for(
        self, requester: Sequence, reason: str, plan: StepPlan, done: Callable[[], bool], need: int = 0
    ) -> bool:
        """Until `done()`, ask for a victim for `requester` (`reason`: `"blocks"` or `"slots"`) and
        preempt it. False when there is no victim (a waiting requester stays where it is) or the
        requester was preempted itself. `need`: the blocks a candidate (waiting or swapped
        `requester`) lacks room for; it is not asked for when the step's refusals rule it out
        (see the module docstring)."""
        candidate = requester.state is not RUNNING and reason == "blocks" and not self._rescuing
        while not done():
            if candidate and (need >= self._refused_need or self._refusals >= REFUSALS_PER_STEP):
                return False
            victim = self._victim(requester, reason)
            if victim is None:
                if candidate:
                    self._refusals += 1
                    self._refused_need = min(self._refused_need, need)
                return False
            self._preempt(victim, plan)
            if victim.seq is requester:
                return False
        return True

    def _make_room_for(self, seq: Sequence, slots: int, plan: StepPlan) -> bool:
        """Free `slots` running slots for a candidate, preempting if the policy says so. The slots
        of the children that running parents will fork are taken already."""
        running, limit = self.running, self.config.max_num_seqs - slots
        return self.preempt_for(seq, "slots", plan, lambda: len(running) + self._fork_slots <= limit)

    def _grow(self, seq: Sequence, n: int, plan: StepPlan) -> bool:
        """Give `seq` the blocks for `n` more tokens, preempting victims while blocks are missing.
        False when `seq` could not be served (it was preempted itself, or it is a candidate that
        the policy would not make room for)."""
        allocate, ops = self.pool.allocate_slots, plan.block_ops
        if allocate(seq.block_table, seq.num_computed_tokens, n, ops):
            return True
        need = -(-(seq.num_computed_tokens + n) // self.pool.block_size) - len(seq.block_table)
        return self.preempt_for(
            seq, "blocks", plan, lambda: allocate(seq.block_table, seq.num_computed_tokens, n, ops), need
        )

    def _new_step_refusals(self) -> None:
        """Forget the refusals of the last step (called as a step starts)."""
        self._refusals = 0
        self._refused_need = NO_REFUSAL

    def _victim(self, requester: Sequence, reason: str) -> Preempt | None:
        """Ask `select_victim`; None means the (waiting) requester stays where it is. A protected
        victim (`is_protected`) of a younger requester, or a protected requester named as its own
        victim, is replaced by `substitute`'s (the no-livelock rule, see `select_victim`)."""
        mode = self.config.preemption_mode
        if self._rescuing:
            seq = substitute(self.running, requester)
            return None if seq is None else Preempt(seq, mode)
        answer = self.plugins.hook.select_victim(ctx=self.ctx, requester=requester, reason=reason)
        if isinstance(answer, Preempt):
            answer, mode = answer
            if mode not in (RECOMPUTE, SWAP):
                raise self.plugins.invalid("select_victim", f"unknown preemption mode {mode!r}")
        if answer is None:
            if requester.state is not RUNNING:
                return None
            answer = requester
        elif not isinstance(answer, Sequence) or answer not in self.running:
            raise self.plugins.invalid("select_victim", f"the victim {answer!r} is not a running sequence")
        if (answer.stalls >= PROTECT_AFTER and self.config.protect_stalled
                and (answer is requester or older(answer, requester)) and is_protected(answer)):
            answer = substitute(self.running, requester, younger_only=answer is requester)
            if answer is None:
                return None
        return Preempt(answer, mode)

    def _preempt(self, victim: Preempt, plan: StepPlan) -> None:
        """Take the victim off the running set: back to waiting (recompute) or to the host (swap).
        The requests admitted in this step on a hit of blocks it registered follow it (recompute)."""
        seq = victim.seq
        plan.drop(seq)
        del self.running[seq]
        self._fork_slots -= unforked(seq)
        seq.num_preemptions += 1
        mark = seq.num_computed_tokens
        if mark < seq.max_computed:
            mark = seq.max_computed
        seq.stalls = seq.stalls + 1 if mark <= seq.stall_mark else 1
        seq.stall_mark = seq.max_computed = mark
        host = None
        if victim.mode == SWAP and self.swap is not None:
            host = self.pool.swap_out(seq.block_table, self.swap, plan.block_ops)
        if host is None:
            self.pool.release(seq.block_table)
        hitters = self.prefix.unregister(seq)
        if host is not None:
            seq.host_table = host
            seq.state = SWAPPED
            self.swapped[seq] = None
        else:
            seq.num_lost_tokens = max(seq.num_lost_tokens, seq.num_computed_tokens)
            seq.num_computed_tokens = 0
            seq.num_cached_blocks = 0
            seq.state = WAITING
            self.waiting[seq] = None
        seq.block_table = []
        plan.preempted.append(seq)
        for h in hitters:  # admitted on a hit of blocks that will not be computed: back to waiting
            if h.state is RUNNING:
                self._preempt(Preempt(h, RECOMPUTE), plan)
