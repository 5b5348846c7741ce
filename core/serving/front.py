"""The front of several replica servers (`metroline serve --replicas N`): one OpenAI endpoint that
routes each request with the `route` hook and proxies it to the chosen replica, as SGLang's router
and vLLM's production-stack router do.

For each request the front tokenizes the prompt (the chat template for a chat) into a
`RouteRequest`, asks the `Router` which of the live replicas serves it (the router sees only those,
as `RemoteView`s indexed 0..k-1), and passes the HTTP request through with httpx: a stream chunk
by chunk, a plain answer whole. A router's `Refuse` answers 503 with its reason; no live replica
503. Each replica's state is polled every `poll_s` seconds.

When a replica's process dies or its connection fails, its in-flight requests fail with one clear
error naming it (not streamed: 502 in OpenAI's error shape; streamed: an error event, then
`[DONE]`), it is marked down and the router is shown the others from then on; a request whose
connection to a replica could not even be opened (or whose replica is found dead before it is
sent) is routed again among the rest. `/health` is ok
while a replica is up. The front owns the replicas: they are stopped when its lifespan ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..cluster.router import Router
from ..cluster.view import Refuse, RouteRequest
from ..errors import PluginError
from . import protocol as p
from .front_canary import FrontCanary, content_events
from .front_metrics import FrontMetrics
from .remote_view import RemoteView
from .tenants import ServeConfig, Tenants

_FORWARDED = ("authorization", "content-type", "accept")
_RETURNED = ("content-type", "retry-after")
REPLICA_HEADER = "x-metroline-replica"
"""The response header naming the replica that served a request."""


def error(status: int, message: str, type_: str = "server_error", param: str | None = None) -> JSONResponse:
    return JSONResponse(p.error_body(message, type_, param), status_code=status)


class Front:
    """The state behind the front's routes: the replicas, their views, the router, the metrics."""

    def __init__(self, replicas: list[Any], router: Router, serve: ServeConfig, tokenizer: Any,
                 poll_s: float = 0.05, stop_replicas: Callable[[list[Any]], None] | None = None,
                 canary: Callable[[Any], FrontCanary] | None = None) -> None:
        self.replicas = list(replicas)
        self.views = [RemoteView(i, r.name, r.pool) for i, r in enumerate(self.replicas)]
        self.router = router
        self.serve = serve
        self.tenants = Tenants(serve)
        self.tokenizer = tokenizer
        self.poll_s = poll_s
        self.created = int(time.time())
        self.metrics = FrontMetrics([(r.name, r.pool) for r in self.replicas])
        self.canary = canary(self.metrics.registry) if canary is not None else None
        self._stop_replicas = stop_replicas
        self._live: tuple[RemoteView, ...] | None = None
        self.client: httpx.AsyncClient | None = None

    # --- the replicas' health ---------------------------------------------------------------------

    def live(self) -> tuple[RemoteView, ...]:
        """The views of the replicas that are up, each `index` its place in this tuple."""
        live = self._live
        if live is None:
            live = self._live = tuple(v for v in self.views if v.up)
            for i, v in enumerate(live):
                v.index = i
        return live

    def mark_down(self, view: RemoteView, reason: str) -> None:
        """Route nothing more to a replica (said once on stderr and in `/metrics`)."""
        if not view.up:
            return
        view.up = False
        self._live = None
        self.metrics.up.labels(view.name, view.pool).set(0)
        print(f"metroline: replica {view.name} down: {reason}", file=sys.stderr)

    def _mark_up(self, view: RemoteView) -> None:
        if view.up:
            return
        view.up = True
        self._live = None
        self.metrics.up.labels(view.name, view.pool).set(1)
        print(f"metroline: replica {view.name} up again", file=sys.stderr)

    async def _failure(self, view: RemoteView, exc: BaseException) -> str:
        """The error of a request whose replica's connection failed; the replica is marked down.
        A process killed closes its sockets a moment before it can be reaped: up to 0.5 s is
        given to learn how it ended."""
        handle = self.replicas[view.slot]
        if handle.kind == "process":
            for _ in range(50):
                if not handle.is_alive():
                    break
                await asyncio.sleep(0.01)
        why = handle.why_down()
        reason = "connection refused" if isinstance(exc, httpx.ConnectError) else "connection lost"
        self.mark_down(view, f"{reason} ({why or type(exc).__name__})")
        return f"replica {view.name} failed: {reason}" + (f" ({why})" if why else "")

    async def _poll(self, view: RemoteView) -> None:
        handle = self.replicas[view.slot]
        if not handle.is_alive():
            self.mark_down(view, handle.why_down() or "not running")
            return
        try:
            r = await self.client.get(handle.url + "/v1/replica/state", timeout=2.0)
        except httpx.ConnectError as exc:
            self.mark_down(view, f"connection refused ({handle.why_down() or type(exc).__name__})")
            return
        except httpx.TransportError:
            return  # slow to answer: keep the last state
        if r.status_code == 200:
            view.update(r.json())
            self._mark_up(view)  # a replica marked down on a passing error that answers again

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._poll(v) for v in self.views if v.up or self.replicas[v.slot].is_alive()))
            await asyncio.sleep(self.poll_s)

    # --- routing and proxying ---------------------------------------------------------------------

    def _route_request(self, body: Any, chat: bool, tenant: str) -> RouteRequest:
        """The `RouteRequest` of a validated body: its (first) prompt's tokens, its output bound."""
        tok = self.tokenizer
        if chat:
            prompt = tok.chat_prompt([(m.role, m.text()) for m in body.messages])
        else:
            first = p.prompts_of(body.prompt)[0]
            prompt = tok.encode(first) if isinstance(first, str) else list(first)
        max_new = body.max_completion_tokens or body.max_tokens or self.serve.default_max_tokens
        return RouteRequest(uuid.uuid4().hex, time.monotonic(), prompt, max_new, tenant, body.priority or 0)

    async def chat(self, http: HTTPRequest) -> Response:
        return await self._complete(http, "/v1/chat/completions", chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._complete(http, "/v1/completions", chat=False)

    async def _complete(self, http: HTTPRequest, path: str, chat: bool) -> Response:
        started = time.monotonic()
        raw = await http.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"the body is not JSON: {exc}", "invalid_request_error")
        try:
            body = (p.ChatCompletionBody if chat else p.CompletionBody).model_validate(data)
        except ValidationError as exc:
            return error(400, p.describe(exc), "invalid_request_error", p.field_of(exc))
        tenant = self.tenants.identify(http.headers.get("authorization")) or "unknown"  # the replica answers 401
        request = self._route_request(body, chat, tenant)
        tokens = (request.prompt_len + request.max_new_tokens) * max(1, body.n or 1)
        headers = {k: v for k, v in http.headers.items() if k in _FORWARDED}
        arms = self.canary.arms(request) if self.canary is not None else None
        while True:
            live = self.live()
            if arms is not None:  # a canary pool shows the request only its arm's replicas
                live = tuple(v for v in live if self.canary.allows(v.slot, arms))
                for i, v in enumerate(live):  # (every request of a cluster with a canary comes here)
                    v.index = i
            if not live:
                self.metrics.refused.labels("no_replica").inc()
                return error(503, "no replica is up", "server_error")
            try:
                answer = self.router.choose(request, live)
            except PluginError as exc:
                return error(500, str(exc))
            if isinstance(answer, Refuse):
                self.metrics.refused.labels("router").inc()
                return error(503, f"the router refused this request: {answer.reason}", "server_error")
            view = live[answer]
            handle = self.replicas[view.slot]
            if not handle.is_alive():  # died since the last poll: route again among the others
                self.mark_down(view, handle.why_down() or "not running")
                continue
            try:
                upstream = await self.client.send(
                    self.client.build_request("POST", handle.url + path, content=raw, headers=headers), stream=True)
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.ConnectError):  # it never got the request: route it again
                    await self._failure(view, exc)
                    continue
                self.metrics.failed.labels(view.name, view.pool).inc()
                return error(502, await self._failure(view, exc))
            break
        view.routed(request)
        view.outstanding.add(request.request_id, tokens)
        labels = (view.name, view.pool)
        self.metrics.routed.labels(*labels).inc()
        self.metrics.in_flight.labels(*labels).inc()
        out_headers = {k: v for k, v in upstream.headers.items() if k in _RETURNED}
        out_headers[REPLICA_HEADER] = view.name
        if body.stream and upstream.status_code == 200:
            return StreamingResponse(self._relay(upstream, view, request.request_id, started),
                                     status_code=200, headers=out_headers)
        try:
            content = await upstream.aread()
        except httpx.TransportError as exc:
            self.metrics.failed.labels(*labels).inc()
            return error(502, await self._failure(view, exc))
        finally:
            await upstream.aclose()
            self._ended(view, request.request_id, started)
        return Response(content, status_code=upstream.status_code, headers=out_headers)

    def _ended(self, view: RemoteView, request_id: str, started: float) -> None:
        view.outstanding.end(request_id)
        self.metrics.in_flight.labels(view.name, view.pool).dec()
        self.metrics.e2e.labels(view.name, view.pool).observe(time.monotonic() - started)

    async def _relay(self, upstream: httpx.Response, view: RemoteView, request_id: str,
                     started: float) -> AsyncIterator[bytes]:
        """The replica's server-sent events, chunk by chunk; a lost connection ends the stream with
        an error event naming the replica, then `[DONE]`."""
        first, complete = True, True
        first_event = last_event = None
        events = 0
        try:
            async for chunk in upstream.aiter_raw():
                now = time.monotonic()
                if first:
                    first = False
                    self.metrics.ttft.labels(view.name, view.pool).observe(now - started)
                complete = chunk.endswith(b"\n\n")
                n = content_events(chunk)
                if n:
                    first_event = first_event if first_event is not None else now
                    last_event, events = now, events + n
                yield chunk
            if self.canary is not None:
                self.canary.record(view.slot, started, first_event, last_event, events, time.monotonic())
        except httpx.TransportError as exc:
            self.metrics.failed.labels(view.name, view.pool).inc()
            message = await self._failure(view, exc)
            yield (b"" if complete else b"\n\n") + p.sse(p.error_body(message, "server_error")) + p.DONE
        finally:
            await upstream.aclose()
            self._ended(view, request_id, started)

    # --- the other routes -------------------------------------------------------------------------

    async def models(self, http: HTTPRequest) -> Response:
        card = {"id": self.serve.model, "object": "model", "created": self.created, "owned_by": "metroline"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, http: HTTPRequest) -> Response:
        replicas = {v.name: v.up for v in self.views}
        if not any(replicas.values()):
            return JSONResponse({**p.error_body("no replica is up", "server_error"), "replicas": replicas},
                                status_code=503)
        return JSONResponse({"status": "ok", "replicas": replicas})

    async def replicas_state(self, http: HTTPRequest) -> Response:
        """`GET /v1/replicas`: each replica's name, pool, URL, whether it is up, the front's
        outstanding counts and its last polled state."""
        return JSONResponse({"replicas": [
            {"name": v.name, "pool": v.pool, "url": self.replicas[v.slot].url, "up": v.up,
             "outstanding_requests": v.outstanding_requests, "outstanding_tokens": v.outstanding_tokens,
             "state": v.state}
            for v in self.views]})

    async def canary_report(self, http: HTTPRequest) -> Response:
        """`GET /v1/canary`: each canary pool's arms, their rows and their comparison
        (`front_canary.py`); 404 without a canary."""
        if self.canary is None:
            return error(404, "no pool of this cluster has a canary ([cluster.pools.NAME.canary])",
                         "invalid_request_error")
        return JSONResponse(await asyncio.to_thread(self.canary.report))

    async def prometheus(self, http: HTTPRequest) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def replica_metrics(self, http: HTTPRequest) -> Response:
        """`GET /replicas/<name>/metrics`: that replica's own Prometheus text."""
        name = http.path_params["name"]
        view = next((v for v in self.views if v.name == name), None)
        if view is None:
            return error(404, f"no replica named {name!r} ({', '.join(v.name for v in self.views)})",
                         "invalid_request_error")
        try:
            r = await self.client.get(self.replicas[view.slot].url + "/metrics", timeout=5.0)
        except httpx.TransportError as exc:
            return error(502, f"replica {name} failed: {type(exc).__name__}")
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=None), limits=limits)
        poller = asyncio.create_task(self._poll_loop())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await self.client.aclose()
            if self._stop_replicas is not None:
                await asyncio.to_thread(self._stop_replicas, self.replicas)


def build_front(replicas: list[Any], router: Router, serve: ServeConfig | None = None, tokenizer: Any = None,
                poll_s: float = 0.05, stop_replicas: Callable[[list[Any]], None] | None = None,
                cluster: tuple[Any, list[Any]] | None = None) -> Starlette:
    """The front's ASGI app over started replicas (handles of `replicas.py` or `ray_replicas.py`);
    `stop_replicas(replicas)` runs when it shuts down. `cluster`: the `(ClusterSpec, plans)` the
    replicas were started from, in the same order (its canaries split the traffic and are
    compared on `/v1/canary`). `app.state.front` is its `Front`."""
    from .tokens import StandInTokenizer

    canary = None
    if cluster is not None and cluster[0].has_canary:
        canary = lambda registry: FrontCanary(cluster[0], cluster[1], registry)  # noqa: E731
    front = Front(replicas, router, serve or ServeConfig(), tokenizer or StandInTokenizer(), poll_s, stop_replicas,
                  canary)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", front.chat, methods=["POST"]),
            Route("/v1/completions", front.completions, methods=["POST"]),
            Route("/v1/models", front.models, methods=["GET"]),
            Route("/v1/replicas", front.replicas_state, methods=["GET"]),
            Route("/v1/canary", front.canary_report, methods=["GET"]),
            Route("/health", front.health, methods=["GET"]),
            Route("/metrics", front.prometheus, methods=["GET"]),
            Route("/replicas/{name}/metrics", front.replica_metrics, methods=["GET"]),
        ],
        lifespan=front.lifespan,
    )
    app.state.front = front
    return app
