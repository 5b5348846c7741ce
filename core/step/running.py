"""The running phase of the step: the running sequences get their decode token or next prefill
chunk, in the policy's order (`order_running`), as far as the step's shares go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..requests.sequence import RUNNING

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from ..plugins.manager import PluginManager
    from ..requests.sequence import Sequence
    from .context import StepContext
    from .speculation import Speculation
    from .step_state import StepState
    from .victim_loop import VictimLoop


def serve_running(
    plugins: PluginManager, ctx: StepContext, running: dict[Sequence, None], pool: BlockPool, room: VictimLoop,
    step: StepState, speculation: Speculation | None = None,
) -> None:
    """Give the `running` sequences, in `order_running`'s order (tenants with a reserve first,
    see `Reserves.served_first`), a decode token or their next prefill chunk, with blocks from
    `pool` or, when they run out, from victims (`room`). A decode that `speculation` gave drafts
    this step is served with them (`Speculation.serve`)."""
    seqs = list(running)
    order = plugins.hook.order_running(ctx=ctx, running=seqs)
    if step.reserves is not None:
        order = step.reserves.served_first(order, step)
    members = None if order is seqs else set(seqs)  # the list as given needs no check
    listed: set[Sequence] = set()
    grow, schedule = room.grow, step.schedule
    allocate, ops = pool.allocate_slots, step.plan.block_ops  # `grow` without a call, when blocks are free
    max_chunk = step.max_chunk
    speculate = speculation.serve if speculation is not None and speculation.drafts else None
    for seq in order:
        if members is not None:
            if seq not in members:
                raise plugins.invalid("order_running", f"{seq!r} is not a running sequence")
            if seq in listed:  # the answer is a permutation or subset of `running`
                raise plugins.invalid("order_running", f"{seq!r} is listed twice")
            listed.add(seq)
        if seq.state is not RUNNING:
            continue  # preempted as a victim earlier in this step
        known = len(seq.token_ids)
        computed = seq.num_computed_tokens
        if computed == known - 1 and known > seq.num_prompt_tokens:  # decoding
            if step.decode_left <= 0:
                continue
            if speculate is not None:
                speculate(seq, pool, room, step)
                continue
            if allocate(seq.block_table, computed, 1, ops) or grow(seq, 1, step):
                schedule(seq, 1, True)
            continue
        n = min(known - computed, step.prefill_left, max_chunk)
        if n <= 0 or step.prefills_left <= 0:
            continue
        if allocate(seq.block_table, computed, n, ops) or grow(seq, n, step):
            schedule(seq, n, False)
