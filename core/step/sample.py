"""The sample phase of the step: `sample` turns the step's logits into tokens, which are appended
(stop checks, outputs) and told to the `on_tokens` observers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..plugins.answers import token_problem, tokens_problem
from ..requests.logit_masks import LogitMasks
from ..requests.logprobs import record_logprobs
from ..requests.sequence import FinishReason, Sequence
from .forking import with_rows
from .outputs import RequestOutput

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager
    from .outputs import Appender
    from .plan import StepPlan, StepResult
    from .scheduler import Scheduler


class SamplePhase:
    """Sampling with `plugins`' `sample` hook, appending with `appender`; a sequence a `sample`
    implementation fails (`ctx.fail`) is ended through `scheduler`. `eos_token_id` and
    `vocab_size` (None: unknown) are the model's; the hook runs inside `sample_mode()` (the
    executor's: `torch.inference_mode` for the torch executor's inference tensors)."""

    def __init__(
        self, plugins: PluginManager, scheduler: Scheduler, appender: Appender, eos_token_id: int | None,
        vocab_size: int | None, sample_mode: Callable[[], AbstractContextManager[Any]],
    ) -> None:
        self.plugins = plugins
        self.scheduler = scheduler
        self.appender = appender
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size
        self.sample_mode = sample_mode
        self.failures: list[tuple[Sequence, str]] = []  # `ctx.fail` during the step's sample hook

    def __call__(self, plan: StepPlan, logits: Any, now: float, outputs: list[RequestOutput] | None,
                 result: StepResult | None = None) -> None:
        """Sample the next token of the plan's `sample_seqs` and this step's forks (from their
        parents' rows), record logprobs asked for, append the tokens, check the stop conditions,
        stream. With drafts in the plan, `result`'s drafts are verified then
        (`metroline.core.step.speculation`)."""
        seqs = plan.sample_seqs
        if plan.forked:
            seqs, logits = seqs + plan.forked, with_rows(logits, plan.fork_rows)
        if not seqs:
            return
        seqs = self.draw(seqs, logits, now, outputs)
        speculation = self.scheduler.speculation
        if speculation is not None and result is not None:
            more = speculation.after_step(plan, result, lambda s, rows: self.draw(s, rows, now, outputs),
                                          self.scheduler.pool, self.scheduler.config.enable_prefix_caching)
            if more:
                seqs = list(dict.fromkeys(seqs + more))
        hook = self.plugins.hook
        if hook.on_tokens.get_hookimpls():
            hook.on_tokens(ctx=self.scheduler.ctx, seqs=seqs)

    def draw(self, seqs: list[Sequence], logits: Any, now: float, outputs: list[RequestOutput] | None) -> list[Sequence]:
        """One token for each of `seqs` from its row of `logits` (the `sample` hook), its
        logprobs, appended and checked for stops; returns the sequences that got it (not failed
        by `ctx.fail`)."""
        hook, ctx = self.plugins.hook, self.scheduler.ctx
        ctx._failures = failures = self.failures  # what `ctx.fail` asks for during the hook
        ctx._masks = masks = LogitMasks(seqs)  # what `ctx.ban_tokens` & co. ask for
        try:
            with self.sample_mode():
                tokens = hook.sample(ctx=ctx, seqs=seqs, logits=logits, eos_token_id=self.eos_token_id)
        except BaseException:
            failures.clear()  # the step fails as a whole: nothing is left for the next one
            raise
        finally:
            ctx._failures = ctx._masks = None
        problem = tokens_problem(tokens, len(seqs), self.vocab_size)
        if problem is not None and isinstance(tokens, list) and len(tokens) == len(seqs):
            tokens = self._fail_bad_rows(seqs, tokens)  # each bad token is its own request's error
            problem = None
        if problem is None and masks:
            logits = masks.apply(logits)
            problem = masks.violation(tokens, logits, {s for s, _ in failures})
        if problem is not None:
            failures.clear()
            raise self.plugins.invalid("sample", problem)
        # a failed row's token is dropped: no logprob is recorded for it
        record_logprobs(seqs, logits, tokens, ctx.config.deterministic, {s for s, _ in failures})
        if failures:
            seqs, tokens = self._fail_sampled(seqs, tokens, now, outputs)
        self.appender.append(seqs, tokens, now, outputs)
        return seqs

    def _fail_bad_rows(self, seqs: list[Sequence], tokens: list[Any]) -> list[int]:
        """`tokens` of the right length with rows that are not token ids: each such row's sequence
        is failed (as `ctx.fail` does) with a `PluginError` of its request (raised by the engine
        once the step is done); returns the tokens with those rows set to 0 (dropped later)."""
        kept = list(tokens)
        for i, (seq, token) in enumerate(zip(seqs, tokens)):
            problem = token_problem(token, self.vocab_size)
            if problem is not None:
                error = self.plugins.invalid("sample", problem).for_request(seq.request_id)
                self.failures.append((seq, f"PluginError: {error}"))
                self.scheduler.request_errors.append(error)
                kept[i] = 0
        return kept

    def _fail_sampled(
        self, seqs: list[Sequence], tokens: list[int], now: float, outputs: list[RequestOutput] | None
    ) -> tuple[list[Sequence], list[int]]:
        """End the sequences a `sample` implementation failed (`ctx.fail`) without their tokens;
        returns the others and their tokens. Their blocks are freed at the step's reap."""
        failed = {seq: error for seq, error in self.failures if any(s is seq for s in seqs)}
        self.failures.clear()
        for seq, error in failed.items():
            self.scheduler.finish(seq, FinishReason.FAILED, now, error)
        if outputs is not None and failed:
            outputs.extend(RequestOutput(s, [], True) for s in failed)
        kept = [i for i, seq in enumerate(seqs) if seq not in failed]
        return [seqs[i] for i in kept], [tokens[i] for i in kept]
