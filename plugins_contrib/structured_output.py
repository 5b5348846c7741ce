"""Structured output: a request's output held to a JSON schema (or to any JSON object) by a grammar
on the model's real logits, as a `sample` wrapper around whatever sampler is below it.

A request asks with `SamplingParams.structured_output` (`StructuredOutput(json_schema=...)` or
`StructuredOutput(json_object=True)`; the server fills it from OpenAI's `response_format`). The
grammar is compiled by llguidance (`pip install llguidance`, in the `torch` extra) from the schema,
once per schema (an LRU cache), off the step and off the event loop
(`metroline.plugins_contrib.grammar_compiler.GrammarCompiler`, a thread pool): submitting the
request starts the compile, and the request waits outside the batch until it is done (the
plugin's `admission` wrapper passes it over and asks to be woken up, vLLM's `WAITING_FOR_FSM`), so
a big schema stalls no other stream. A schema llguidance cannot compile (an invalid `type`, an
unclosed regex, an unsatisfiable bound, a keyword it does not implement such as `contains`)
refuses the request at submission (`check_request`) when its compile is already done (the server
compiles it first, off its loop: `problem`), else fails that request alone at its first step, with
the same message naming the field; it frees what it held and the others go on.

Each step, for the sequences with a grammar (each sample of an `n > 1` request has its own
matcher):

1. the matcher catches up with the sequence's output tokens (it follows `seq.token_ids`, so a
   request preempted and recomputed, or a token a wrapper above changed, never advances it twice
   or out of step);
2. every matcher writes its allowed tokens into one bitmask tensor (llguidance fills the rows in
   parallel, outside the interpreter lock), turned into one bias that the wrapper registers with
   `ctx.add_logits_bias` (forbidden tokens get -inf; EOS is allowed only where the grammar is
   complete, and is then the only token allowed once nothing else can follow): the engine adds it
   to those rows in one batched operation, on a copy of the logits;
3. the samplers below choose from `ctx.adjusted_logits(logits)` (temperature, top-p, penalties,
   seeds apply to the masked rows);
4. a chosen token the mask forbids (a `min_tokens` that bans the EOS a complete grammar needs, a
   sampler below that ignored the mask) fails that request (`ctx.fail`) with the reason, as does a
   matcher in an error state; the other requests go on.

Requests without a grammar are untouched, and a step without any costs one scan of the batch.
Logprobs of a structured request are those of its masked rows (tokens the grammar forbids are
impossible), as vLLM's.

The torch executor brings this plugin (`TorchExecutor.plugins()`), built with the model's
tokenizer, vocabulary size and EOS token; an engine on the simulated executor has no logits and
refuses structured requests. Options (constructor arguments): `whitespace_flexible` (default
True, as vLLM's: JSON may hold whitespace between tokens; False: compact JSON); a schema's own
`"x-guidance"` key (llguidance's JSON options, e.g. `{"whitespace_flexible": false}`) overrides it
for that schema.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from ..api import Candidates, Sequence, StepContext, hookimpl
from .grammar_compiler import GRAMMAR_CACHE_SIZE, Compiled, GrammarCompiler, one_line
from .logit_masks import bias_of

__all__ = ["ANY_JSON_OBJECT", "GRAMMAR_CACHE_SIZE", "StructuredOutputSampler"]

MAX_COMPILE_POLL_S = 0.05
"""The longest a step that admitted nothing waits before it looks again at a grammar still
compiling (the wait doubles from 1 ms with the compile's age, up to this)."""

ANY_JSON_OBJECT = '{"type": "object"}'
"""The schema of `json_object` (what vLLM compiles for OpenAI's `{"type": "json_object"}`)."""


class StructuredOutputSampler:
    """Masks the logits of every sequence with a `structured_output` to what its grammar allows,
    lets the samplers below choose, and fails a request whose grammar cannot go on.

    `tokenizer`: the model's (fast) Hugging Face tokenizer; `vocab_size`: the logits' width;
    `eos_token_id`: the token that ends a sequence (a complete grammar allows it). Without a
    tokenizer or an EOS token, structured requests are refused. `whitespace_flexible`: see the
    module docstring. `threads`: llguidance's threads for the batch's masks (default: up to 4).
    """

    name = "structured_output"

    def __init__(
        self, tokenizer: Any = None, vocab_size: int | None = None, eos_token_id: int | None = None, *,
        whitespace_flexible: bool = True, threads: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.whitespace_flexible = whitespace_flexible
        self.threads = threads or max(1, min(4, os.cpu_count() or 1))
        self._lock = threading.Lock()  # submissions (the server's loop) and steps (a worker thread)
        self._ll_tokenizer: Any = None
        self._setup_problem: str | None = None
        self._executor: Any = None
        self.compiler = GrammarCompiler(lambda: self._ll_tokenizer, whitespace_flexible)
        self._matchers: dict[Sequence, _Matcher] = {}

    # --- at submission ---------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why this plugin cannot constrain any output on this engine (no tokenizer, no EOS token,
        no llguidance, a tokenizer llguidance cannot read), or None. The first call builds
        llguidance's view of the tokenizer (about a second)."""
        with self._lock:
            return self._setup()

    def problem(self, spec: Any) -> str | None:
        """Why the grammar of `spec` (a `StructuredOutput`) cannot be used, or None: the plugin is
        `unavailable()`, or the schema does not compile (llguidance's message). Waits for the
        compile (cached: the request's admission finds it ready), so call it off the event loop."""
        unavailable = self.unavailable()
        return unavailable if unavailable is not None else self.compile(spec).result()[1]

    def compile(self, spec: Any) -> Future[Compiled]:
        """The future of the compile of `spec`'s grammar (started now unless cached); the plugin
        must be available (`unavailable()` is None)."""
        return self.compiler.submit(spec.json_schema if spec.json_schema is not None else ANY_JSON_OBJECT)

    @hookimpl
    def check_request(self, seq: Sequence) -> str | None:
        spec = seq.sampling.structured_output
        if spec is None:
            return None
        unavailable = self.unavailable()
        if unavailable is not None:
            return f"sampling.structured_output: {unavailable}"
        future = self.compile(spec)
        if not future.done():
            return None  # compiling: the request waits outside the batch (`admission`)
        problem = future.result()[1]
        return None if problem is None else self._naming(spec, problem)

    @staticmethod
    def _naming(spec: Any, problem: str) -> str:
        field = "json_schema" if spec.json_schema is not None else "json_object"
        return f"sampling.structured_output.{field}: {problem}"

    @hookimpl(wrapper=True)
    def admission(self, ctx: StepContext) -> Iterable[Sequence] | None:
        answer = yield
        if answer is None or not self.compiler.compiling():
            return answer
        return Candidates.of(answer).filter(lambda seq: self._grammar_ready(ctx, seq))

    def _grammar_ready(self, ctx: StepContext, seq: Sequence) -> bool:
        """Whether `seq` may be admitted: it has no grammar, or its grammar is compiled; else it
        waits, and the step asks to be woken up (sooner for a young compile)."""
        spec = seq.sampling.structured_output
        if spec is None or self._setup_problem is not None:
            return True
        future = self.compile(spec)
        if future.done():
            return True
        age = time.monotonic() - future.started  # type: ignore[attr-defined]
        ctx.wake_at(ctx.now + min(max(age, 0.001), MAX_COMPILE_POLL_S))
        return False

    def _setup(self) -> str | None:
        """Build llguidance's view of the tokenizer (once; under the lock); a problem or None."""
        if self._ll_tokenizer is not None or self._setup_problem is not None:
            return self._setup_problem
        if self.tokenizer is None:
            self._setup_problem = "structured outputs need the model's tokenizer; this executor has none"
        elif self.eos_token_id is None:
            self._setup_problem = "structured outputs need an EOS token to end on; this model has none"
        else:
            try:
                import llguidance.hf
            except ImportError:
                self._setup_problem = "structured outputs need llguidance: pip install llguidance"
                return self._setup_problem
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_id)
            except Exception as exc:  # a slow tokenizer, a vocabulary llguidance cannot read
                self._setup_problem = f"llguidance cannot use this model's tokenizer: {exc}"
        return self._setup_problem

    # --- in the step -----------------------------------------------------------------------------

    @hookimpl(wrapper=True)
    def sample(self, ctx: StepContext, seqs: list[Sequence], logits: Any):
        rows = [i for i, s in enumerate(seqs) if s.sampling.structured_output is not None]
        if not rows:
            return (yield)
        problem = None
        if not hasattr(logits, "masked_fill_"):  # no logits tensor: nothing to constrain
            problem = "a structured output needs the model's logits (a tensor)"
        elif self._ll_tokenizer is not None and logits.shape[1] != self._ll_tokenizer.vocab_size:
            problem = (f"the logits have {logits.shape[1]} columns and the grammar's vocabulary "
                       f"{self._ll_tokenizer.vocab_size} tokens (give the plugin the model's vocab_size)")
        if problem is not None:
            for i in rows:
                ctx.fail(seqs[i], f"structured_output: {problem}")
            return (yield)
        import torch

        live: list[int] = []  # the rows with a matcher that can go on
        matchers: list[_Matcher] = []
        for i in rows:
            seq = seqs[i]
            m = self._matchers.get(seq)
            if m is None:
                m = self._matchers[seq] = self._new_matcher(seq)
            error = m.catch_up(seq) if m.error is None else m.error
            if error is None and m.matcher.is_stopped() and _eos_banned(seq):
                error = m.error = (
                    f"the grammar is complete after {seq.num_output_tokens} output tokens and allows only EOS, "
                    f"which min_tokens={seq.sampling.min_tokens} forbids until then")
            if error is not None:
                ctx.fail(seq, f"structured_output: {error}")
                continue
            live.append(i)
            matchers.append(m)
        bitmask = None
        if live:
            vocab = logits.shape[1]
            bitmask = torch.full((len(live), (vocab + 31) // 32), -1, dtype=torch.int32)
            self._fill(matchers, bitmask)
            for i, m in zip(live, matchers):
                if m.matcher.is_error():  # the mask's computation ran out of its limits
                    m.error = f"the grammar failed: {one_line(m.matcher.get_error())}"
                    ctx.fail(seqs[i], f"structured_output: {m.error}")
            ctx.add_logits_bias(live, bias_of(bitmask, logits))
        tokens = yield
        if bitmask is None or not isinstance(tokens, list) or len(tokens) != len(seqs):
            return tokens  # the engine reports a malformed answer
        words = bitmask.numpy()
        for j, i in enumerate(live):
            tok = tokens[i]
            if type(tok) is int and 0 <= tok < words.shape[1] * 32 and not (int(words[j, tok >> 5]) >> (tok & 31)) & 1:
                m = matchers[j]
                if m.error is None:
                    m.error = f"the sampler chose token {tok}, which the grammar does not allow here"
                    ctx.fail(seqs[i], f"structured_output: {m.error}")
        return tokens

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        matchers = self._matchers
        if matchers:
            for seq in seqs:
                matchers.pop(seq, None)

    def _new_matcher(self, seq: Sequence) -> _Matcher:
        """A copy of the compiled matcher of `seq`'s grammar (its admission waited for the compile;
        a sequence admitted without that gate waits here), or the reason it cannot be used."""
        spec = seq.sampling.structured_output
        if self._setup_problem is not None:
            return _Matcher(None, self._setup_problem)
        template, problem = self.compile(spec).result()
        if template is None:
            return _Matcher(None, f"the grammar cannot be used: {self._naming(spec, problem)}")
        return _Matcher(template.deep_copy(), None)

    def _fill(self, matchers: list[_Matcher], bitmask: Any) -> None:
        """Each matcher's allowed tokens into its row of `bitmask` (int32, contiguous, on the
        CPU), written by llguidance straight into the tensor's memory (as `llguidance.torch`'s
        helpers do, without importing them: that module compiles a kernel at import, seconds)."""
        row_bytes = bitmask.shape[1] * 4
        ptr = bitmask.data_ptr()
        if len(matchers) == 1 or self.threads == 1:
            for j, m in enumerate(matchers):
                m.matcher.unsafe_compute_mask_ptr(ptr + j * row_bytes, row_bytes)
            return
        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(self.threads)
        self._executor.unsafe_compute_mask_ptr(
            [(m.matcher, j) for j, m in enumerate(matchers)], ptr, row_bytes, len(matchers))


class _Matcher:
    """One sequence's llguidance matcher, the number of its output tokens it has consumed, and the
    error that ended it (None while it can go on)."""

    __slots__ = ("matcher", "consumed", "error")

    def __init__(self, matcher: Any, error: str | None) -> None:
        self.matcher = matcher
        self.consumed = 0
        self.error = error

    def catch_up(self, seq: Sequence) -> str | None:
        """Consume the output tokens of `seq` this matcher has not seen yet; an error or None."""
        start = seq.num_prompt_tokens + self.consumed
        new = seq.token_ids[start:]
        if new:
            self.consumed += len(new)
            if not self.matcher.consume_tokens(new):
                self.error = f"token {new[-1]} broke the grammar: {one_line(self.matcher.get_error())}"
        return self.error


def _eos_banned(seq: Sequence) -> bool:
    """Whether `min_tokens` forbids `seq` its EOS now (the default sampler's rule)."""
    p = seq.sampling
    return bool(p.min_tokens) and seq.num_output_tokens < p.min_tokens
