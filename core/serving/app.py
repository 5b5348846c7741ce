"""The HTTP app (Starlette): OpenAI's completions and chat completions, models, health, metrics.

`build_app(engine, serve)` needs only an `Engine`, the server's `ServeConfig` and, optionally, a
tokenizer (by default the executor's, else the simulated stand-ins of `tokens.py`). The engine is
stepped by an `AsyncEngine` started and stopped with the app (its lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import time
import uuid
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..requests.request import STRUCTURED_OUTPUT_PLUGIN, Request, SamplingParams
from ..requests.sequence import FinishReason, Sequence
from ..step.async_engine import AsyncEngine, Rejected, RequestStream
from ..step.engine import Engine
from . import protocol as p
from .metrics import ServerMetrics
from .sse import EventStream, final_texts, hold_for
from .streams import StreamGroup
from .tenants import ServeConfig, Tenants, quota_retry_after
from .tokens import tokenizer_for


def error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(p.error_body(message, type_, param, code), status_code=status, headers=headers)


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
    msg = p.describe(exc)
    if "sampling.n " in msg:
        return "n"
    if "sampling.structured_output" in msg:
        return "response_format"
    if msg.startswith("ignore_eos: "):
        return "ignore_eos"
    if "max_new_tokens" in msg and "max_model_len" not in msg:
        return "max_tokens"
    return "messages" if chat else "prompt"


class _Refusal(Exception):
    def __init__(self, response: JSONResponse) -> None:
        self.response = response


class Server:
    """The state behind the routes: engine loop, tenants, tokenizer, metrics."""

    def __init__(self, engine: Engine, serve: ServeConfig, tokenizer: Any = None) -> None:
        self.engine = engine
        self.serve = serve
        self.tenants = Tenants(serve)
        self.created = int(time.time())  # /v1/models: when the server came up
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(engine.executor)
        self._checks = engine.plugins.has_impls("check_request")
        self.timings: dict[str, list[float]] | None = None
        """When a dict (a bench sets it): request id -> [handler started, first SSE bytes written],
        on the engine clock, for the overhead's breakdown."""
        self.metrics = ServerMetrics(engine.config.max_num_seqs, engine.config.max_num_batched_tokens)
        self.loop = AsyncEngine(
            engine, max_waiting=serve.max_waiting, ramp_s=serve.ramp_s, buffer_tokens=serve.buffer_tokens,
            stall_timeout=serve.stall_timeout, after_step=self._after_step,
        )

    def _after_step(self, engine: Engine, outputs: list[Any]) -> None:
        self.metrics.after_step(engine, outputs)
        self.metrics.backpressure(len(self.loop.backpressure.paused), self.loop.pauses)

    # --- building a request ----------------------------------------------------------------------

    def _refuse(self, tenant: str, reason: str, status: int, message: str, type_: str,
                param: str | None = None, code: str | None = None, retry_after: float | None = None) -> _Refusal:
        self.metrics.reject(tenant, reason)
        headers = None if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}
        return _Refusal(error(status, message, type_, param, code, headers))

    async def _admit(self, http: HTTPRequest, chat: bool) -> tuple[Any, Request, RequestStream | StreamGroup]:
        """Identify, validate and submit a request: its body, its (first) engine request and its
        stream (a `StreamGroup` for a completion with several prompts, all submitted or none)."""
        tenant = self.tenants.identify(http.headers.get("authorization"))
        if tenant is None:
            raise self._refuse("unknown", "auth", 401, "missing or unknown API key (Authorization: Bearer KEY)",
                               "invalid_request_error", code="invalid_api_key")
        try:
            raw = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self._refuse(tenant, "invalid", 400, f"the body is not JSON: {exc}", "invalid_request_error")
        try:
            body = (p.ChatCompletionBody if chat else p.CompletionBody).model_validate(raw)
        except ValidationError as exc:
            raise self._refuse(tenant, "invalid", 400, p.describe(exc), "invalid_request_error", p.field_of(exc))
        if body.model is not None and body.model != self.serve.model:
            raise self._refuse(tenant, "invalid", 404, f"model {body.model!r} does not exist; this server "
                               f"serves {self.serve.model!r}", "invalid_request_error", "model", "model_not_found")
        if body.logprobs_k is not None and getattr(self.engine.executor, "name", "") == "sim":
            raise self._refuse(tenant, "invalid", 400, "logprobs need a model's logits: the simulated executor "
                               "has none", "invalid_request_error", "logprobs")
        if body.structured is not None and getattr(self.engine.executor, "name", "") == "sim":
            raise self._refuse(tenant, "invalid", 400, "response_format: a structured output needs a model's "
                               "logits: the simulated executor has none", "invalid_request_error", "response_format")
        priority, problem = self.tenants.priority(tenant, body.priority)
        if problem:
            raise self._refuse(tenant, "priority", 429, problem, "rate_limit_error", "priority")
        if chat:
            prompts = [self.tokenizer.chat_prompt([(m.role, m.text()) for m in body.messages])]
        else:
            prompts = [self.tokenizer.encode(x) if isinstance(x, str) else list(x) for x in p.prompts_of(body.prompt)]
        requests = [self._request(body, prompt, tenant, priority, chat, i if len(prompts) > 1 else None)
                    for i, prompt in enumerate(prompts)]
        if body.structured is not None:
            await self._check_grammar(tenant, body.structured, requests[0])
        if self._checks:
            # a plugin's verdict that it could never run (a tenant cap below its needs): 400 now
            # rather than a failure once queued (Engine.add_request asks the same question)
            for request in requests:
                seq = Sequence.from_request(request, request.arrival_time or 0.0, 0)
                reason = self.engine.plugins.refusal(self.engine.scheduler.ctx, seq)
                if reason is not None:
                    raise self._refuse(tenant, "refused", 400, f"this request can never run: {reason}",
                                       "invalid_request_error")
        wait = quota_retry_after(self.engine, tenant, sum(map(len, prompts)))
        if wait is not None:
            raise self._refuse(tenant, "quota", 429, f"tenant {tenant!r} is over its token-rate quota",
                               "rate_limit_error", retry_after=wait)
        group = asyncio.Event() if len(requests) > 1 else None
        streams: list[RequestStream] = []
        try:
            for request in requests:
                streams.append(self.loop.submit(request, group))
        except Rejected as exc:
            for submitted in streams:  # all of the prompts or none
                self.loop.abort(submitted.request_id)
            type_ = "rate_limit_error" if exc.status == 429 else "server_error"
            raise self._refuse(tenant, exc.reason, exc.status, str(exc), type_, retry_after=exc.retry_after)
        return body, requests[0], streams[0] if group is None else StreamGroup(streams)

    async def _check_grammar(self, tenant: str, rf: p.ResponseFormat, request: Request) -> None:
        """Refuse (400 naming the field) a `response_format` whose grammar the plugin that enforces
        it cannot compile; compiled off the event loop (once per schema: the plugin caches it)."""
        checker = self.engine.plugins.get(STRUCTURED_OUTPUT_PLUGIN)
        if not hasattr(checker, "problem"):
            return  # the engine's own check_request (or validation) answers for it
        unavailable = await asyncio.to_thread(checker.unavailable) if hasattr(checker, "unavailable") else None
        if unavailable is not None:
            raise self._refuse(tenant, "invalid", 400, f"response_format: {unavailable}", "invalid_request_error",
                               "response_format")
        reason = await asyncio.to_thread(checker.problem, request.sampling.structured_output)
        if reason is not None:
            raise self._refuse(tenant, "invalid", 400, f"{rf.schema_param}: {reason}", "invalid_request_error",
                               rf.schema_param)

    def _request(self, body: Any, prompt: list[int], tenant: str, priority: int, chat: bool,
                 index: int | None) -> Request:
        """The validated engine request of one prompt (`index`: its place in a list of prompts)."""
        limit = self.engine.config.max_model_len
        max_tokens = body.max_completion_tokens or body.max_tokens or max(
            1, min(self.serve.default_max_tokens, limit - len(prompt)))
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
            raise self._refuse(tenant, "invalid", 400, msg, "invalid_request_error", param) from None

    # --- routes ----------------------------------------------------------------------------------

    async def chat(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=False)

    async def _complete(self, http: HTTPRequest, chat: bool) -> Response:
        started = self.engine.executor.now()
        try:
            body, request, stream = await self._admit(http, chat)
        except _Refusal as refusal:
            return refusal.response
        shapes = p.Shapes(request.request_id, self.serve.model, chat)
        if body.stream:
            marks = None
            if self.timings is not None:
                marks = self.timings[request.request_id] = [started]
            return EventStream(stream, shapes, self.tokenizer, hold_for(body.stop), body.include_usage,  # type: ignore[return-value]
                               self.loop.abort, marks, self.engine.executor.now)
        try:
            await stream.result()
        finally:
            if not stream.finished:
                for rid in stream.request_ids:
                    self.loop.abort(rid)
        if stream.finish_reason is FinishReason.FAILED:
            return error(500, f"the engine failed this request: {stream.error}", "server_error")
        if stream.finish_reason is FinishReason.CANCELLED:
            return error(503, "the request was cancelled (server shutting down)", "server_error")
        use = p.usage(stream.num_prompt_tokens, stream.num_output_tokens)
        return JSONResponse(shapes.response(final_texts(stream, self.tokenizer, chat), use))

    async def models(self, http: HTTPRequest) -> Response:
        card = {"id": self.serve.model, "object": "model", "created": self.created, "owned_by": "metroline"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, http: HTTPRequest) -> Response:
        if not self.loop.running:
            return error(503, "the engine loop is not running", "server_error")
        return JSONResponse({"status": "ok", **self.loop.describe()})

    async def replica_state(self, http: HTTPRequest) -> Response:
        """`GET /v1/replica/state`: the engine's load, read-only, for a router in front of several
        servers (`front.py`): queue lengths, KV blocks (`kv_used_blocks`: held by live requests;
        0 once idle, or blocks leaked), the block size and the policy."""
        s, pool = self.engine.scheduler, self.engine.pool
        return JSONResponse({
            "num_waiting": len(s.waiting) + len(s.swapped), "num_running": len(s.running),
            "kv_used_blocks": pool.num_used_blocks(), "kv_free_blocks": pool.num_free_blocks(),
            "kv_cached_blocks": pool.num_cached_blocks(), "num_blocks": pool.num_blocks,
            "block_size": pool.block_size, "policy": self.engine.config.policy, **self.loop.describe(),
        })

    async def prometheus(self, http: HTTPRequest) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        await self.loop.start()
        # everything alive now (modules, the engine, the app) lives as long as the server: out of
        # the collector's sight, so that a full collection walks only what requests made since
        # (one took ~50 ms with them, stalling every stream on the event loop)
        gc.freeze()
        try:
            yield
        finally:
            await self.loop.shutdown(drain_s=self.serve.drain_s)
            gc.unfreeze()  # an in-process server (tests, benches) leaves the collector as it was


async def _server_error(http: HTTPRequest, exc: Exception) -> Response:
    return error(500, f"{type(exc).__name__}: {exc}", "server_error")


def build_app(engine: Engine, serve: ServeConfig | None = None, tokenizer: Any = None) -> Starlette:
    """The ASGI app serving `engine`; `app.state.server` is its `Server`."""
    server = Server(engine, serve or ServeConfig(), tokenizer)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", server.chat, methods=["POST"]),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/models", server.models, methods=["GET"]),
            Route("/health", server.health, methods=["GET"]),
            Route("/metrics", server.prometheus, methods=["GET"]),
            Route("/v1/replica/state", server.replica_state, methods=["GET"]),
        ],
        exception_handlers={Exception: _server_error},
        lifespan=server.lifespan,
    )
    app.state.server = server
    return app
