"""Parallel sampling (`n > 1`): a request forks into `n` samples once its prompt is computed.

The parent samples its first token in the step that computes its last prompt token; its `n - 1`
children are made when that step's plan is sealed (`Scheduler.fork`), run from then on, share
every block of the parent, the last partial one included (copy-on-write), and sample their first
token in that step from the parent's row of logits (`StepPlan.forked`, `StepPlan.fork_rows`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..requests.sequence import RUNNING, Sequence

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool


def forks_now(seq: Sequence) -> bool:
    """Whether `seq` is a parent about to sample its first token, whose samples are not made yet."""
    return seq.sampling.n > 1 and seq.index == 0 and not seq.children and seq.num_output_tokens == 0


def unforked(seq: Sequence) -> int:
    """The slots the children of `seq` will take when it forks; 0 for a child or a parent that has
    forked."""
    return seq.sampling.n - 1 if seq.index == 0 and not seq.children else 0


def make_children(parent: Sequence, pool: BlockPool) -> list[Sequence]:
    """The `n - 1` siblings of `parent`, running, sharing its blocks and its prompt, whose KV the
    step that forks them computes."""
    children = []
    for i in range(1, parent.sampling.n):
        child = Sequence(
            parent.request_id, parent.token_ids[: parent.num_prompt_tokens], parent.sampling,
            parent.arrival_time, tenant=parent.tenant, priority=parent.priority,
            deadline=parent.deadline, expected_output_tokens=parent.expected_output_tokens,
            cache_salt=parent.cache_salt, metadata=parent.metadata, arrival_no=parent.arrival_no,
            seq_id=f"{parent.request_id}#{i}", index=i,
        )
        child.block_table = pool.fork(parent.block_table)
        child.num_computed_tokens = parent.num_prompt_tokens
        child.num_cached_blocks = parent.num_cached_blocks
        child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
        child.first_scheduled_time = parent.first_scheduled_time
        child.prefill_done_time = parent.prefill_done_time
        child.parent = parent
        child.state = RUNNING
        children.append(child)
    return children


def with_rows(logits: Any, rows: list[int]) -> Any:
    """`logits` followed by a copy of each row in `rows` (the children's rows: their parents').
    A tensor (or array) is indexed once; a list of rows is extended; None (simulation) stays."""
    if logits is None:
        return None
    if isinstance(logits, (list, tuple)):
        return [*logits, *(logits[i] for i in rows)]
    return logits[list(range(len(logits))) + rows]
