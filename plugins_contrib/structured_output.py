"""Structured output: a request's output held to a JSON schema (or to any JSON object) by a grammar
on the model's real logits, as a `sample` wrapper around whatever sampler is below it.

A request asks with `SamplingParams.structured_output` (`StructuredOutput(json_schema=...)` or
`StructuredOutput(json_object=True)`; the server fills it from OpenAI's `response_format`). The
grammar is compiled by llguidance (`pip install llguidance`, in the `torch` extra) from the schema,
once per schema (an LRU cache), and checked when the request is submitted: a schema llguidance
cannot compile (an invalid `type`, an unclosed regex, an unsatisfiable bound, a keyword it does not
implement such as `contains`) refuses the request (`check_request`) instead of running it.

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
from collections import OrderedDict
from typing import Any

from ..api import Sequence, StepContext, hookimpl
from .logit_masks import bias_of

GRAMMAR_CACHE_SIZE = 256
"""Compiled grammars kept (least recently used dropped first); one per distinct schema."""

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
        self._grammars: OrderedDict[tuple[str, bool], tuple[str | None, str | None]] = OrderedDict()
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
        `unavailable()`, or the schema does not compile (llguidance's message). Compiles it once
        (cached), so the first step of the request finds it ready."""
        return self._grammar(spec)[1]

    @hookimpl
    def check_request(self, seq: Sequence) -> str | None:
        spec = seq.sampling.structured_output
        if spec is None:
            return None
        unavailable = self.unavailable()
        if unavailable is not None:
            return f"sampling.structured_output: {unavailable}"
        problem = self.problem(spec)
        if problem is None:
            return None
        field = "json_schema" if spec.json_schema is not None else "json_object"
        return f"sampling.structured_output.{field}: {problem}"

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

    def _grammar(self, spec: Any) -> tuple[str | None, str | None]:
        """(grammar, None) or (None, problem) for `spec`, compiled once."""
        text = spec.json_schema if spec.json_schema is not None else ANY_JSON_OBJECT
        key = (text, self.whitespace_flexible)
        with self._lock:
            cached = self._grammars.get(key)
            if cached is not None:
                self._grammars.move_to_end(key)
                return cached
            problem = self._setup()
            if problem is not None:
                return None, problem
            from llguidance import LLMatcher

            try:
                grammar = LLMatcher.grammar_from_json_schema(
                    text, defaults={"whitespace_flexible": self.whitespace_flexible})
                is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self._ll_tokenizer)
            except Exception as exc:
                is_error, messages = True, [str(exc)]
            entry = (None, _one_line(messages[0] if messages else "invalid")) if is_error else (grammar, None)
            self._grammars[key] = entry
            if len(self._grammars) > GRAMMAR_CACHE_SIZE:
                self._grammars.popitem(last=False)
            return entry

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
                    m.error = f"the grammar failed: {_one_line(m.matcher.get_error())}"
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
        grammar, problem = self._grammar(seq.sampling.structured_output)
        if grammar is None:
            return _Matcher(None, f"the grammar cannot be used: {problem}")
        from llguidance import LLMatcher

        matcher = LLMatcher(self._ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            return _Matcher(None, f"the grammar cannot be used: {_one_line(matcher.get_error())}")
        return _Matcher(matcher, None)

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
                self.error = f"token {new[-1]} broke the grammar: {_one_line(self.matcher.get_error())}"
        return self.error


def _eos_banned(seq: Sequence) -> bool:
    """Whether `min_tokens` forbids `seq` its EOS now (the default sampler's rule)."""
    p = seq.sampling
    return bool(p.min_tokens) and seq.num_output_tokens < p.min_tokens


def _one_line(message: str) -> str:
    return " ".join(str(message).split())
