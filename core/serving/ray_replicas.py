"""Replica servers as Ray actors (`metroline serve --replicas N --ray [ADDRESS]`): each actor builds
its engine and serves today's single-engine app in its own process, on whatever node Ray places
it, and reports `host:port`; the front (`front.py`) proxies to it as to a local replica. Ray is
imported only here, and only when asked for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .replicas import wait_healthy


class ReplicaActor:
    """The body of a replica actor: `start()` builds the engine and serves it on a free port of the
    actor's node; `address()` is `(host, port)`, `pid()` its process."""

    def __init__(self, build: Callable[[Any], tuple[Any, Any, Any]], arg: Any) -> None:
        self._build = build
        self._arg = arg
        self._thread: Any = None

    def start(self) -> tuple[str, int]:
        import ray

        from .app import build_app
        from .server import AppThread, make_engine

        config, serve_config, executor = self._build(self._arg)
        app = build_app(make_engine(config, executor), serve_config)
        self._thread = AppThread(app, serve_config, start_timeout=600.0, host="0.0.0.0").start()
        return ray.util.get_node_ip_address(), self._thread.port

    def pid(self) -> int:
        import os

        return os.getpid()

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.stop()
            self._thread = None


class RayReplica:
    """A replica served by a Ray actor: the handle the front uses (`name`, `pool`, `url`,
    `is_alive()`, `why_down()`, `stop()`). Ray tells the front of no death at once: a dead actor
    is found by its connection failing."""

    kind = "ray"

    def __init__(self, name: str, pool: str, actor: Any, url: str, pid: int) -> None:
        self.name = name
        self.pool = pool
        self.actor = actor
        self.url = url
        self.pid = pid
        self._stopped = False

    def is_alive(self) -> bool:
        return not self._stopped

    def why_down(self) -> str:
        return "stopped" if self._stopped else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (it drains), then end the actor."""
        import ray

        if self._stopped:
            return
        self._stopped = True
        try:
            ray.get(self.actor.stop.remote(), timeout=timeout)
        except Exception:  # the actor may be dead already: ending it is all that is left
            pass
        ray.kill(self.actor)


def start_ray(specs: list[tuple[str, str]], build: Callable[[Any], tuple[Any, Any, Any]] | list[Any], arg: Any,
              address: str = "", num_cpus: float = 1, start_timeout: float = 600.0) -> list[RayReplica]:
    """One actor per `(name, pool)` on the Ray cluster at `address` ("" : `$RAY_ADDRESS`, else a
    new local one), each serving a replica; their handles once every one is healthy."""
    from ..experiments.ray_runner import connect

    ray = connect(address)
    actor_class = ray.remote(num_cpus=num_cpus, max_restarts=0)(ReplicaActor)
    builds = build if isinstance(build, list) else [build] * len(specs)
    actors = [(name, pool, actor_class.remote(b, arg)) for (name, pool), b in zip(specs, builds, strict=True)]
    replicas: list[RayReplica] = []
    try:
        starts = [a.start.remote() for _, _, a in actors]
        deadline = time.monotonic() + start_timeout
        for (name, pool, actor), started in zip(actors, starts, strict=True):
            try:
                host, port = ray.get(started, timeout=max(1.0, deadline - time.monotonic()))
            except Exception as exc:
                raise RuntimeError(f"replica {name} failed to start on Ray: {type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
            replicas.append(RayReplica(name, pool, actor, f"http://{host}:{port}", ray.get(actor.pid.remote())))
        for r in replicas:
            wait_healthy(r.name, r.url, r.is_alive, deadline)
    except BaseException:
        for _, _, actor in actors:
            ray.kill(actor)
        raise
    return replicas
