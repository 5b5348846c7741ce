"""The front's pages besides the completions (`metroline.core.serving.front`): `/v1/models`,
`/health`, `/metrics`, and the operator's `/v1/replicas`, `/v1/canary`, `/replicas/NAME/metrics`
(behind `ServeConfig.operator_keys` when tenants are configured: `Tenants.may_read`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from . import protocol as p
from .front_proxy import TRANSPORT_ERRORS
from .reading import unauthorized


def error(status: int, message: str, type_: str = "server_error") -> JSONResponse:
    return JSONResponse(p.error_body(message, type_), status_code=status)


class FrontPages:
    """The read-only routes of the front (`metroline.core.serving.front.Front` holds one): it
    receives what it reads, the serve config, the tenants (who may read what), the replicas and
    their views, the health checks, the metrics, the canary (or None), the proxy (its client) and
    when the front started (`created`, the model card's)."""

    def __init__(self, serve: Any, tenants: Any, replicas: list[Any], views: list[Any], health: Any, metrics: Any,
                 canary: Any, proxy: Any, created: int) -> None:
        self.serve = serve
        self.tenants = tenants
        self.replicas = replicas
        self.views = views
        self.health = health
        self.metrics = metrics
        self.canary = canary
        self.proxy = proxy
        self.created = created

    def _may(self, http: HTTPRequest, what: str) -> bool:
        return self.tenants.may_read(http.headers.get("authorization"), what)

    async def models(self, http: HTTPRequest) -> Response:
        if not self._may(http, "models"):
            return unauthorized().response()
        card = {"id": self.serve.model, "object": "model", "created": self.created, "owned_by": "metroline"}
        return JSONResponse({"object": "list", "data": [card]})

    async def health_route(self, http: HTTPRequest) -> Response:
        replicas = {v.name: v.up for v in self.views}
        if not any(replicas.values()):
            return JSONResponse({**p.error_body("no replica is up", "server_error"), "replicas": replicas},
                                status_code=503)
        return JSONResponse({"status": "ok", "replicas": replicas})

    async def replicas_state(self, http: HTTPRequest) -> Response:
        """`GET /v1/replicas` (an operator's): each replica's name, pool, URL, whether it is up,
        the front's outstanding counts, its last polled state and how old that is (null for a
        replica whose process has ended)."""
        if not self._may(http, "operator"):
            return unauthorized().response()
        now = time.monotonic()
        return JSONResponse({"replicas": [
            {"name": v.name, "pool": v.pool, "url": self.replicas[v.slot].url, "pid": getattr(self.replicas[v.slot],
                                                                                               "pid", None), "up": v.up,
             "outstanding_requests": v.outstanding_requests, "outstanding_tokens": v.outstanding_tokens,
             "state": v.state if self.replicas[v.slot].is_alive() else None,
             "state_age_s": round(now - self.health.last_ok[v.slot], 3)}
            for v in self.views]})

    async def canary_report(self, http: HTTPRequest) -> Response:
        """`GET /v1/canary` (an operator's): each canary pool's arms, their rows and their
        comparison (`front_canary.py`); 404 without a canary."""
        if not self._may(http, "operator"):
            return unauthorized().response()
        if self.canary is None:
            return error(404, "no pool of this cluster has a canary ([cluster.pools.NAME.canary])",
                         "invalid_request_error")
        return JSONResponse(await asyncio.to_thread(self.canary.report))

    async def prometheus(self, http: HTTPRequest) -> Response:
        if not self._may(http, "metrics"):
            return unauthorized().response()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def replica_metrics(self, http: HTTPRequest) -> Response:
        """`GET /replicas/<name>/metrics` (an operator's): that replica's own Prometheus text."""
        if not self._may(http, "metrics"):
            return unauthorized().response()
        name = http.path_params["name"]
        view = next((v for v in self.views if v.name == name), None)
        if view is None:
            return error(404, f"no replica named {name!r} ({', '.join(v.name for v in self.views)})",
                         "invalid_request_error")
        headers = {k: v for k, v in http.headers.items() if k == "authorization"}
        try:
            async with self.proxy.client.get(self.replicas[view.slot].url + "/metrics", headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                content, status, media_type = await r.read(), r.status, r.headers.get("content-type")
        except TRANSPORT_ERRORS as exc:
            return error(502, f"replica {name} failed: {type(exc).__name__}")
        return Response(content, status_code=status, media_type=media_type)
