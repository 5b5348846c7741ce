"""Per-tenant reserves of a step's token budget: how the step honours `Split.shares`.

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

`Reserves` (the step's reserves, in its `StepState`) is in `metroline.core.step.step_state`.

Cost: nothing without shares. With shares, a step whose reserve is not met keeps pulling
candidates until it is or they run out (up to the whole queue), so a plugin should reserve only
for tenants that have requests in the engine (as `tenant_shares` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from ..requests.sequence import RUNNING, Sequence
from .outcome import ADMITTED, BLOCKED, STOP
from .step_state import Reserves, StepState

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from .outcome import Outcome
    from .step_prefix import StepPrefix


class Admission(Protocol):
    """What the reserves use of `metroline.core.step.admission.Admission`."""

    pool: BlockPool
    prefix: StepPrefix

    def victims_back(self, step: StepState) -> bool: ...

    def next_candidate(self, candidates: Iterator[Sequence], step: StepState) -> Sequence | None: ...

    def admit_candidate(self, seq: Sequence, step: StepState) -> Outcome | None: ...


def admit_reserved_first(
    admission: Admission, candidates: Iterator[Sequence], step: StepState, head_of_line: bool
) -> bool:
    """Admit (with `admission`) the reserved tenants' candidates with the whole budget and the
    others' within the budget beyond the reserves, holding back those that find none; then the
    held ones. True when admission goes on as usual (every reserve is used)."""
    reserves: Reserves = step.reserves
    held: list[Sequence] = []
    met = go_on = False
    while step.decode_left > 0 or step.prefill_left > 0:
        if step.unannounced() and not admission.victims_back(step):
            break
        outstanding = reserves.prefill_outstanding()
        if not outstanding:
            met = go_on = True
            break
        seq = admission.next_candidate(candidates, step)
        if seq is None:
            go_on = True
            break
        if reserves.left(seq, False) > 0:
            outcome = admission.admit_candidate(seq, step)
            if outcome is ADMITTED:
                reserves.spend(seq, step)
        elif step.prefill_left <= outstanding:
            held.append(seq)
            continue
        else:
            step.prefill_left -= outstanding  # hidden from the others' candidates
            try:
                outcome = admission.admit_candidate(seq, step)
            finally:
                step.prefill_left += outstanding
        if outcome is STOP or (outcome is BLOCKED and head_of_line):
            go_on = True  # the held candidates came before it
            break
    release_reserves(step, admission.pool, admission.prefix)
    return go_on and _admit_held(admission, held, step, head_of_line) and met


def release_reserves(step: StepState, pool: BlockPool, prefix: StepPrefix) -> None:
    """The prefill reserves end: the running sequences they cut get the tokens they could have
    had (as far as the budget left and the free blocks of `pool` go, without preemption)."""
    reserves: Reserves = step.reserves
    reserves.prefill.clear()
    cut, reserves.cut = reserves.cut, []
    plan, max_chunk = step.plan, step.max_chunk
    for seq in cut:
        if seq.state is not RUNNING or seq in plan.decodes:
            continue
        have = plan.scheduled.get(seq, 0)
        computed = seq.num_computed_tokens
        extra = min(len(seq.token_ids) - computed - have, max_chunk - have, step.prefill_left)
        if extra <= 0 or (not have and step.prefills_left <= 0):
            continue
        if not pool.allocate_slots(seq.block_table, computed + have, extra, plan.block_ops):
            continue
        registered = prefix.registered.get(seq)  # its blocks' state before the step
        step.drop(seq)
        step.schedule(seq, have + extra, False)
        if registered is not None:
            prefix.registered[seq] = registered


def _admit_held(admission: Admission, held: list[Sequence], step: StepState, head_of_line: bool) -> bool:
    """Admit the candidates held back for the reserves, in their order; False when admission
    ended on one of them."""
    for seq in held:
        if step.unannounced() and not admission.victims_back(step):
            return False
        outcome = admission.admit_candidate(seq, step)
        if outcome is STOP or (outcome is BLOCKED and head_of_line):
            return False
    return True
