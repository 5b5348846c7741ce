"""Stall diagnosis: when steps without progress are a stall, and the error that explains one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import NoProgressError

if TYPE_CHECKING:
    from ...kv_backends.block_pool import BlockPool
    from .scheduler import Scheduler


def is_stalled(steps: int, max_idle_steps: int, last_plan_empty: bool, max_kv_tokens: int) -> bool:
    """Whether `steps` steps in a row without progress are a stall: `max_idle_steps` when the
    last step scheduled nothing; when it scheduled something (recomputation after a preemption is
    not progress, and recomputing all the KV the pool holds, one token a step, takes up to
    `max_kv_tokens` steps), that many more."""
    if steps < max_idle_steps:
        return False
    return last_plan_empty or steps >= max_idle_steps + max_kv_tokens


def stall_error(
    s: Scheduler, pool: BlockPool, last_plan_empty: bool, plugin_names: list[str], steps: int
) -> NoProgressError:
    """The error for `steps` steps in a row without progress while requests wait: names the
    plugins (`plugin_names`), the oldest stuck requests of scheduler `s` (state, tokens and blocks
    needed against `pool`) and why they cannot run."""
    empty = last_plan_empty
    what = "scheduled nothing" if empty else "made no progress (only preemption and recomputation)"
    stuck = sorted((*s.running, *s.waiting, *s.swapped), key=lambda q: (q.arrival_no, q.index))
    details = []
    for q in stuck[:3]:
        need = -(-(len(q.token_ids) + q.sampling.max_new_tokens - q.num_output_tokens) // pool.block_size)
        if need > pool.num_blocks:
            why = "it does not fit in the pool on its own"
        elif empty and not s.last_offered:
            why = "admission offered nothing and nothing runs"
        elif empty:
            why = "the budget split or a plugin's gate gave it no tokens"
        else:
            why = f"preempted {q.num_preemptions} times"
        details.append(
            f"{q.seq_id} {q.state.name.lower()} needs {need} blocks of {pool.block_size} tokens "
            f"(pool {pool.num_blocks}, {pool.num_free_blocks()} free): {why}"
        )
    return NoProgressError(
        f"{steps} steps {what} with {len(s.running)} running, {len(s.waiting)} "
        f"waiting and {len(s.swapped)} swapped requests: check the plugins' admission, "
        f"select_victim and split_budget ({', '.join(plugin_names)}); oldest: "
        + "; ".join(details)
    )
