"""Every hook a metroline plugin can implement, specified in one place.

A plugin is a plain object (a module, or an instance of a class) whose methods are marked with
`@hookimpl` and named like the functions below. Implement only the hooks you need; a hook's
arguments are passed by name, so an implementation may accept any subset of them.

Decision hooks are `firstresult`: plugins are called newest-registered first (a plugin stacked on a
base policy runs before it), and the first answer that is not None wins. A `wrapper=True`
implementation sees the answer of the ones below it (`result = yield`) and may return a changed one,
which is how a platform plugin filters or adjusts a base policy.

Each hook is called a bounded number of times per step, with batches: observers receive every
sequence that changed state in the step in one call. In a step the observers come in this order:
`on_arrival`, (`on_preempted` while scheduling), `on_admitted`, `on_preempted` (the rest), then
after the executor ran `on_tokens`, `on_step_end`, `on_finished`; each docstring says exactly when. An invalid answer (a victim that is not
running, a budget above the total, a token row of the wrong length, ...) or an exception raised by a
plugin stops the engine with a `PluginError` that names the plugin and the hook.

Answers are checked where they are given (`core/answers.py`): the wrong type (admission yielding
something that is not a `Sequence`, a `Split` of floats or NaN, a token id that is not an int in
`[0, vocab_size)`, a negative estimate, ...) is a `PluginError` naming the plugin that answered,
wrappers included; an exception raised by a `wrapper=True` implementation names the wrapper.

Recovery (an engine used again after a `PluginError`): the error leaves the engine consistent, and
the requests of the step it interrupted end as `failed` with their blocks freed: those scheduled,
admitted or preempted in the step, the arrivals when `on_arrival` failed and the samples forked
in it. An observer hook is delivered to every implementation even when one raises (the first
error is raised after all ran), so only the plugin that raised misses the event: a policy that
raised in `on_arrival`, `on_admitted` or `on_preempted` is the one that could lose track of a
request, and those requests are the ones failed; missing `on_tokens`, `on_finished` or
`on_step_end` cannot leave a request waiting for ever in the shipped plugins (they keep counters
there, not queues), and the step's requests are failed all the same.

`ctx` is the `StepContext` of the engine: `ctx.now`, `ctx.step`, `ctx.config`, `ctx.running`,
`ctx.num_waiting`, `ctx.num_free_blocks()`, ... (see `core/context.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .budget import Split
    from .context import StepContext
    from .plan import StepPlan
    from .preemption import Preempt
    from .sequence import Sequence

PROJECT = "metroline"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- decisions ---------------------------------------------------------------------------------


@hookspec(firstresult=True)
def admission(ctx: StepContext) -> Iterable[Sequence] | None:
    """Which waiting sequences to try to admit this step, in which order.

    Called once per step, after the running sequences were served. Return an iterable (ideally a
    lazy generator) of sequences in state WAITING or SWAPPED, most deserving first. The scheduler
    pulls from it one at a time and stops pulling as soon as slots or the prefill budget run out,
    so a policy that keeps an incremental structure pays only for what is admitted.

    Return a `Candidates(iterable, head_of_line=...)` to say what happens when a candidate does not
    fit in the free KV blocks: head-of-line (the default, and what a plain iterable means) stops
    admission for this step; otherwise the scheduler skips it and tries the next one.

    A wrapper that holds candidates back uses `Candidates.filter` (drop them: later ones may pass)
    or `Candidates.gate` (a refusal blocks, under head-of-line); both keep the flag and close the
    policy's generator when the scheduler stops pulling.

    Candidates that are not waiting or swapped (finished, cancelled, already running) are skipped,
    so a policy may drop stale entries lazily. Sequences are admitted in the order yielded;
    `on_admitted` reports them after the step's admission ends.

    The scheduler pulls at most `2 * (waiting + swapped + running) + 8` candidates in one step
    (a request preempted during the step may come back once); an iterable that yields more (an
    endless generator, a `cycle`) is an invalid answer: "admission yielded more candidates than
    are queued".

    The core's rescue (the one case where it overrides the plugins): when a step schedules
    nothing although the plugins asked for something (a request is running, or admission yielded
    a waiting or swapped candidate) and no plugin asked to be woken up later (`ctx.wake_at`), the
    core serves the oldest unfinished request itself, as fcfs would: the whole budget, a prefill
    chunk of `max_prefill_chunk`, the youngest running requests as victims (a debug run logs
    `scheduler.rescue`). An admission that yields nothing while nothing runs is the plugin's
    choice: the engine then stops with `NoProgressError` after `max_idle_steps` empty steps.
    """


@hookspec(firstresult=True)
def select_victim(ctx: StepContext, requester: Sequence, reason: str) -> Sequence | Preempt | None:
    """Which running sequence to preempt so that `requester` can go on, and how.

    Called when `requester` cannot be served: `reason` is `"blocks"` (it needs a KV block and none
    is free) or `"slots"` (it is a waiting candidate and `max_num_seqs` sequences already run).
    `requester` is either running (it needs a block for its next tokens) or a waiting/swapped
    candidate of `admission`.

    Return a running sequence (preempted with the configured mode), a `Preempt(seq, mode)` to choose
    the mode (`"recompute"` or `"swap"`), or None: for a running requester None preempts the
    requester itself; for a waiting candidate None leaves it waiting. The victim may be the
    requester. The hook is called again while blocks are still missing. A victim that is not
    running is an invalid answer.

    The progress rule (the core's, whatever the policy): a request preempted twice in a row
    without computing past the most tokens it had ever computed is *protected* until it passes
    that mark (`ctx.is_protected(seq)`). A protected request is never displaced for a younger
    requester (later `arrival_no`; samples of one request by index): when the answer names one,
    the core takes instead the youngest running request other than the requester that is
    unprotected or younger than it, and if there is none the requester yields (a running one
    preempts itself, a waiting one stays waiting). A protected requester named as its own victim
    displaces the youngest running request younger than itself instead, when there is one.
    Older requesters are not restricted, and a request is never protected before its second
    preemption without progress, so schedules without repeated fruitless preemption (all of
    vLLM's recorded ones) are unchanged. So nobody displaces the oldest unfinished request more
    than twice between two advances of its mark, and (with the rescue, see `admission`) every
    request finishes whenever the oldest unfinished one fits in the pool on its own.
    """


@hookspec(firstresult=True)
def split_budget(
    ctx: StepContext, budget: int, num_decoding: int, num_prefilling: int, num_waiting: int
) -> Split | None:
    """How this step's token budget is split between decodes and prefill chunks.

    Called once per step before anything is scheduled. `budget` is `max_num_batched_tokens`;
    `num_decoding` counts running (and swapped) sequences that need one decode token,
    `num_prefilling` running sequences in the middle of a prefill, `num_waiting` waiting ones.
    Return `Split(decode, prefill, max_chunk)`: at most `decode` decode tokens and `prefill` prefill
    tokens are scheduled, no prefill chunk is longer than `max_chunk`. `decode + prefill` above the
    budget, a negative share or `max_chunk < 1` is an invalid answer.
    """


@hookspec(firstresult=True)
def order_running(ctx: StepContext, running: list[Sequence]) -> Iterable[Sequence] | None:
    """The order in which running sequences are served this step.

    Matters when the decode or prefill share cannot serve every running sequence (the ones served
    first get tokens) and for preemption (a sequence served later may become a victim). Return an
    iterable over (a permutation or subset of) `running`; sequences left out get no tokens this step.
    The default is admission order.
    """


@hookspec(firstresult=True)
def sample(ctx: StepContext, seqs: list[Sequence], logits: Any, eos_token_id: int | None) -> list[int] | None:
    """The next token of each sequence in `seqs`, from its row of `logits`.

    Called once per step with every sequence that reached the end of its known tokens, in the
    order of `StepPlan.sample_seqs` (then the new children of an `n > 1` request, each with a copy
    of its parent's row). `logits` has one row per sequence: with a real executor a torch tensor
    `[len(seqs), vocab_size]` on the model's device (raw model output: no penalty, temperature or
    filter applied yet; do not modify it in place, a wrapper below may read it too); None in
    simulation, where tokens are stand-ins. `eos_token_id` is the model's end-of-sequence token
    (None when unknown).

    The default (`core/sampling.py`) applies each sequence's `SamplingParams` (min_tokens,
    penalties, temperature, min_p, top_k, top_p, seed). A plugin may answer for all sequences, or
    wrap the default (`wrapper=True`) to adjust its tokens; `seq.token_ids` holds prompt and output
    so far. Return one token id per sequence; a list of another length is an invalid answer. The
    engine then checks the stop conditions (stop token ids, EOS, stop strings, max_new_tokens).
    """


@hookspec(firstresult=True)
def estimate_output_tokens(ctx: StepContext, seq: Sequence) -> int | None:
    """An estimate of how many output tokens `seq` will generate in all.

    Asked by policies that need lengths (such as `srpt`) when the request carries no
    `expected_output_tokens` hint, typically once per request when it arrives. Return a
    non-negative int, or None to let the next plugin answer.
    """


# --- at the edge: once per request, outside the step ------------------------------------------


@hookspec
def check_request(ctx: StepContext, seq: Sequence) -> str | None:
    """Why `seq` could never run under this plugin's limits, or None.

    Called by `Engine.add_request` for each new request before it is queued (its `Sequence`, not
    yet waiting). A plugin with a per-request limit (a tenant's running cap below the request's
    `sampling.n`, ...) returns a one-line reason; the request is then refused (`RequestRefused`,
    recorded as `rejected` by the workload replay) instead of waiting for ever. Every plugin is
    asked; the first reason is reported, prefixed with the plugin's name. A plugin that raises or
    answers something else than a string or None is a `PluginError`.
    """


# --- observers: state for policies; return values are ignored -----------------------------------


@hookspec
def on_arrival(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that joined the waiting queue (new requests) since the last step.

    When: once per step, first thing in `Scheduler.schedule` (before `split_budget`), when there
    are any; a request submitted with a future `arrival_time` arrives in the first step that
    starts at or after it. The samples of an `n > 1` request are no arrivals (they never wait):
    `on_admitted` reports them.
    """


@hookspec
def on_admitted(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that started running this step: those admitted from waiting or swapped, in
    admission order, then the samples forked in this step (an `n > 1` request forks in the step
    that computes its last prompt token; `seq.parent` is the parent).

    When: once per step, at the end of `Scheduler.schedule` (after admission and the core's
    rescue, before the executor runs), when there are any. A sequence admitted and then preempted
    in the same step is not reported.
    """


@hookspec
def on_preempted(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences preempted this step: back to WAITING (recompute) or SWAPPED (swap). Each victim is
    reported once, in preemption order.

    When: inside `Scheduler.schedule`, as soon as a policy must know, and otherwise at its end:
    the victims of serving the running sequences before `admission` is asked, each later victim
    before admission pulls its next candidate (so that a request preempted in this step is back in
    its policy's queue, in its place, when admission goes on), the rescue's victims after the
    rescue, and the rest at the end of scheduling, after `on_admitted`. So, unlike the other
    observers, it may be called more than once in a step (never with an empty list); policies
    that re-queue victims depend on this order.
    """


@hookspec
def on_tokens(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that got a new token this step (the token is `seq.token_ids[-1]`).

    When: once per step that sampled tokens, after they were appended and the stop conditions
    checked (a sequence the token stopped is FINISHED already), before `on_step_end`.
    """


@hookspec
def on_finished(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that ended (any reason: see `seq.finish_reason`); their blocks are already freed.

    When: once per step, at its very end (the reap, after `on_step_end`), with the sequences that
    ended in it; and from `Engine.abort`, at once, with the cancelled request's sequences. A step
    interrupted by an error (the executor's, or a plugin's) reaps the requests it failed then.
    """


@hookspec
def on_step_end(ctx: StepContext, plan: StepPlan) -> None:
    """The step's plan, after it ran and its tokens were appended.

    When: once per step, after `on_tokens` and before the reap (`on_finished`), for every step
    that `ctx.step` counts, one that scheduled nothing included (its plan is empty); not for a step
    interrupted by an error.
    """


DECISION_HOOKS = (
    "admission", "select_victim", "split_budget", "order_running", "sample", "estimate_output_tokens",
)
OBSERVER_HOOKS = (
    "on_arrival", "on_admitted", "on_preempted", "on_tokens", "on_finished", "on_step_end",
)
EDGE_HOOKS = ("check_request",)
