"""The observer hooks (`on_*`): every plugin hears of each event, and keeps its own state (ages,
counters, estimates); their return values are ignored. Their contract, shared by every hook, is
`metroline.core.plugins.hookspecs`'s docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .markers import hookspec

if TYPE_CHECKING:
    from ..requests.sequence import Sequence
    from ..step.context import StepContext
    from ..step.plan import StepPlan


# --- observers: state for policies; return values are ignored -----------------------------------


@hookspec
def on_arrival(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that joined the waiting queue (new requests) since the last step.

    Called first thing in `Scheduler.schedule`, once per request that arrived (`seqs` holds that
    one request's sequence), so that an error it raises is that request's alone: the request
    fails and the step goes on for the others. A request arrives at the next step (one with a
    future `arrival_time`, at the first step that starts at or after it). The samples of an
    `n > 1` request never arrive: `on_admitted` reports them.
    """


@hookspec
def on_admitted(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that started running this step: those admitted from waiting or swapped, in
    admission order, then the samples forked in this step (`seq.parent` is the parent; a request
    forks in the step that computes its last prompt token).

    Called once per step, at the end of scheduling (after admission and the rescue, before the
    executor), when there are any. A sequence admitted and preempted in the same step is not
    reported; a sequence readmitted after a preemption is reported again.
    """


@hookspec
def on_preempted(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences preempted this step: back to WAITING (recompute) or SWAPPED (swap), each once, in
    preemption order.

    Called while scheduling, as soon as a policy must know, so possibly several times in a step
    (never with an empty list): the victims of serving the running sequences before `admission`
    is asked; each later victim before admission pulls its next candidate (a request preempted in
    the step is back in its policy's queue, in its place, when admission goes on); the rescue's
    victims after the rescue; the rest at the end of scheduling, after `on_admitted`.
    """


@hookspec
def on_tokens(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that got a new token this step (`seq.token_ids[-1]`).

    Called once per step that sampled, after the tokens were appended and the stop conditions
    checked (a sequence the token stopped is FINISHED already), before `on_step_end`.
    """


@hookspec
def on_finished(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that ended (any reason: `seq.finish_reason`); their blocks are already freed.

    Called once per step that ended sequences, at its very end (the reap, after `on_step_end`);
    and from `Engine.abort`, at once, with the cancelled request's sequences. A step interrupted
    by an error reaps the requests it failed then.
    """


@hookspec
def on_step_end(ctx: StepContext, plan: StepPlan) -> None:
    """The step's plan, after it ran and its tokens were appended.

    Called once per step that `ctx.step` counts, an empty one included (its plan is empty), after
    `on_tokens` and before the reap (`on_finished`); not for a step interrupted by an error.
    """
