"""The front of several replica servers (`metroline serve --replicas N`): one OpenAI endpoint that
routes each request with the `route` hook and proxies it to the chosen replica, as SGLang's router
and vLLM's production-stack router do.

A request is refused before anything else is done with it: without a valid key 401, its body over
`max_body_bytes` 413 (before it is read), not JSON or a malformed field 400 (parsed in a worker
thread); no refusal names a replica. Then the front tokenizes the prompt (its first
`ROUTE_CHARS` characters: enough for a prefix estimate) into a `RouteRequest`, asks the `Router`
which of the live replicas serves it (the router sees only those, as `RemoteView`s indexed
0..k-1) and passes the HTTP request through (`front_proxy`): a stream chunk by chunk, a plain
answer whole. A router's `Refuse` answers 503 with its reason; no live replica 503. Replicas are
health-checked (`front_health`); a client that hangs up has its request cancelled at the replica.

On SIGTERM the front stops taking requests, stops its replicas (they drain their streams for
`drain_s`, each ending with a last event and `[DONE]`, which the front relays) and ends what is
left itself. The front owns the replicas: they are stopped when its lifespan ends.
"""

from __future__ import annotations

import asyncio
import json
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..cluster.prefix_directory import PrefixDirectory
from ..cluster.router import Router
from ..cluster.view import Refuse, RouteRequest
from ..errors import PluginError
from . import protocol as p
from .disconnect import ClientGone, until_disconnect
from .front_canary import FrontCanary
from .front_health import Health
from .front_pages import FrontPages
from .front_metrics import FrontMetrics
from .front_proxy import TRANSPORT_ERRORS, Failed, Proxy, make_client
from .quota import FRONT_HEADER, reserve_all, too_large, used_in
from .reading import Refused, authorization, check_batch, off_loop, parse_body, read_body, unauthorized
from .remote_view import RemoteView, SaltedPrompt
from .tenants import ServeConfig, Tenants

_FORWARDED = ("authorization", "content-type", "accept")
_RETURNED = ("content-type", "retry-after")
REPLICA_HEADER = "x-metroline-replica"
"""The response header naming the replica that served a request (never on a refusal)."""
PREFIX_BLOCKS_PER_REPLICA = 65536
"""The front's prefix directory holds about this many blocks per replica (1M tokens at 16 a block)."""
ROUTE_CHARS = 65536
"""The characters of a text prompt the front tokenizes to route it (the replica tokenizes it all)."""


def _used_of(content: bytes) -> int | None:
    """The tokens a replica's answer (not streamed) says it used, or None."""
    try:
        return int(json.loads(content)["usage"]["total_tokens"])
    except (ValueError, KeyError, TypeError):
        return None


def error(status: int, message: str, type_: str = "server_error", param: str | None = None) -> JSONResponse:
    return JSONResponse(p.error_body(message, type_, param), status_code=status)


class Front:
    """The state behind the front's routes: the replicas, their views, the router, the metrics."""

    def __init__(self, replicas: list[Any], router: Router, serve: ServeConfig, tokenizer: Any,
                 poll_s: float = 0.05, stop_replicas: Callable[[list[Any]], None] | None = None,
                 canary: Callable[[Any], FrontCanary] | None = None, replica_key: str | None = None,
                 quota: Any = None, max_model_len: int | None = None) -> None:
        self.replicas = list(replicas)
        self.prefixes = PrefixDirectory(PREFIX_BLOCKS_PER_REPLICA * max(1, len(self.replicas)))
        """The blocks of the prompts routed to each replica (`prefix_aware`'s estimate), shared by the views."""
        self.views = [RemoteView(i, r.name, r.pool, prefix_directory=self.prefixes)
                      for i, r in enumerate(self.replicas)]
        self.router = router
        self.serve = serve
        self.quota = quota
        """The tenants' token-rate quota, held here for all the replicas (`quota.py`), or None."""
        self.max_model_len = max_model_len
        self.replica_key = replica_key
        self.tenants = Tenants(serve)
        self.tokenizer = tokenizer
        self.created = int(time.time())
        self.metrics = FrontMetrics([(r.name, r.pool) for r in self.replicas])
        self.canary = canary(self.metrics.registry) if canary is not None else None
        self.health = Health(self.replicas, self.views, self.metrics, serve.health_timeout_s, serve.down_after_s,
                             poll_s, self._down, replica_key)
        self.proxy = Proxy(self.health, self.metrics, self.canary)
        self.pages = FrontPages(serve, self.tenants, self.replicas, self.views, self.health, self.metrics,
                                self.canary, self.proxy, self.created)
        """The read-only routes (`/v1/models`, `/health`, `/metrics`, the operator's pages)."""
        self._stop_replicas = stop_replicas
        self.closing = False
        self._poller: asyncio.Task | None = None

    def live(self) -> tuple[RemoteView, ...]:
        return self.health.live()

    def mark_down(self, view: RemoteView, reason: str) -> None:
        self.health.mark_down(view, reason)

    def _down(self, view: RemoteView, reason: str) -> None:
        self.proxy.cut(view.slot, f"replica {view.name} failed: {reason}")
        view.forget_prefixes()  # it may come back restarted, its cache empty

    # --- routing and proxying ---------------------------------------------------------------------

    def _route_request(self, body: Any, chat: bool, tenant: str) -> RouteRequest:
        """The `RouteRequest` of a validated body: its (first) prompt's tokens (salted by tenant
        when the replicas' caches are), its output bound."""
        tok = self.tokenizer
        if chat:
            prompt = tok.chat_prompt([(m.role, m.text()[:ROUTE_CHARS]) for m in body.messages])
        else:
            first = p.prompts_of(body.prompt)[0]
            prompt = tok.encode(first[:ROUTE_CHARS]) if isinstance(first, str) else list(first)
        if self.serve.salted:
            prompt = SaltedPrompt(prompt, self.tenants.cache_salt(tenant) or tenant)
        max_new = body.max_completion_tokens or body.max_tokens or self.serve.default_max_tokens or 256
        request = RouteRequest(uuid.uuid4().hex, time.monotonic(), prompt, max_new, tenant, body.priority or 0)
        request.block_chain(self.prefixes.block_size, self.prefixes.max_blocks)  # hashed here, off the loop
        return request

    async def chat(self, http: HTTPRequest) -> Response:
        return await self._complete(http, "/v1/chat/completions", chat=True)

    async def completions(self, http: HTTPRequest) -> Response:
        return await self._complete(http, "/v1/completions", chat=False)

    def _chooser(self, request: RouteRequest, arms: Any) -> Callable[[set[int]], Any]:
        """`route(tried)`: the view the router picks among the live replicas not tried yet (and in
        the request's canary arm), or the error response when it cannot."""
        def route(tried: set[int]) -> Any:
            up = live = self.live()
            if tried or arms is not None:
                live = tuple(v for v in live if v.slot not in tried
                             and (arms is None or self.canary.allows(v.slot, arms)))
                for i, v in enumerate(live):
                    v.index = i
            if not live:
                # "other" only while some replica is still up (one this request already tried):
                # a replica found dead at dispatch leaves the same answer as one found dead by a poll
                self.metrics.refused.labels("no_replica").inc()
                return error(503, "no other replica is up" if tried and up else "no replica is up", "server_error")
            try:
                answer = self.router.choose(request, live)
            except PluginError as exc:
                return error(500, str(exc))
            if isinstance(answer, Refuse):
                self.metrics.refused.labels("router").inc()
                return error(503, f"the router refused this request: {answer.reason}", "server_error")
            return live[answer]

        return route

    async def _complete(self, http: HTTPRequest, path: str, chat: bool) -> Response:
        started = time.monotonic()
        if self.closing:
            return error(503, "the server is shutting down")
        try:
            tenant = self.tenants.identify(authorization(http))
        except Refused as refused:
            return refused.response(http)
        if tenant is None:
            return unauthorized().response(http)
        try:
            raw = await read_body(http, self.serve.max_body_bytes)
            body = await off_loop(parse_body, raw, chat, size=len(raw))
            check_batch(body, chat, self.serve.max_waiting)  # the replicas would refuse it: so does the front
        except Refused as refused:
            return refused.response(http)
        request = await off_loop(self._route_request, body, chat, tenant, size=len(raw))
        tokens = (request.prompt_len + request.max_new_tokens) * max(1, body.n or 1)
        headers = {k: v for k, v in http.headers.items() if k in _FORWARDED}
        reserved = 0
        if self.quota is not None and self.replica_key is not None:  # the quota is the front's: the replica's is off
            headers[FRONT_HEADER] = self.replica_key
            try:
                reserved = await off_loop(self._reserve, body, chat, tenant, request.request_id, size=len(raw))
            except Refused as refused:
                self.metrics.refused.labels("quota").inc()
                return refused.response(http)
        try:
            return await self._answer(http, body, request, tokens, path, raw, headers, started, reserved)
        except BaseException:
            self._settle(request.request_id, reserved, reserved)
            raise

    def _reserve(self, body: Any, chat: bool, tenant: str, rid: str) -> int:
        """Reserve the request's tokens in its tenant's bucket (every prompt whole, tokenized, plus
        `max_tokens x n` each, as a replica counts them): the tokens reserved, or `Refused` (400 too
        large for the burst, 429 over the rate)."""
        tok = self.tokenizer
        if chat:
            lens = [len(tok.chat_prompt([(m.role, m.text()) for m in body.messages]))]
        else:
            lens = [len(tok.encode(x)) if isinstance(x, str) else len(x) for x in p.prompts_of(body.prompt)]
        n = max(1, body.n or 1)
        asked = body.max_completion_tokens or body.max_tokens
        limit, default = self.max_model_len or 0, self.serve.default_max_tokens
        outs = []
        for length in lens:  # the replica's rule (`Intake.max_tokens`)
            rest = max(1, limit - length)
            outs.append(asked or (rest if default is None else max(1, min(default, rest))))
        total = sum(lens) + n * sum(outs)
        now = time.monotonic()
        refused = too_large(self.quota, tenant, sum(lens), total, outs[0], n, len(lens), now)
        if refused is not None:
            raise refused
        reserve_all(self.quota, tenant, [(rid, total)], now)
        return total

    def _settle(self, rid: str, reserved: int, used: int | None) -> None:
        """The request ended having used `used` tokens (None: unknown, so all it reserved)."""
        if self.quota is not None and reserved:
            self.quota.settle(rid, reserved if used is None else used, time.monotonic())

    async def _metered(self, chunks: Any, rid: str, reserved: int) -> Any:
        """A relayed stream without the replica's usage comment, whose tokens settle the quota."""
        used = None
        try:
            async for chunk in chunks:
                chunk, found = used_in(chunk)
                if found is not None:
                    used = found
                if chunk:
                    yield chunk
        finally:
            await chunks.aclose()  # the relay's own ending (a hang-up closes the replica's connection)
            self._settle(rid, reserved, used)

    async def _answer(self, http: HTTPRequest, body: Any, request: RouteRequest, tokens: int, path: str,
                      raw: bytes, headers: dict[str, str], started: float, reserved: int) -> Response:
        """Dispatch the request to a replica and answer with what it answers (settling the quota
        of what it did not use)."""
        rid = request.request_id
        arms = self.canary.arms(request) if self.canary is not None else None
        try:
            got = await until_disconnect(http, self.proxy.dispatch(
                self._chooser(request, arms), request, tokens, path, raw, headers))
        except ClientGone:
            self._settle(rid, reserved, None)
            return Response(status_code=499)
        except Failed as exc:
            self._settle(rid, reserved, 0)  # no replica took it
            answer = error(exc.status, str(exc))
            if exc.status == 503:
                answer.headers["retry-after"] = "1"
            return answer
        if isinstance(got, Response):
            self._settle(rid, reserved, 0)
            return got
        view, upstream = got
        out_headers = {k.lower(): v for k, v in upstream.headers.items() if k.lower() in _RETURNED}
        out_headers[REPLICA_HEADER] = view.name
        if body.stream and upstream.status == 200:
            chunks = self.proxy.relay(upstream, view, request.request_id, started)
            if reserved:
                chunks = self._metered(chunks, rid, reserved)
            return StreamingResponse(chunks, status_code=200, headers=out_headers)
        used = None
        try:
            content = await until_disconnect(http, upstream.read())
            used = _used_of(content) if upstream.status == 200 else 0
        except ClientGone:
            return Response(status_code=499)
        except TRANSPORT_ERRORS as exc:
            self.metrics.failed.labels(view.name, view.pool).inc()
            return error(502, await self.health.failure(view, exc))
        finally:
            upstream.release()  # read whole, back to the pool; else closed (the replica sees it)
            self.proxy.ended(view, request.request_id, started)
            self._settle(rid, reserved, used)
        return Response(content, status_code=upstream.status, headers=out_headers)

    # --- life cycle -------------------------------------------------------------------------------

    async def drain(self) -> None:
        """On SIGTERM: refuse new requests, stop the replicas (each drains its streams for
        `drain_s`, ending the rest with an error event and `[DONE]`), relay what they send, and
        end any stream still open after that with an error event and `[DONE]` itself."""
        self.closing = True
        if self._poller is not None:  # the replicas stop accepting now: that is no failure
            self._poller.cancel()
        for r in self.replicas:
            process = getattr(r, "process", None)
            if process is not None and process.is_alive():
                process.terminate()
        deadline = time.monotonic() + self.serve.drain_s + 3.0
        while any(self.proxy.streams.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.proxy.cut(None, "cancelled (the server is shutting down)")
        deadline = time.monotonic() + 2.0
        while any(self.proxy.streams.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        client = self.proxy.client = make_client()
        polls = make_client()  # the health checks' own few connections
        poller = self._poller = asyncio.create_task(self.health.run(polls))
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await client.close()
            await polls.close()
            if self._stop_replicas is not None:
                await asyncio.to_thread(self._stop_replicas, self.replicas)


def build_front(replicas: list[Any], router: Router, serve: ServeConfig | None = None, tokenizer: Any = None,
                poll_s: float = 0.05, stop_replicas: Callable[[list[Any]], None] | None = None,
                cluster: tuple[Any, list[Any]] | None = None, replica_key: str | None = None,
                quota: Any = None, max_model_len: int | None = None) -> Starlette:
    """The front's ASGI app over started replicas (handles of `replicas.py` or `ray_replicas.py`);
    `stop_replicas(replicas)` runs when it shuts down. `cluster`: the `(ClusterSpec, plans)` the
    replicas were started from, in the same order (its canaries split the traffic and are
    compared on `/v1/canary`). `replica_key`: an operator key of the replicas, which the health
    checks send (`/v1/replica/state` is an operator's page where tenants are configured) and
    each request, so that the replica leaves the tenants' token-rate `quota` (`tenant_quota`'s, or
    None) to the front; `max_model_len`: the replicas', for the `max_tokens` of a request that
    gives none.
    `app.state.front` is its `Front`."""
    from .tokens import StandInTokenizer

    canary = None
    if cluster is not None and cluster[0].has_canary:
        canary = lambda registry: FrontCanary(cluster[0], cluster[1], registry)  # noqa: E731
    front = Front(replicas, router, serve or ServeConfig(), tokenizer or StandInTokenizer(), poll_s,
                  stop_replicas, canary, replica_key, quota, max_model_len)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", front.chat, methods=["POST"]),
            Route("/v1/completions", front.completions, methods=["POST"]),
            Route("/v1/models", front.pages.models, methods=["GET"]),
            Route("/v1/replicas", front.pages.replicas_state, methods=["GET"]),
            Route("/v1/canary", front.pages.canary_report, methods=["GET"]),
            Route("/health", front.pages.health_route, methods=["GET"]),
            Route("/metrics", front.pages.prometheus, methods=["GET"]),
            Route("/replicas/{name}/metrics", front.pages.replica_metrics, methods=["GET"]),
        ],
        lifespan=front.lifespan,
    )
    app.state.front = front
    app.state.drain = front.drain
    return app
