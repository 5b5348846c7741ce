"""The HTTP app (Starlette): OpenAI's completions and chat completions, models, health, metrics.

`build_app(engine, serve)` needs only an `Engine`, the server's `ServeConfig` and, optionally, a
tokenizer (by default the executor's, else the simulated stand-ins of `tokens.py`). The engine is
stepped by an `AsyncEngine` started and stopped with the app (its lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import __version__
from ..plugins.hook_watch import Watchdog
from ..requests.request import Request
from ..requests.sequence import FinishReason
from ..step.async_engine import AsyncEngine, Rejected, RequestStream
from ..step.engine import Engine
from . import protocol as p
from .admission import Intake
from .disconnect import ClientGone, until_disconnect
from .metrics import ServerMetrics
from .reading import Refused, off_loop, unauthorized
from .sse import EventStream, final_texts, hold_for
from .streams import StreamGroup
from .quota import FRONT_HEADER, reserve_all, too_large
from .tenants import ServeConfig, Tenants, quota_of
from .tokens import tokenizer_for


def error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(p.error_body(message, type_, param, code), status_code=status, headers=headers)


class Server:
    """The state behind the routes: engine loop, tenants, tokenizer, metrics."""

    def __init__(self, engine: Engine, serve: ServeConfig, tokenizer: Any = None) -> None:
        self.engine = engine
        self.serve = serve
        self.tenants = Tenants(serve)
        self.created = int(time.time())  # /v1/models: when the server came up
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(engine.executor)
        self.intake = Intake(engine, serve, self.tenants, self.tokenizer)
        self.quota = quota_of(engine)
        self.fingerprint = p.fingerprint(__version__, serve.model, engine.config.model_dump_json())
        self.writing = 0
        """Streamed responses still writing (a drain waits for them to end)."""
        self.timings: dict[str, list[float]] | None = None
        """When a dict (a bench sets it): request id -> [handler started, first SSE bytes written],
        on the engine clock, for the overhead's breakdown."""
        self.metrics = ServerMetrics(engine.config.max_num_seqs, engine.config.max_num_batched_tokens)
        self.on_stop: Any = None
        """Called with this server once it has drained, before the process exits (uvicorn then
        re-raises the signal that stopped it): `metroline serve` prints its summary there."""
        watch = engine.plugins.watch
        watch.budget_s = serve.hook_budget_s or None
        watch.on_overrun = lambda plugin, hook, took: self.metrics.plugin_overruns.labels(plugin, hook).inc()
        self.watchdog = Watchdog(watch)
        self.loop = AsyncEngine(
            engine, max_waiting=serve.max_waiting, ramp_s=serve.ramp_s, buffer_tokens=serve.buffer_tokens,
            stall_timeout=serve.stall_timeout, after_step=self._after_step, on_end=self._ended,
            on_plugin_error=lambda exc: self.metrics.plugin_errors.labels(exc.plugin, exc.hook).inc(),
        )

    def _after_step(self, engine: Engine, outputs: list[Any]) -> None:
        self.metrics.after_step(engine, outputs)
        self.metrics.backpressure(len(self.loop.backpressure.paused), self.loop.pauses)

    # --- building a request ----------------------------------------------------------------------

    async def _admit(self, http: HTTPRequest, chat: bool) -> tuple[Any, Request, RequestStream | StreamGroup]:
        """Identify, validate and submit a request (`Intake.admit`), its tokens reserved from its
        tenant's quota: its body, its (first) engine request and its stream (a `StreamGroup` for a
        completion with several prompts, all submitted or none)."""
        tenant, body, requests = await self.intake.admit(http, chat)
        try:
            if not self.from_front(http):  # else the front reserved for it (`quota.py`)
                self._reserve(tenant, requests)
        except Refused as refused:
            refused.tenant = tenant  # counted as the tenant's (`metroline_rejections`)
            raise
        group = asyncio.Event() if len(requests) > 1 else None
        streams: list[RequestStream] = []
        try:
            for request in requests:
                streams.append(self.loop.submit(request, group))
        except Rejected as exc:
            for submitted in streams:  # all of the prompts or none
                self.loop.abort(submitted.request_id)
            for request in requests:
                self._settle(request.request_id, 0)
            type_ = "rate_limit_error" if exc.status == 429 else "server_error"
            refused = Refused(exc.status, str(exc), type_, reason=exc.reason, retry_after=exc.retry_after)
            refused.tenant = tenant
            raise refused from None
        return body, requests[0], streams[0] if group is None else StreamGroup(streams)

    def from_front(self, http: HTTPRequest) -> bool:
        """Whether the front sent this request (its key in `FRONT_HEADER`): the front then holds
        the tenant's quota and reads the usage from the answer."""
        key = http.headers.get(FRONT_HEADER)
        return key is not None and key in self.serve.operator_keys

    def _reserve(self, tenant: str, requests: list[Request]) -> None:
        """Reserve each request's prompt and `max_tokens x n` from its tenant's token-rate quota,
        all of them or none (429 with `Retry-After`); a request asking for more than the tenant's
        burst is refused as too large (400, `quota.too_large`)."""
        quota = self.quota
        if quota is None:
            return
        now = self.engine.executor.now()
        first = requests[0]
        asks = [(r.request_id, len(r.prompt_token_ids) + r.sampling.max_new_tokens * r.sampling.n) for r in requests]
        refused = too_large(quota, tenant, sum(len(r.prompt_token_ids) for r in requests), sum(t for _, t in asks),
                            first.sampling.max_new_tokens, first.sampling.n, len(requests), now)
        if refused is not None:
            raise refused
        reserve_all(quota, tenant, asks, now)

    def _settle(self, request_id: str, used: int) -> None:
        if self.quota is not None:
            self.quota.settle(request_id, used, self.engine.executor.now())

    def _ended(self, stream: RequestStream) -> None:
        """A request ended: what it did not use of its reservation goes back to its tenant."""
        if self.quota is not None:
            self._settle(stream.request_id, stream.num_prompt_tokens + stream.num_output_tokens)

    # --- routes ----------------------------------------------------------------------------------

    async def chat(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._complete(http, chat=False)

    async def _complete(self, http: HTTPRequest, chat: bool) -> Response:
        started = self.engine.executor.now()
        try:
            body, request, stream = await self._admit(http, chat)
        except Refused as refused:
            self.metrics.reject(refused.tenant or "unknown", refused.reason)
            return refused.response(http)
        shapes = p.Shapes(request.request_id, self.serve.model, chat, self.fingerprint)
        if body.stream:
            marks = None
            if self.timings is not None:
                marks = self.timings[request.request_id] = [started]
            return EventStream(stream, shapes, self.tokenizer, hold_for(body.stop), body.include_usage,  # type: ignore[return-value]
                               self.loop.abort, marks, self.engine.executor.now, self._writer,
                               usage_comment=self.from_front(http),
                               socket=(self.serve.buffer_bytes, self.loop.hold, self.loop.release))
        try:
            await until_disconnect(http, stream.result())
        except ClientGone:  # nobody to answer: its requests are cancelled, their blocks freed
            return Response(status_code=499)
        finally:
            if not stream.finished:
                for rid in stream.request_ids:
                    self.loop.abort(rid)
        if stream.finish_reason is FinishReason.FAILED:
            return error(500, f"the engine failed this request: {stream.error}", "server_error")
        if stream.finish_reason is FinishReason.CANCELLED:
            return error(503, "the request was cancelled (server shutting down)", "server_error")
        use = p.usage(stream.num_prompt_tokens, stream.num_output_tokens, stream.cached_tokens)
        texts = await off_loop(final_texts, stream, self.tokenizer, chat)  # a long output's detokenization
        return JSONResponse(shapes.response(texts, use))

    def _writer(self, delta: int) -> None:
        self.writing += delta

    async def models(self, http: HTTPRequest) -> Response:
        if not self.tenants.may_read(http.headers.get("authorization"), "models"):
            return unauthorized().response()
        card = {"id": self.serve.model, "object": "model", "created": self.created, "owned_by": "metroline"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, http: HTTPRequest) -> Response:
        if not self.loop.running:
            return error(503, "the engine loop is not running", "server_error")
        return JSONResponse({"status": "ok", **self.loop.describe()})

    async def replica_state(self, http: HTTPRequest) -> Response:
        """`GET /v1/replica/state`: the engine's load, read-only, for a router in front of several
        servers (`front.py`): queue lengths, KV blocks (`kv_used_blocks`: held by live requests;
        0 once idle, or blocks leaked), the block size and the policy. With tenants it is an
        operator's page, as `/metrics` is (a tenant could read the others' load from it): the front
        asks it with a key of its own, given to its replicas as an operator key."""
        if not self.tenants.may_read(http.headers.get("authorization"), "operator"):
            return unauthorized().response()
        s, pool = self.engine.scheduler, self.engine.pool
        return JSONResponse({
            "num_waiting": len(s.waiting) + len(s.swapped), "num_running": len(s.running),
            "kv_used_blocks": pool.num_used_blocks(), "kv_free_blocks": pool.num_free_blocks(),
            "kv_cached_blocks": pool.num_cached_blocks(), "num_blocks": pool.num_blocks,
            "block_size": pool.block_size, "policy": self.engine.config.policy, **self.loop.describe(),
        })

    async def prometheus(self, http: HTTPRequest) -> Response:
        if not self.tenants.may_read(http.headers.get("authorization"), "metrics"):
            return unauthorized().response()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        await self.loop.start()
        self.watchdog.start()
        # everything alive now (modules, the engine, the app) lives as long as the server: out of
        # the collector's sight, so that a full collection walks only what requests made since
        # (one took ~50 ms with them, stalling every stream on the event loop)
        gc.freeze()
        try:
            yield
        finally:
            await self.drain()
            self.watchdog.stop()
            gc.unfreeze()
            if self.on_stop is not None:
                self.on_stop(self)

    async def drain(self) -> None:
        """Shut down cleanly (on SIGTERM, before uvicorn closes the connections): refuse new
        requests, let those in flight finish for `drain_s` seconds, cancel the rest (each stream
        then ends with an error event and `[DONE]`) and wait for their last bytes to be written."""
        await self.loop.shutdown(drain_s=self.serve.drain_s)
        deadline = time.monotonic() + 2.0
        while self.writing and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # an in-process server (tests, benches) leaves the collector as it was


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
    app.state.drain = server.drain
    return app
