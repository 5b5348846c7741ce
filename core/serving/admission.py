"""From an HTTP request to validated engine requests, cheapest refusal first and nothing heavy on
the event loop (`Intake.admit`):

1. the API key (401), before a byte of the body is read;
2. the body's size (413, `ServeConfig.max_body_bytes`), before it is read when it says its length;
3. JSON and the OpenAI fields (400 naming the field), parsed and validated in a worker thread;
4. the prompt's length in characters (400), before it is tokenized: no prompt over
   `max_prompt_chars` can fit the context;
5. tokenization in a worker thread, then the length in tokens (`Engine.length_problem`, 400)
   before an engine `Request` (a pydantic model over every token) is built;
6. the `response_format` schema's limits (`schema_limits`), then its grammar compiled in a worker
   thread (400 naming the field), so the request waits outside the batch while it compiles;
7. the plugins' `check_request` (a request that could never run: 400).

A batch of more prompts than `max_waiting` is refused (413) before any is tokenized: it could never
be queued whole. The quota and the queue's own limits (429) are the caller's
(`metroline.core.serving.app`).
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request as HTTPRequest

from ..errors import PluginError
from ..requests.request import STRUCTURED_OUTPUT_PLUGIN, Request, SamplingParams
from ..requests.sequence import Sequence
from ..step.engine import Engine
from . import protocol as p
from .reading import Refused, authorization, check_batch, off_loop, parse_body, read_body, unauthorized
from .schema_limits import schema_problem
from .tenants import ServeConfig, Tenants


def _param_of(exc: ValidationError, chat: bool) -> str:
    """The body field an engine-side validation error is about: a sampling field by its OpenAI
    name, else (a limit on the whole request) `n` or `max_tokens` when its message names them,
    else the prompt."""
    errors = exc.errors()
    loc = errors[0]["loc"] if errors else ()
    if exc.title == "SamplingParams" and loc:
        field = loc[0]
    elif len(loc) > 1 and loc[0] == "sampling":
        field = loc[1]
    else:
        field = None
    if field is not None:
        return "max_tokens" if field == "max_new_tokens" else str(field)
    return _param_of_message(p.describe(exc), chat)


def _param_of_message(msg: str, chat: bool) -> str:
    """The body field a limit's message (`Engine.length_problem`'s) is about."""
    if "sampling.n " in msg:
        return "n"
    if "sampling.structured_output" in msg:
        return "response_format"
    if msg.startswith("ignore_eos: "):
        return "ignore_eos"
    if "max_new_tokens" in msg and "max_model_len" not in msg:
        return "max_tokens"
    return "messages" if chat else "prompt"


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` can stand for (1 for the simulated stand-ins:
    a token per UTF-8 byte); a text of more than `max_model_len` times this cannot fit."""
    tok = getattr(tokenizer, "tok", None)
    vocab = tok.get_vocab() if tok is not None and hasattr(tok, "get_vocab") else None
    return max(map(len, vocab), default=1) if vocab else 1


class Intake:
    """Reads, checks and tokenizes requests for one engine (see the module's steps)."""

    def __init__(self, engine: Engine, serve: ServeConfig, tenants: Tenants, tokenizer: Any) -> None:
        self.engine = engine
        self.serve = serve
        self.tenants = tenants
        self.tokenizer = tokenizer
        self.sim = getattr(engine.executor, "name", "") == "sim"
        self.max_chars = serve.max_prompt_chars or engine.config.max_model_len * longest_token_chars(tokenizer)
        self._checks = engine.plugins.has_impls("check_request")

    async def admit(self, http: HTTPRequest, chat: bool) -> tuple[str, Any, list[Request]]:
        """(tenant, body, engine requests: one per prompt) of an HTTP request, or `Refused`."""
        tenant = self.tenants.identify(authorization(http))
        if tenant is None:
            raise unauthorized()
        try:
            raw = await read_body(http, self.serve.max_body_bytes)
            body = await off_loop(parse_body, raw, chat, size=len(raw))
            del raw
            return tenant, body, await self._requests(tenant, body, chat)
        except Refused as refused:
            refused.tenant = tenant
            raise

    async def _requests(self, tenant: str, body: Any, chat: bool) -> list[Request]:
        if body.model is not None and body.model != self.serve.model:
            raise Refused(404, f"model {body.model!r} does not exist; this server serves {self.serve.model!r}",
                          param="model", code="model_not_found")
        if body.logprobs_k is not None and self.sim:
            raise Refused(400, "logprobs need a model's logits: the simulated executor has none", param="logprobs")
        if body.structured is not None and self.sim:
            raise Refused(400, "response_format: a structured output needs a model's logits: the simulated "
                          "executor has none", param="response_format")
        check_batch(body, chat, self.serve.max_waiting)
        priority, problem = self.tenants.priority(tenant, body.priority)
        if problem:
            raise Refused(429, problem, "rate_limit_error", "priority", reason="priority")
        chars = self._check_chars(body, chat)
        prompts = await off_loop(self._tokenize, body, chat, size=chars)
        requests = await off_loop(self._build_all, body, prompts, tenant, priority, chat,
                                  size=sum(map(len, prompts)) * 4)
        if body.structured is not None:
            await self._check_grammar(body.structured, requests[0])
        if self._checks:
            # a plugin's verdict that it could never run (a tenant cap below its needs): 400 now
            # rather than a failure once queued (Engine.add_request asks the same question)
            for request in requests:
                seq = Sequence.from_request(request, request.arrival_time or 0.0, 0)
                try:
                    reason = self.engine.plugins.refusal(self.engine.scheduler.ctx, seq)
                except PluginError as exc:  # this request's alone (check_request is asked for it)
                    raise Refused(500, f"the engine failed this request: PluginError: {exc}", "server_error",
                                  reason="plugin_error") from None
                if reason is not None:
                    raise Refused(400, f"this request can never run: {reason}", reason="refused")
        return requests

    def _check_chars(self, body: Any, chat: bool) -> int:
        """Refuse (400) a text prompt of more characters than any prompt that fits the context;
        else the characters (token ids count as 4) of all its prompts."""
        if chat:
            texts: list[Any] = [sum(len(m.text()) for m in body.messages)]
        else:
            texts = [len(x) if isinstance(x, str) else 0 for x in p.prompts_of(body.prompt)]
        for i, chars in enumerate(texts):
            if chars > self.max_chars:
                several = len(texts) > 1
                raise Refused(400, f"{f'prompt {i}: ' if several else ''}the prompt is {chars} characters long: its "
                              f"length in tokens exceeds max_model_len={self.engine.config.max_model_len} (no text "
                              f"over {self.max_chars} characters fits)",
                              param="messages" if chat else f"prompt.{i}" if several else "prompt",
                              code="context_length_exceeded")
        if chat:
            return texts[0]
        return sum(texts) + 4 * sum(len(x) for x in p.prompts_of(body.prompt) if not isinstance(x, str))

    def _tokenize(self, body: Any, chat: bool) -> list[list[int]]:
        tok = self.tokenizer
        if chat:
            return [tok.chat_prompt([(m.role, m.text()) for m in body.messages])]
        return [tok.encode(x) if isinstance(x, str) else list(x) for x in p.prompts_of(body.prompt)]

    def _build_all(self, body: Any, prompts: list[list[int]], tenant: str, priority: int,
                   chat: bool) -> list[Request]:
        several = len(prompts) > 1
        return [self._request(body, prompt, tenant, priority, chat, i if several else None)
                for i, prompt in enumerate(prompts)]

    def max_tokens(self, body: Any, prompt_len: int) -> int:
        """The request's `max_tokens`: the body's, else `default_max_tokens`, else (as vLLM) the
        rest of the context."""
        rest = max(1, self.engine.config.max_model_len - prompt_len)
        asked = body.max_completion_tokens or body.max_tokens
        if asked:
            return asked
        return rest if self.serve.default_max_tokens is None else max(1, min(self.serve.default_max_tokens, rest))

    def _request(self, body: Any, prompt: list[int], tenant: str, priority: int, chat: bool,
                 index: int | None) -> Request:
        """The validated engine request of one prompt (`index`: its place in a list of prompts)."""
        max_tokens = self.max_tokens(body, len(prompt))
        problem = self.engine.length_problem(len(prompt), max_tokens, body.n)
        if problem is not None:  # before a pydantic model is built over every token
            param = _param_of_message(problem, chat)
            msg = problem.replace("sampling.max_new_tokens", "max_tokens").replace("sampling.", "")
            if index is not None:
                msg, param = f"prompt {index}: {msg}", (f"prompt.{index}" if param == "prompt" else param)
            raise Refused(400, msg, param=param)
        now = self.engine.executor.now()
        try:
            return self.engine.validate(Request(
                request_id=uuid.uuid4().hex, tenant=tenant, priority=priority, prompt_token_ids=prompt,
                arrival_time=now,  # queued until the step in flight ends: that wait counts in its TTFT
                deadline=None if body.deadline_s is None else now + body.deadline_s,
                expected_output_tokens=body.expected_output_tokens, cache_salt=self.tenants.cache_salt(tenant),
                metadata=body.metadata or {},
                sampling=SamplingParams(
                    max_new_tokens=max_tokens, min_tokens=body.min_tokens, temperature=body.temperature,
                    top_p=body.top_p, top_k=body.top_k, min_p=body.min_p, frequency_penalty=body.frequency_penalty,
                    presence_penalty=body.presence_penalty, repetition_penalty=body.repetition_penalty, seed=body.seed,
                    logprobs=body.logprobs_k, stop_token_ids=tuple(body.stop_token_ids), ignore_eos=body.ignore_eos,
                    stop=() if body.stop is None else body.stop, n=body.n,
                    structured_output=None if body.structured is None else body.structured.structured_output(),
                ),
            ))
        except ValidationError as exc:
            msg = p.describe(exc).replace("sampling.max_new_tokens", "max_tokens").replace("sampling.", "")
            param = _param_of(exc, chat)
            if index is not None:
                msg, param = f"prompt {index}: {msg}", (f"prompt.{index}" if param == "prompt" else param)
            raise Refused(400, msg, param=param) from None

    async def _check_grammar(self, rf: p.ResponseFormat, request: Request) -> None:
        """Refuse (400 naming the field) a `response_format` over the schema limits or whose grammar
        the plugin that enforces it cannot compile; compiled off the event loop (once per schema:
        the plugin caches it), before the request is queued."""
        if rf.json_schema is not None:
            problem = await off_loop(schema_problem, rf.json_schema.schema_)
            if problem is not None:
                raise Refused(400, f"{rf.schema_param}: {problem}", param=rf.schema_param)
        checker = self.engine.plugins.get(STRUCTURED_OUTPUT_PLUGIN)
        if not hasattr(checker, "problem"):
            return  # the engine's own check_request (or validation) answers for it
        unavailable = await off_loop(checker.unavailable) if hasattr(checker, "unavailable") else None
        if unavailable is not None:
            raise Refused(400, f"response_format: {unavailable}", param="response_format")
        reason = await off_loop(checker.problem, request.sampling.structured_output)
        if reason is not None:
            raise Refused(400, f"{rf.schema_param}: {reason}", param=rf.schema_param)
