"""Every hook a metroline plugin can implement, specified in one place.

A plugin is a plain object (a module, or an instance of a class) whose methods are marked with
`@hookimpl` and named like the functions below. Implement only the hooks you need; arguments are
passed by name, so an implementation may accept any subset of them.

Decision hooks are `firstresult`: plugins are called newest-registered first (a plugin stacked on
a base policy runs before it), and the first answer that is not None wins; the built-in defaults
(`core/defaults.py`) answer last. A `wrapper=True` implementation sees the answer of the ones
below it (`answer = yield`) and may return a changed one; an old-style `hookwrapper=True` one may
`outcome.force_result(...)`. Observers (`on_*`) are called on every plugin; their return values
are ignored. Each hook is called a bounded number of times per step, with batches.

The step protocol: the hooks one `Engine.step` calls, in this order (`?`: at most once, `*`: any
number of times, `a|b`: either; an observer nobody implements is skipped). `STEP_PROTOCOL` is
parsed from this list and the tests check every step against it (tests/test_hook_order.py)::

    on_arrival?                    the requests that arrived since the last step
    split_budget                   every step
    num_draft_tokens?              speculative decoding on and sequences decode
    order_running?                 when sequences run
    select_victim*                 blocks for the running sequences: once per victim
    on_preempted?                  their victims, before admission
    admission?                     when requests wait (not after a preemption if the preset says so)
    (select_victim|on_preempted)*  slots and blocks for candidates; victims before the next one
    on_preempted?                  the rescue's victims (the core chose them: no select_victim)
    on_admitted?                   the step's admissions, then the samples forked in it
    on_preempted?                  the victims not told yet
    sample*                        when sequences reached the end of their known tokens; again per accepted draft
    on_tokens?                     the sequences that got a token
    on_step_end                    every step, an empty one included
    on_finished?                   the reap: the sequences that ended in the step

Outside the protocol: `estimate_output_tokens` is asked by plugins (`ctx.hook`), from their own
hooks or their admission generator; `check_request` runs in `Engine.add_request`; `on_finished`
also runs in `Engine.abort`, between steps. A step that a `PluginError` interrupts stops where it is.

Answers are checked where they are given (`core/answers.py`): the wrong type (a candidate that is
not a `Sequence`, shares over 1, a negative estimate, ...) is a `PluginError` naming the plugin,
or the wrapper, that answered. What needs the engine's state (a victim that is not running, a
split above the budget) is checked where it is used, after every wrapper, naming the plugin that
answered and the wrappers it went through. An exception raised by any implementation, wrappers
included, is a `PluginError` naming that plugin and the hook. The error leaves the engine
consistent: the requests of the interrupted step end as `failed` (`core/recovery.py`); an
observer still reaches every other implementation (the first error is raised after all ran).

`ctx` is the `StepContext` of the engine: `ctx.now`, `ctx.step`, `ctx.config`, `ctx.running`,
`ctx.waiting`, `ctx.swapped`, `ctx.num_free_blocks()`, ... (see `core/context.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ..cluster.view import Refuse, ReplicaView, RouteRequest
    from ..requests.sequence import Sequence
    from ..step.context import StepContext
    from ..step.plan import StepPlan
    from .budget import Split
    from .preemption import Preempt

PROJECT = "metroline"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- decisions: firstresult (the first answer that is not None wins) ----------------------------


@hookspec(firstresult=True)
def admission(ctx: StepContext) -> Iterable[Sequence] | None:
    """Which waiting (and swapped) sequences to try to admit this step, in which order.

    Returns:
        An iterable of WAITING or SWAPPED sequences, most deserving first (ideally a lazy
        generator: the scheduler pulls one at a time and stops once slots or budget run out), or
        `Candidates(iterable, head_of_line=...)`: with head-of-line (the default, and what a plain
        iterable means) a candidate that does not fit in the free KV blocks stops admission for
        the step; otherwise it is skipped. Stale candidates (running, finished) are skipped. A
        wrapper holds candidates back with `Candidates.filter` (later ones may pass) or
        `Candidates.gate` (a refusal blocks, under head-of-line).

    Called once per step, after the running sequences were served, when requests wait or are
    swapped. The scheduler pulls at most `2 * (waiting + swapped + running) + 8` candidates (a
    request preempted in the step may come back once); more (an endless generator) is invalid.
    While it pulls, `select_victim` and `on_preempted` may run between two candidates.

    The core's rescue (the one case where it overrides the plugins): when a step schedules
    nothing although the plugins asked for something (a request is running, or admission yielded
    a waiting or swapped candidate) and no plugin asked to be woken up later (`ctx.wake_at`), the
    core serves the oldest unfinished request itself, as fcfs would (`core/rescue.py`). An
    admission that yields nothing while nothing runs is the plugin's choice: the engine then stops
    with `NoProgressError` after `max_idle_steps` empty steps.
    """


@hookspec(firstresult=True)
def select_victim(ctx: StepContext, requester: Sequence, reason: str) -> Sequence | Preempt | None:
    """Which running sequence to preempt so that `requester` can go on, and how.

    Args:
        requester: a running sequence that needs a KV block for its next tokens, or a waiting or
            swapped candidate of `admission`.
        reason: `"blocks"` (no KV block is free) or `"slots"` (a candidate, and `max_num_seqs`
            sequences run).

    Returns:
        A running sequence (preempted with the configured mode; it may be the requester), a
        `Preempt(seq, mode)` (`"recompute"` or `"swap"`), or None: a running requester then
        preempts itself, a candidate stays where it is. A victim that is not running is invalid.

    Called while blocks or slots are missing, once per victim, so several times in a step; a
    candidate's refusals are bounded per step whatever the queue's length: once the policy
    declined a candidate that needed `k` blocks, a later one of the step is asked only when it
    needs fewer, and after `REFUSALS_PER_STEP` (4) refusals none is (`core/victim_loop.py`). A
    `"slots"` refusal ends the step's admission.

    The progress rule (the core's): a request preempted twice in a row without computing past
    the most tokens it had ever computed is protected until it does (`ctx.is_protected(seq)`);
    it is never displaced for a younger requester (the core substitutes the youngest running
    request it may displace, else the requester yields; `core/preemption.py`). vLLM's schedules
    are unchanged, and with the rescue every request finishes when the oldest one fits alone.
    """


@hookspec(firstresult=True)
def split_budget(
    ctx: StepContext, budget: int, num_decoding: int, num_prefilling: int, num_waiting: int
) -> Split | None:
    """How this step's token budget is split between decodes, prefill chunks and tenants.

    Args:
        budget: `max_num_batched_tokens`.
        num_decoding: running and swapped sequences that need one decode token.
        num_prefilling: running and swapped sequences in the middle of a prefill.
        num_waiting: waiting sequences.

    Returns:
        `Split(decode, prefill, max_chunk, max_prefills=None, shares=None)`: at most `decode`
        decode and `prefill` prefill tokens, no chunk longer than `max_chunk`, at most
        `max_prefills` sequences with a prefill chunk (None: no cap), and `shares`: tenant ->
        fraction of each part reserved for that tenant's sequences, served first; what a tenant
        leaves unused goes to the others in the step (`core/shares.py`). Invalid: `decode +
        prefill` above `budget`, a negative field, `max_chunk < 1`, a share outside [0, 1] or
        shares summing over 1.

    Called once per step, before anything is scheduled.
    """


@hookspec(firstresult=True)
def order_running(ctx: StepContext, running: list[Sequence]) -> Iterable[Sequence] | None:
    """The order in which running sequences are served this step.

    Returns:
        An iterable over (a permutation or subset of) `running` (in admission order); sequences
        left out get no tokens this step. It matters when the shares cannot serve every running
        sequence, and for preemption (one served later may become a victim).

    Called once per step, when sequences run, after `split_budget`.
    """


@hookspec(firstresult=True)
def num_draft_tokens(ctx: StepContext, decodes: list[Sequence], max_drafts: int) -> list[int] | None:
    """How many draft tokens each running decode carries this step (speculative decoding).

    Args:
        decodes: the running sequences that decode (only their newest token lacks KV), in
            admission order. `seq.num_draft_tokens` and `seq.num_accepted_tokens` say how its
            drafts fared so far.
        max_drafts: `speculative_config.num_speculative_tokens`, the most one decode may carry.

    Returns:
        One int in `[0, max_drafts]` per decode (0: no drafts). A decode with `k` drafts is
        scheduled `1 + k` tokens, charged to the decode share (the drafts' tokens are moved there
        from the prefill share), and advances by its accepted drafts plus one; the scheduler may
        give it fewer (the budget left, `max_new_tokens`, `max_model_len`, or blocks too few for
        them: drafts never preempt). The default gives every decode `max_drafts`; the shipped
        `adaptive_speculation` fewer as the batch grows and as a request's drafts fail.

    Called once per step when `speculative_config` is set and sequences decode, after
    `split_budget`.
    """


@hookspec(firstresult=True)
def sample(ctx: StepContext, seqs: list[Sequence], logits: Any, eos_token_id: int | None) -> list[int] | None:
    """The next token of each sequence in `seqs`, from its row of `logits`.

    Args:
        seqs: every sequence that reached the end of its known tokens, in the order of
            `StepPlan.sample_seqs`, then the samples forked in the step (each with a copy of its
            parent's row); `seq.token_ids` holds prompt and output so far.
        logits: one row per sequence: a torch tensor `[len(seqs), vocab_size]` with a real
            executor (raw model output), None in simulation. Do not modify it in place, with one
            exception: a wrapper may mask rows before it yields (set the logits of tokens a
            sequence may not take to -inf), so that the implementations below sample from the
            masked rows; the logprobs the engine records afterwards are then those of the masked
            rows. That is how a structured output's grammar constrains its sequence
            (`plugins_contrib/structured_output.py`).
        eos_token_id: the model's end-of-sequence token (None when unknown).

    Returns:
        One int token id in `[0, vocab_size)` per sequence; another length is invalid. The
        default (`core/requests/sampling.py`) applies each sequence's `SamplingParams`; a wrapper
        may adjust its tokens. The engine then checks the stop conditions. A sequence that cannot
        go on (its grammar reached an error state) is ended by `ctx.fail(seq, reason)` during the
        call: its token is dropped and it ends as failed, while an exception fails every
        sequence of the step.

    Called once per step that has sequences to sample, after the executor ran; under speculative
    decoding once more for each position of accepted drafts, with the sequences whose last token
    equalled their draft and the rows that follow it (`seq.token_ids` holds the tokens accepted
    so far, so a sequence sees what it would see without speculation).
    """


@hookspec(firstresult=True)
def estimate_output_tokens(ctx: StepContext, seq: Sequence) -> int | None:
    """An estimate of how many output tokens `seq` will generate in all.

    Returns:
        An int >= 0, or None to let the next plugin answer.

    Called only when a plugin asks (`ctx.hook.estimate_output_tokens(ctx=ctx, seq=seq)`, as `srpt`
    does for a request without an `expected_output_tokens` hint), from its own hooks.
    """


# --- at the edge: once per request, outside the step ------------------------------------------


@hookspec
def check_request(ctx: StepContext, seq: Sequence) -> str | None:
    """Why `seq` (a new request's `Sequence`, not yet waiting) could never run under this
    plugin's limits (a tenant's running cap below the request's `sampling.n`, ...), or None.

    Returns:
        A one-line reason: the request is refused (`RequestRefused`; `rejected` in a replay)
        instead of waiting for ever. Anything else than a string or None is a `PluginError`.

    Called by `Engine.add_request`, once per request, on each plugin (newest first) until one
    gives a reason, which is reported prefixed with the plugin's name.
    """


# --- the cluster: once per request, before any replica sees it ---------------------------------


@hookspec(firstresult=True)
def route(request: RouteRequest, replicas: tuple[ReplicaView, ...]) -> int | str | Refuse | None:
    """Which replica of a cluster serves `request` (`core/cluster/`).

    Args:
        request: the arriving request (`RouteRequest`: `request_id`, `arrival_s`,
            `prompt_token_ids`, `prompt_len`, `max_new_tokens`, `tenant`, `priority`).
        replicas: a read-only view of each replica the request may go to (`ReplicaView`): every
            live replica, except that in a pool with a canary only the replicas of the
            request's arm (`core/cluster/targets.py`); `index` is the view's place in this tuple.
            Each has `name`, `pool`, `policy`, `num_waiting`, `num_running`, `kv_used_blocks`,
            `kv_free_blocks`, `outstanding_requests`, `outstanding_tokens` (prompt plus
            `max_new_tokens` of the requests routed there that have not ended) and
            `prefix_hit(request)`, the prompt tokens its prefix cache would serve (computed when
            asked). The views read the replicas' live state: keep none across calls.

    Returns:
        A replica index (an int in `[0, len(replicas))`), a replica name, or `Refuse(reason)`: the
        request is refused (`rejected` in a replay, with the reason prefixed by the plugin's name).
        Anything else (an index out of range, an unknown name, a bool, a float) is a `PluginError`
        naming the plugin and the hook `route`, as is an exception the plugin raises.

    Called by the cluster, once per request, at its arrival (on the cluster's virtual clock in
    simulation), before any replica sees it; never inside a step. Its plugins are the cluster's
    router (`--router NAME`), not a replica's policy stack. The shipped routers
    (`core/plugins/loader.py`, `ROUTERS`): `round_robin` (the default), `least_outstanding_tokens`,
    `power_of_two`, `prefix_aware` and `length_pools`.
    """


# --- observers: state for policies; return values are ignored -----------------------------------


@hookspec
def on_arrival(ctx: StepContext, seqs: list[Sequence]) -> None:
    """Sequences that joined the waiting queue (new requests) since the last step.

    Called once per step, first thing in `Scheduler.schedule`, when there are any: a request
    arrives at the next step (one with a future `arrival_time`, at the first step that starts at or
    after it). The samples of an `n > 1` request never arrive: `on_admitted` reports them.
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


DECISION_HOOKS = (
    "admission", "select_victim", "split_budget", "order_running", "num_draft_tokens", "sample", "estimate_output_tokens",
)
OBSERVER_HOOKS = ("on_arrival", "on_admitted", "on_preempted", "on_tokens", "on_finished", "on_step_end")
EDGE_HOOKS = ("check_request",)
ROUTING_HOOKS = ("route",)
"""Hooks of a cluster's router, called outside any engine (`core/cluster/`)."""


def _step_protocol(doc: str) -> tuple[tuple[tuple[str, ...], str], ...]:
    """The step protocol's lines of the module docstring (see `STEP_PROTOCOL`)."""
    block = doc.split("tests/test_hook_order.py)::", 1)[1].split("\n\n", 2)[1]
    steps = []
    for line in block.splitlines():
        token = line.split()[0]
        repeat = token[-1] if token[-1] in "?*" else ""
        steps.append((tuple(token.rstrip("?*").strip("()").split("|")), repeat))
    return tuple(steps)


STEP_PROTOCOL = _step_protocol(__doc__) if __doc__ else ()  # no docstrings under python -OO
"""The module docstring's step protocol: `(hooks, repeat)` per line; `repeat` is `""` (once), `"?"`
or `"*"`."""
