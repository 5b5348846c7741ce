"""Sending a routed request to its replica and relaying the answer (`metroline.core.serving.front`).

`Proxy.dispatch` records the routing before it sends (the replica's outstanding requests and
tokens, its remembered prompt blocks), so the next request's router sees it at once. A request the
replica never got (a refused or timed-out connection, a reused idle connection found closed) is
routed again among the replicas not tried yet; a replica that dies with the request, or an error
once it has begun answering, ends the request: 502 in OpenAI's error shape, or for a stream an error event, then `[DONE]`.
`Proxy.cut(slot, message)` ends the streams in flight at one replica (marked down) or all of them
(a drain that ran out of time) the same way.

The client is aiohttp's (as vLLM's production-stack router proxies): its C parser hands a
stream's bytes on for about a fifth of the CPU that httpx's pure-Python h11 and anyio reads take
(`bench/serve_load.py --front` prints the front's CPU per request), with its pool limits and
timeouts: a connection is opened within `CONNECT_S`, an idle one is let go before the replicas'
uvicorn closes it (`KEEP_ALIVE_S`), and no read timeout (a request may wait in a replica's queue;
a frozen replica is the health check's). The relay hands the replica's bytes on as they come
(`iter_any`): no SSE event is parsed, only counted for a canary's timings.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from ..cluster.view import RouteRequest
from . import protocol as p
from .front_canary import content_events
from .front_health import Health
from .front_metrics import FrontMetrics
from .remote_view import RemoteView
from .server import KEEP_ALIVE_S

CONNECT_S = 2.0
_NEVER_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""Errors before a connection was had: the request is sent to another replica."""
_RESET = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
"""Errors of a connection closed before any answer: a reused idle connection the server had
closed, when the replica lives on (sent again, to another replica); a replica that died with the
request (502: it may have begun computing it)."""
MAX_ATTEMPTS = 3
"""Tries of each replica for a request none has taken (timeouts, resets) before the front gives up."""
RETRY_PAUSE_S = 0.05
"""The pause before trying every replica again, times the attempts made (a connect storm eases)."""


TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
"""What a failed exchange with a replica raises (aiohttp's errors, a timeout)."""


def make_client() -> aiohttp.ClientSession:
    """The front's client to its replicas (made within the event loop that uses it): connections
    unbounded in number (a stream holds one), idle ones let go after `KEEP_ALIVE_S / 2`."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEP_ALIVE_S / 2)
    return aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_S))


class Failed(Exception):
    """A request that no replica could take, or whose replica failed before answering; `status`:
    502 (a replica failed), 503 (live replicas too busy to take a connection: try again later)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class Proxy:
    """Sends requests to replicas and relays their answers; knows every stream in flight."""

    def __init__(self, health: Health, metrics: FrontMetrics, canary: Any) -> None:
        self.health = health
        self.metrics = metrics
        self.canary = canary
        self.client: aiohttp.ClientSession | None = None
        self.streams: dict[int, dict[aiohttp.ClientResponse, list[str]]] = {}
        """slot -> {upstream response of a stream in flight there: [why it was cut, if it was]}."""

    async def dispatch(self, route: Any, request: RouteRequest, tokens: int, path: str, raw: bytes,
                       headers: dict[str, str]) -> tuple[RemoteView, aiohttp.ClientResponse] | Any:
        """(view, upstream response with its headers read) of the replica that took the request;
        `route(tried)` chooses a view among the live ones not in `tried` (or answers a response:
        a refusal, returned as it is)."""
        tried: set[int] = set()
        last, busy = "", False
        sends, most = 0, MAX_ATTEMPTS * max(1, len(self.health.views))
        while sends < most:
            view = route(tried)
            if not isinstance(view, RemoteView):
                live = self.health.live()
                if not tried or not live or any(v.slot not in tried for v in live):
                    return view  # a refusal, or no replica up
                # every live replica was tried and none took it (timeouts, resets): they live on,
                # so this is load, not failure: wait a moment and try them all again
                tried.clear()
                await asyncio.sleep(RETRY_PAUSE_S * sends)
                continue
            handle = self.health.replicas[view.slot]
            tried.add(view.slot)
            if not handle.is_alive():  # died since the last poll: route again among the others
                self.health.mark_down(view, handle.why_down() or "not running")
                continue
            sends += 1
            view.routed(request)  # recorded at dispatch: the next request's router sees it
            view.outstanding.add(request.request_id, tokens)
            try:
                upstream = await self.client.post(handle.url + path, data=raw, headers=headers)
            except BaseException as exc:
                view.outstanding.end(request.request_id)
                if not isinstance(exc, TRANSPORT_ERRORS):
                    raise
                last = await self.health.failure(view, exc)
                if isinstance(exc, _NEVER_SENT) or (isinstance(exc, _RESET) and handle.is_alive()):
                    busy = True
                    continue  # the replica never took it: another one may
                self.metrics.failed.labels(view.name, view.pool).inc()
                raise Failed(last) from None
            labels = (view.name, view.pool)
            self.metrics.routed.labels(*labels).inc()
            self.metrics.in_flight.labels(*labels).inc()
            return view, upstream
        if busy:  # live replicas that took no connection in time: overloaded, not failed
            raise Failed(f"no replica took the request in {MAX_ATTEMPTS} tries each ({last})", status=503)
        raise Failed(last or "no replica took the request")

    def ended(self, view: RemoteView, request_id: str, started: float) -> None:
        view.outstanding.end(request_id)
        self.metrics.in_flight.labels(view.name, view.pool).dec()
        self.metrics.e2e.labels(view.name, view.pool).observe(time.monotonic() - started)

    def cut(self, slot: int | None, message: str) -> None:
        """End the streams in flight at replica `slot` (None: everywhere) with an error event."""
        for s, streams in self.streams.items():
            if slot is None or s == slot:
                for upstream, why in streams.items():
                    if not why:
                        why.append(message)
                        upstream.close()

    async def relay(self, upstream: aiohttp.ClientResponse, view: RemoteView, request_id: str,
                    started: float) -> AsyncIterator[bytes]:
        """The replica's server-sent events, chunk by chunk; a lost connection (or a cut) ends the
        stream with an error event naming the replica, then `[DONE]`."""
        first, complete, done = True, True, False
        first_event = last_event = None
        events = 0
        why: list[str] = []
        self.streams.setdefault(view.slot, {})[upstream] = why
        last_ok, slot = self.health.last_ok, view.slot
        try:
            async for chunk in upstream.content.iter_any():
                now = last_ok[slot] = time.monotonic()  # bytes from it: it is not frozen
                if first:
                    first = False
                    self.metrics.ttft.labels(view.name, view.pool).observe(now - started)
                complete = chunk.endswith(b"\n\n")
                n = content_events(chunk)
                if n:
                    first_event = first_event if first_event is not None else now
                    last_event, events = now, events + n
                yield chunk
            if why:  # cut: its connection was closed under the read
                raise aiohttp.ClientConnectionError(why[0])
            done = True
            if self.canary is not None:
                self.canary.record(view.slot, started, first_event, last_event, events, time.monotonic())
        except TRANSPORT_ERRORS as exc:
            self.metrics.failed.labels(view.name, view.pool).inc()  # ended with its replica, however
            message = why[0] if why else await self.health.failure(view, exc)
            yield (b"" if complete else b"\n\n") + p.sse(p.error_body(message, "server_error")) + p.DONE
        finally:
            self.streams[view.slot].pop(upstream, None)
            if done:
                upstream.release()  # read to its end: the connection goes back to the pool
            else:
                upstream.close()  # the replica sees the hang-up (and cancels the request)
            self.ended(view, request_id, started)
