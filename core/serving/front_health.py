"""Which replicas a front routes to (`metroline.core.serving.front`): active health checks.

Every `poll_s` seconds each replica's `/v1/replica/state` is asked with a timeout of
`ServeConfig.health_timeout_s`. A replica whose process has ended, or whose port refuses a new
connection, is marked down at once; one that has not answered for `down_after_s` seconds (a frozen
process accepts connections but answers nothing; a stream's bytes from it count as an answer, so a
replica too busy to answer its health check in time while it streams is not taken for frozen) is
marked down then (unless it is the last replica up: slowness alone never leaves the front with
none), and the requests it holds are
ended by the front (`on_down`). A replica marked down that answers again is marked up. A request's
own connection errors never mark a replica down by themselves, except a refused connection: the
health check decides (one reset of a reused idle connection says nothing about the replica).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from .front_metrics import FrontMetrics
from .remote_view import RemoteView


class Health:
    """The replicas' health as the front sees it: `live()` is what the router is shown."""

    def __init__(self, replicas: list[Any], views: list[RemoteView], metrics: FrontMetrics, timeout_s: float,
                 down_after_s: float, poll_s: float, on_down: Callable[[RemoteView, str], None],
                 key: str | None = None) -> None:
        self.replicas = replicas
        self.views = views
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.down_after_s = down_after_s
        self.poll_s = poll_s
        self.on_down = on_down
        self.headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        """Sent with each poll: the front's operator key at its replicas."""
        self.last_ok = [time.monotonic()] * len(views)
        self._live: tuple[RemoteView, ...] | None = None

    def live(self) -> tuple[RemoteView, ...]:
        """The views of the replicas that are up, each `index` its place in this tuple."""
        live = self._live
        if live is None:
            live = self._live = tuple(v for v in self.views if v.up)
            for i, v in enumerate(live):
                v.index = i
        return live

    def mark_down(self, view: RemoteView, reason: str) -> None:
        """Route nothing more to a replica (said once on stderr and in `/metrics`); the requests in
        flight there are ended (`on_down`)."""
        if not view.up:
            return
        view.up = False
        self._live = None
        self.metrics.up.labels(view.name, view.pool).set(0)
        print(f"metroline: replica {view.name} down: {reason}", file=sys.stderr)
        self.on_down(view, reason)

    def mark_up(self, view: RemoteView) -> None:
        if view.up:
            return
        view.up = True
        self._live = None
        self.metrics.up.labels(view.name, view.pool).set(1)
        print(f"metroline: replica {view.name} up again", file=sys.stderr)

    async def failure(self, view: RemoteView, exc: BaseException) -> str:
        """The error of a request whose replica's connection failed. A process killed closes its
        sockets a moment before it can be reaped: up to 0.5 s is given to learn how it ended; a
        dead process or a refused connection marks the replica down."""
        handle = self.replicas[view.slot]
        if handle.kind == "process":
            for _ in range(50):
                if not handle.is_alive():
                    break
                await asyncio.sleep(0.01)
        why = handle.why_down()
        refused = isinstance(exc, aiohttp.ClientConnectorError)
        reason = "connection refused" if refused else "connection lost"
        if refused or not handle.is_alive():
            self.mark_down(view, f"{reason} ({why or type(exc).__name__})")
        return f"replica {view.name} failed: {reason}" + (f" ({why})" if why else "")

    async def poll(self, view: RemoteView, client: aiohttp.ClientSession) -> None:
        handle = self.replicas[view.slot]
        if not handle.is_alive():
            view.state = {}
            self.mark_down(view, handle.why_down() or "not running")
            return
        now = time.monotonic()
        state = None
        try:
            async with client.get(handle.url + "/v1/replica/state", headers=self.headers,
                                  timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                if r.status == 200:
                    state = await r.json()
        except aiohttp.ClientConnectorError as exc:
            self.mark_down(view, f"connection refused ({handle.why_down() or type(exc).__name__})")
            return
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        if state is not None:
            view.update(state)
            self.last_ok[view.slot] = time.monotonic()
            self.mark_up(view)  # a replica marked down on a passing error that answers again
        elif now - self.last_ok[view.slot] > self.down_after_s and len(self.live()) > 1:
            # (never the last one for slowness alone: with every replica slow, the machine is)
            self.mark_down(view, f"no answer to its health check for {self.down_after_s:g} s")

    async def run(self, client: aiohttp.ClientSession) -> None:
        """Poll every replica whose process lives, every `poll_s` seconds, until cancelled."""
        while True:
            await asyncio.gather(*(self.poll(v, client) for v in self.views
                                   if v.up or self.replicas[v.slot].is_alive()))
            await asyncio.sleep(self.poll_s)
