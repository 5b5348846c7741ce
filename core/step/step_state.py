"""`StepState`: the scratch state of one scheduler step, made when the step starts and dropped
with it.

Every phase of `metroline.core.step.scheduler.Scheduler.schedule` receives it: the plan being
filled (`StepPlan`, the output record), what is left of the step's budget, and the step's own
bookkeeping (victims announced, candidates pulled, refusals, rescue), with the tenants' `Reserves`
of the budget (`Split.shares`; how admission honours them: `metroline.core.step.reserves`).
Nothing in it outlives the step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..requests.sequence import Sequence
from .plan import StepPlan

if TYPE_CHECKING:
    from .context import StepContext
    from .step_prefix import StepPrefix

NO_REFUSAL = 1 << 62


class StepState:
    """One step's scratch state.

    - `plan`: the `StepPlan` being filled; `now`: the step's clock.
    - `decode_left`, `prefill_left`, `prefills_left`: what is left of the step's budget (decode
      tokens, prefill tokens, prefill chunks); `schedule` spends it, `drop` gives it back. With
      `one_budget` (`EngineConfig.budget_mode = "one"`) the decode and prefill shares are two
      views of one budget: each starts at the whole of it and every token is charged to both.
    - `max_chunk`: the step's prefill chunk cap (`split_budget`'s).
    - `notified`: how many of `plan.preempted` the `on_preempted` observers heard of.
    - `pulls_left`: admission candidates the scheduler may still pull.
    - `offered`: the plugins asked for something to be served (a running request, a candidate).
    - `rescuing`: the core serves the oldest request itself (`metroline.core.step.rescue`).
    - `reserves`: the tenants' reserves of the budget (`Split.shares`), or None.
    - `refusals`, `refused_need`: how often the policy declined to make room for a candidate in
      this step, and the fewest blocks one of them needed (`metroline.core.step.victim_loop`).
    """

    __slots__ = (
        "plan", "now", "decode_left", "prefill_left", "prefills_left", "max_chunk", "notified", "pulls_left",
        "offered", "rescuing", "reserves", "refusals", "refused_need", "one_budget", "_hook", "_ctx", "_prefix",
    )

    def __init__(self, plan: StepPlan, ctx: StepContext, prefix: StepPrefix | None, one_budget: bool = False) -> None:
        self.plan = plan
        self.now = ctx.now
        self.decode_left = self.prefill_left = self.prefills_left = self.max_chunk = 0
        self.notified = self.pulls_left = self.refusals = 0
        self.offered = self.rescuing = False
        self.reserves: Reserves | None = None
        self.refused_need = NO_REFUSAL
        self.one_budget = one_budget
        self._hook: Any = ctx.hook
        self._ctx = ctx
        self._prefix = prefix  # None without prefix caching: nothing is registered

    def set_budget(self, decode: int, prefill: int, prefills: int) -> None:
        """What the step may still schedule: `decode` decode tokens, `prefill` prefill tokens in
        at most `prefills` chunks (with `one_budget`: what each view of the one budget sees)."""
        self.decode_left, self.prefill_left, self.prefills_left = decode, prefill, prefills

    def tokens_left(self) -> int:
        """The tokens the step may still schedule, decodes and prefills together."""
        return self.decode_left if self.one_budget else self.decode_left + self.prefill_left

    def schedule(self, seq: Sequence, n: int, decode: bool, drafts: int = 0) -> None:
        """Put `n` tokens of `seq` (from `seq.num_computed_tokens` on) in the plan, spending the
        budget (`decode`: its tokens are charged to the decode share, else to the prefill share;
        with `one_budget` to both views of the one budget; `drafts`: the last `drafts`
        of them are draft tokens, `StepPlan.drafts`). The blocks they fill are indexed now, so
        that a request admitted later in this step shares them (`StepPrefix`); a draft's slot is
        never indexed (it is not verified yet)."""
        plan = self.plan
        plan.scheduled[seq] = n
        computed = seq.num_computed_tokens
        plan.num_context_tokens += computed + n
        if decode:
            plan.decodes.add(seq)
            plan.num_decode_tokens += n
            self.decode_left -= n
            if self.one_budget:
                self.prefill_left -= n
            if drafts:
                plan.drafts[seq] = drafts
                plan.num_draft_tokens += drafts
                n -= drafts
        else:
            plan.num_prefill_tokens += n
            self.prefill_left -= n
            self.prefills_left -= 1
            if self.one_budget:
                self.decode_left -= n
        prefix = self._prefix
        if prefix is not None:
            full = (computed + n) // plan.block_size
            if full > seq.num_cached_blocks:
                prefix.register(seq, full)

    def drop(self, seq: Sequence) -> None:
        """Take `seq` out of the plan (it was preempted while the plan was made): its tokens, and
        its admission if it was admitted in this step; its tokens go back to the budget. A
        sequence that was not scheduled stays in `admitted` (a swapped-in sequence that got no
        tokens is running all the same)."""
        plan = self.plan
        n = plan.scheduled.pop(seq, None)
        if n is None:
            return
        if seq in plan.admitted:
            plan.admitted.remove(seq)
        plan.num_context_tokens -= seq.num_computed_tokens + n
        if seq in plan.decodes:
            plan.decodes.discard(seq)
            plan.num_decode_tokens -= n
            self.decode_left += n
            if self.one_budget:
                self.prefill_left += n
            plan.num_draft_tokens -= plan.drafts.pop(seq, 0)
        else:
            plan.num_prefill_tokens -= n
            self.prefill_left += n
            self.prefills_left += 1
            if self.one_budget:
                self.decode_left += n

    def announce_preempted(self) -> None:
        """Tell `on_preempted` of the step's victims it has not heard of yet (if any)."""
        preempted = self.plan.preempted
        if len(preempted) > self.notified:
            new = preempted[self.notified :]
            self.notified = len(preempted)
            self._hook.on_preempted(ctx=self._ctx, seqs=new)

    def unannounced(self) -> bool:
        """Whether a victim of this step was not announced to `on_preempted` yet."""
        return len(self.plan.preempted) > self.notified

    def seal(self) -> StepPlan:
        """The finished plan: its `sample_seqs` fixed from the scheduled sequences (before they
        advance past the step's tokens), the budget left unused recorded in it."""
        plan = self.plan
        drafts = plan.drafts  # a drafting decode samples its newest token's row first
        plan.sample_seqs = [s for s, n in plan.scheduled.items() if s in drafts or s.num_computed_tokens + n == len(s.token_ids)]
        plan.decode_left, plan.prefill_left, plan.prefills_left = self.decode_left, self.prefill_left, self.prefills_left
        return plan


class Reserves:
    """What is left of each reserved tenant's decode and prefill tokens in this step, and the
    other tenants' running sequences whose prefill chunk the reserves cut (topped up on release)."""

    __slots__ = ("decode", "prefill", "cut")

    def __init__(self, shares: Mapping[str, float], decode: int, prefill: int) -> None:
        self.decode = {t: int(f * decode) for t, f in shares.items() if int(f * decode) > 0}
        self.prefill = {t: int(f * prefill) for t, f in shares.items() if int(f * prefill) > 0}
        self.cut: list[Sequence] = []

    def left(self, seq: Sequence, decode: bool) -> int:
        """The reserve left to `seq`'s tenant, of decode or prefill tokens."""
        return (self.decode if decode else self.prefill).get(seq.tenant, 0)

    def spend(self, seq: Sequence, step: StepState) -> None:
        """Charge `seq`'s scheduled tokens (if any) to its tenant's reserve."""
        plan = step.plan
        n = plan.scheduled.get(seq)
        if n is None:
            return
        kind = self.decode if seq in plan.decodes else self.prefill
        left = kind.get(seq.tenant)
        if left:
            kind[seq.tenant] = max(0, left - n)

    def prefill_outstanding(self) -> int:
        """Prefill tokens still reserved for their tenants."""
        return sum(self.prefill.values())

    def served_first(self, order: Iterable[Sequence], step: StepState) -> Iterator[Sequence]:
        """`order` (the running sequences as `order_running` gave them) with the sequences of
        tenants that have reserve left first, each charged as it is served; then the rest, whose
        prefill chunks may take only the prefill tokens beyond the reserves still outstanding
        (kept for the reserved tenants' waiting requests; see `admit_reserved_first`)."""
        order = list(order)
        taken = set()
        for seq in order:
            if self.left(seq, seq.is_decoding) > 0:
                taken.add(seq)
                yield seq
                self.spend(seq, step)
        for seq in order:
            if seq in taken:
                continue
            hidden = 0 if seq.is_decoding else self.prefill_outstanding()
            if not hidden:
                yield seq
                continue
            step.prefill_left -= hidden
            try:
                yield seq
            finally:
                step.prefill_left += hidden
            self.cut.append(seq)
