"""The decision hooks (firstresult: the first answer that is not None wins): who is admitted, who is
preempted, how the budget is split, the order of the running, the next tokens, a length estimate.
Their contract, shared by every hook, is `metroline.core.plugins.hookspecs`'s docstring."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .markers import hookspec

if TYPE_CHECKING:
    from ..requests.sequence import Sequence
    from ..step.context import StepContext
    from .budget import Split
    from .preemption import Preempt


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
    core serves the oldest unfinished request itself, as fcfs would (`metroline.core.step.rescue`). An
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
    needs fewer, and after `REFUSALS_PER_STEP` (4) refusals none is (`metroline.core.step.victim_loop`). A
    `"slots"` refusal ends the step's admission.

    The progress rule (the core's): a request preempted twice in a row without computing past
    the most tokens it had ever computed is protected until it does (`ctx.is_protected(seq)`);
    it is never displaced for a younger requester (the core substitutes the youngest running
    request it may displace, else the requester yields; `metroline.core.plugins.preemption`). With the
    rescue every request finishes when the oldest one fits alone. `EngineConfig.protect_stalled =
    false` (the vllm preset: vLLM has no such rule, and its own victims cannot livelock) turns it off.
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
        leaves unused goes to the others in the step (`metroline.core.step.reserves`). Invalid: `decode +
        prefill` above `budget`, a negative field, `max_chunk < 1`, a share outside [0, 1] or
        shares summing over 1.

    Called once per step, before anything is scheduled.
    """


@hookspec(firstresult=True)
def order_running(ctx: StepContext, running: list[Sequence]) -> Iterable[Sequence] | None:
    """The order in which running sequences are served this step.

    Returns:
        An iterable over (a permutation or subset of) `running` (in admission order); sequences
        left out get no tokens this step. A sequence that is not in `running`, or one listed
        twice, is a `PluginError`. It matters when the shares cannot serve every running
        sequence, and for preemption (one served later may become a victim).

    Called once per step, when sequences run, after `split_budget`.
    """


@hookspec(firstresult=True)
def num_draft_tokens(ctx: StepContext, decodes: list[Sequence], max_drafts: int) -> list[int] | None:
    """How many draft tokens each running decode carries this step (speculative decoding).

    Args:
        decodes: the running sequences that decode (only their newest token lacks KV), in
            admission order; under `EngineConfig.speculative_scheduling = "vllm"` only those
            that sampled a token since they were last preempted (vLLM drafts after a step that
            sampled). `seq.num_draft_tokens`, `seq.num_accepted_tokens` and
            `seq.num_draft_rejections` say how its drafts fared so far.
        max_drafts: `speculative_config.num_speculative_tokens`, the most one decode may carry.

    Returns:
        One int in `[0, max_drafts]` per decode (0: no drafts). A decode with `k` drafts is
        scheduled `1 + k` tokens, charged to the decode share (the drafts' tokens are moved there
        from the prefill share; under `EngineConfig.budget_mode = "one"` they come from the one
        budget, in serving order), and advances by its accepted drafts plus one; the scheduler
        may give it fewer (the budget left, `max_new_tokens`, `max_model_len`, or blocks too few
        for them: drafts never preempt; under `speculative_scheduling = "vllm"` the chunk cap
        and the budget left, and drafts preempt as any tokens do). The default gives every decode `max_drafts`; the shipped
        `adaptive_speculation` those that minimise the step's seconds per token under a cost
        model, from each request's measured acceptance (fewer as the batch grows and as a
        request's drafts fail).

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
            executor (raw model output), None in simulation. To mask or bias it, a wrapper
            registers the change on the context before it yields: `ctx.ban_tokens(seq, ids)`,
            `ctx.bias_tokens(seq, {id: bias})`, `ctx.add_logits_bias(rows, bias)`; the
            implementations below then choose from `ctx.adjusted_logits(logits)` (the default
            sampler does; in simulation its stand-in tokens skip banned ones), the logprobs the
            engine records are those of the adjusted rows, and an answer that picks a banned
            token is a `PluginError`. The same code runs on every executor; that is how a
            structured output's grammar constrains its sequence
            (`metroline.plugins_contrib.structured_output`). Modifying `logits` in place still
            works on the torch executor (the hook runs under its `sample_mode`,
            `torch.inference_mode`) but not in simulation.
        eos_token_id: the model's end-of-sequence token (None when unknown).

    Returns:
        One int token id in `[0, vocab_size)` per sequence; another length is invalid. The
        default (`core/requests/sampling.py`) applies each sequence's `SamplingParams`; a wrapper
        may adjust its tokens. The engine then checks the stop conditions. A sequence that cannot
        go on (its grammar reached an error state) is ended by `ctx.fail(seq, reason)` during the
        call: its token is dropped and it ends as failed. A row whose answer is no token id (not
        an int, or outside the vocabulary) fails that row's request alone, as a `PluginError`
        naming it; an exception, or a list of the wrong length, fails every sequence of the step.

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
