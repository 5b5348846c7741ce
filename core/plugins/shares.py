"""Per-tenant reserves of a step's token budget: how the scheduler honours `Split.shares`.

A tenant with share `f` has `floor(f * decode)` decode and `floor(f * prefill)` prefill tokens of
the step reserved (`Reserves`). Its sequences are served first up to that much: among the running
sequences, those of tenants with reserve left come first (in `order_running`'s order), then all the
others in that order; in admission, while a reserve is outstanding, another tenant's candidate may
take only the prefill tokens beyond it and is set aside (held, in order) when there are none,
while admission looks further for the reserved tenants' candidates. The reserves are released, and
the held candidates admitted first, in their order, as soon as every reserve is used, or when the
candidates run out or admission ends: what a tenant leaves unused goes to the others in the same
step. A reserved tenant may get more than its share (a chunk or decode beyond it, or budget the
others left); never less while it has tokens to compute that fit (blocks, slots, chunk cap).

Cost: nothing without shares. With shares, a step whose reserve is not met keeps pulling
candidates until it is or they run out (up to the whole queue), so a plugin should reserve only
for tenants that have requests in the engine (as `tenant_shares` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from ..requests.sequence import RUNNING, Sequence
from ..step.admission import ADMITTED, BLOCKED, STOP

if TYPE_CHECKING:
    from ..step.plan import StepPlan


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

    def spend(self, seq: Sequence, plan: StepPlan) -> None:
        """Charge `seq`'s scheduled tokens (if any) to its tenant's reserve."""
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

    def served_first(self, order: Iterable[Sequence], plan: StepPlan) -> Iterator[Sequence]:
        """`order` (the running sequences as `order_running` gave them) with the sequences of
        tenants that have reserve left first, each charged as it is served; then the rest, whose
        prefill chunks may take only the prefill tokens beyond the reserves still outstanding
        (kept for the reserved tenants' waiting requests; see `ReservedAdmission`)."""
        order = list(order)
        taken = set()
        for seq in order:
            if self.left(seq, seq.is_decoding) > 0:
                taken.add(seq)
                yield seq
                self.spend(seq, plan)
        for seq in order:
            if seq in taken:
                continue
            hidden = 0 if seq.is_decoding else self.prefill_outstanding()
            if not hidden:
                yield seq
                continue
            plan.prefill_left -= hidden
            try:
                yield seq
            finally:
                plan.prefill_left += hidden
            self.cut.append(seq)


class ReservedAdmission:
    """The part of admission that runs while a tenant's prefill reserve is outstanding (a part of
    `Scheduler`, like `Admission`)."""

    def _admit_reserved_first(
        self, candidates: Iterator[Sequence], plan: StepPlan, max_chunk: int, head_of_line: bool
    ) -> bool:
        """Admit the reserved tenants' candidates with the whole budget and the others' within
        the budget beyond the reserves, holding back those that find none; then the held ones.
        True when admission goes on as usual (every reserve is used)."""
        reserves: Reserves = self._reserves
        held: list[Sequence] = []
        met = go_on = False
        while plan.decode_left > 0 or plan.prefill_left > 0:
            if len(plan.preempted) > self._notified and not self._victims_back(plan):
                break
            outstanding = reserves.prefill_outstanding()
            if not outstanding:
                met = go_on = True
                break
            seq = self._next_candidate(candidates)
            if seq is None:
                go_on = True
                break
            if reserves.left(seq, False) > 0:
                outcome = self._admit_candidate(seq, plan, max_chunk)
                if outcome is ADMITTED:
                    reserves.spend(seq, plan)
            elif plan.prefill_left <= outstanding:
                held.append(seq)
                continue
            else:
                plan.prefill_left -= outstanding  # hidden from the others' candidates
                try:
                    outcome = self._admit_candidate(seq, plan, max_chunk)
                finally:
                    plan.prefill_left += outstanding
            if outcome is STOP or (outcome is BLOCKED and head_of_line):
                go_on = True  # the held candidates came before it
                break
        self._release_reserves(plan, max_chunk)
        return go_on and self._admit_held(held, plan, max_chunk, head_of_line) and met

    def _release_reserves(self, plan: StepPlan, max_chunk: int) -> None:
        """The prefill reserves end: the running sequences they cut get the tokens they could
        have had (as far as the budget left and the free blocks go, without preemption)."""
        reserves: Reserves = self._reserves
        reserves.prefill.clear()
        cut, reserves.cut = reserves.cut, []
        for seq in cut:
            if seq.state is not RUNNING or seq in plan.decodes:
                continue
            have = plan.scheduled.get(seq, 0)
            computed = seq.num_computed_tokens
            extra = min(len(seq.token_ids) - computed - have, max_chunk - have, plan.prefill_left)
            if extra <= 0 or (not have and plan.prefills_left <= 0):
                continue
            if not self.pool.allocate_slots(seq.block_table, computed + have, extra, plan.block_ops):
                continue
            registered = self.prefix.registered.get(seq)  # its blocks' state before the step
            plan.drop(seq)
            self._schedule(seq, have + extra, plan, False)
            if registered is not None:
                self.prefix.registered[seq] = registered

    def _admit_held(self, held: list[Sequence], plan: StepPlan, max_chunk: int, head_of_line: bool) -> bool:
        """Admit the candidates held back for the reserves, in their order; False when admission
        ended on one of them."""
        for seq in held:
            if len(plan.preempted) > self._notified and not self._victims_back(plan):
                return False
            outcome = self._admit_candidate(seq, plan, max_chunk)
            if outcome is STOP or (outcome is BLOCKED and head_of_line):
                return False
        return True
