"""The victim loop: ask the policy for a victim (`select_victim`), preempt it.

`VictimLoop` makes room for the other phases of the step (serving the running sequences,
admission, the rescue): every place that lacks a slot or a block goes through one loop,
`preempt_for`; a victim is a `Preempt` (sequence and mode).

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

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from ...kv_backends.swap_space import SwapSpace
    from ..config import EngineConfig
    from ..plugins.manager import PluginManager
    from .context import StepContext
    from .queues import Queues
    from .step_prefix import StepPrefix
    from .step_state import StepState

REFUSALS_PER_STEP = 4
"""How many times in one step the policy may decline (`select_victim` answers None) to make room
for a waiting or swapped candidate's blocks before no later candidate of the step is offered
preemption."""



class VictimLoop:
    """Making room: slots and blocks for a requester, by preempting victims. It preempts through
    `queues`, `pool` and `swap` (None: no swap space), unregisters the victims' blocks of this step
    from `prefix`, and asks `plugins` (their `select_victim`, seen with `ctx`); `config` gives
    `max_num_seqs` and the preemption mode."""

    def __init__(
        self, config: EngineConfig, plugins: PluginManager, ctx: StepContext, queues: Queues, pool: BlockPool,
        swap: SwapSpace | None, prefix: StepPrefix,
    ) -> None:
        self.plugins = plugins
        self.ctx = ctx
        self.queues = queues
        self.running = queues.running
        self.pool = pool
        self.swap = swap
        self.prefix = prefix
        self.config = config

    def preempt_for(
        self, requester: Sequence, reason: str, step: StepState, done: Callable[[], bool], need: int = 0
    ) -> bool:
        """Until `done()`, ask for a victim for `requester` (`reason`: `"blocks"` or `"slots"`) and
        preempt it. False when there is no victim (a waiting requester stays where it is) or the
        requester was preempted itself. `need`: the blocks a candidate (waiting or swapped
        `requester`) lacks room for; it is not asked for when the step's refusals rule it out
        (see the module docstring)."""
        candidate = requester.state is not RUNNING and reason == "blocks" and not step.rescuing
        while not done():
            if candidate and (need >= step.refused_need or step.refusals >= REFUSALS_PER_STEP):
                return False
            victim = self.victim(requester, reason, step.rescuing)
            if victim is None:
                if candidate:
                    step.refusals += 1
                    step.refused_need = min(step.refused_need, need)
                return False
            self.preempt(victim, step)
            if victim.seq is requester:
                return False
        return True

    def make_room_for(self, seq: Sequence, slots: int, step: StepState) -> bool:
        """Free `slots` running slots for a candidate, preempting if the policy says so. The slots
        of the children that running parents will fork are taken already."""
        queues, limit = self.queues, self.config.max_num_seqs - slots
        return self.preempt_for(seq, "slots", step, lambda: len(queues.running) + queues.fork_slots <= limit)

    def grow(self, seq: Sequence, n: int, step: StepState) -> bool:
        """Give `seq` the blocks for `n` more tokens, preempting victims while blocks are missing.
        False when `seq` could not be served (it was preempted itself, or it is a candidate that
        the policy would not make room for)."""
        allocate, ops = self.pool.allocate_slots, step.plan.block_ops
        if allocate(seq.block_table, seq.num_computed_tokens, n, ops):
            return True
        need = -(-(seq.num_computed_tokens + n) // self.pool.block_size) - len(seq.block_table)
        return self.preempt_for(
            seq, "blocks", step, lambda: allocate(seq.block_table, seq.num_computed_tokens, n, ops), need
        )

    def victim(self, requester: Sequence, reason: str, rescuing: bool = False) -> Preempt | None:
        """Ask `select_victim`; None means the (waiting) requester stays where it is. A protected
        victim (`is_protected`) of a younger requester, or a protected requester named as its own
        victim, is replaced by `substitute`'s (the no-livelock rule, see `select_victim`). In the
        core's rescue (`rescuing`) the core picks the victim itself (`substitute`)."""
        mode = self.config.preemption_mode
        if rescuing:
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

    def preempt(self, victim: Preempt, step: StepState) -> None:
        """Take the victim off the running set: back to waiting (recompute) or to the host (swap).
        A swap falls back to recompute when the pool refuses it: the swap space is full, or the
        victim's computed KV is not all written yet (a hit of blocks registered in this step,
        which the forward writes after the swap-out would have copied them; see
        `metroline.kv_backends.pending`). The requests admitted in this step on a hit of blocks
        it registered follow it (recompute)."""
        seq = victim.seq
        plan = step.plan
        step.drop(seq)
        self.queues.stop_running(seq)
        seq.num_preemptions += 1
        mark = seq.num_computed_tokens
        if mark < seq.max_computed:
            mark = seq.max_computed
        seq.stalls = seq.stalls + 1 if mark <= seq.stall_mark else 1
        seq.stall_mark = seq.max_computed = mark
        host = None
        if victim.mode == SWAP and self.swap is not None:
            host = self.pool.swap_out(seq.block_table, self.swap, plan.block_ops, seq.num_computed_tokens)
        if host is None:
            self.pool.release(seq.block_table)
        hitters = self.prefix.unregister(seq)
        if host is not None:
            seq.host_table = host
            seq.state = SWAPPED
            self.queues.swapped[seq] = None
        else:
            seq.num_lost_tokens = max(seq.num_lost_tokens, seq.num_computed_tokens)
            seq.num_computed_tokens = 0
            seq.num_cached_blocks = 0
            seq.state = WAITING
            self.queues.waiting[seq] = None
        seq.block_table = []
        plan.preempted.append(seq)
        for h in hitters:  # admitted on a hit of blocks that will not be computed: back to waiting
            if h.state is RUNNING:
                self.preempt(Preempt(h, RECOMPUTE), step)
