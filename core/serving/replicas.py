"""Replica servers behind a front (`front.py`): each one today's single-engine server in a process
of its own, on a free loopback port.

`start_local(specs, build, arg)` spawns one process per `(name, pool)` (multiprocessing "spawn"),
all at once; each calls `build(arg)` for its `(EngineConfig, ServeConfig, executor)` (the same for
every replica: `metroline serve`'s own setup), binds 127.0.0.1:0, reports the port through a pipe
and serves; the parent waits until every replica answers `/health`. A replica process exits by
itself when its parent is gone, so none is left orphaned. `ray_replicas.py` starts replicas as Ray
actors instead, with the same handle interface (`name`, `pool`, `url`, `is_alive()`, `why_down()`,
`stop()`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx


class LocalReplica:
    """A replica server in a local process: its name, pool, URL and process."""

    kind = "process"

    def __init__(self, name: str, pool: str, process: Any, url: str) -> None:
        self.name = name
        self.pool = pool
        self.process = process
        self.url = url

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def is_alive(self) -> bool:
        """Whether its process still runs."""
        return self.process.is_alive()

    def why_down(self) -> str:
        """How its process ended, in words ("" while it runs)."""
        code = self.process.exitcode
        if code is None:
            return ""
        if code < 0:
            try:
                return f"process killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"process killed by signal {-code}"
        return f"process exited with status {code}"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (the server drains), then SIGKILL after `timeout` seconds."""
        p = self.process
        if p.is_alive():
            p.terminate()
            p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(5)


def _exit_with_parent(parent: int) -> None:
    """End this process once its parent is gone (a front killed with SIGKILL leaves no replica)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="metroline-parent-watch", daemon=True).start()


def replica_main(build: Callable[[Any], tuple[Any, Any, Any]], arg: Any, parent: int, conn: Any) -> None:
    """A replica process: build the engine, report the port (or the error), serve until SIGTERM."""
    _exit_with_parent(parent)
    try:
        from .app import build_app
        from .server import make_engine, serve_app

        config, serve_config, executor = build(arg)
        serve_config = serve_config.model_copy(update={"host": "127.0.0.1", "port": 0})
        app = build_app(make_engine(config, executor), serve_config)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
    except Exception as exc:  # the parent says it in one line
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        conn.close()
        raise SystemExit(2) from None
    conn.send(("port", sock.getsockname()[1]))
    conn.close()
    serve_app(app, serve_config, sockets=[sock])


def wait_healthy(name: str, url: str, alive: Callable[[], bool], deadline: float) -> None:
    """Return once `url/health` answers 200; a `RuntimeError` naming the replica if it dies or
    the deadline passes first."""
    while True:
        if not alive():
            raise RuntimeError(f"replica {name} exited while starting")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {name} did not become healthy in time")
        time.sleep(0.05)


def start_local(specs: list[tuple[str, str]], build: Callable[[Any], tuple[Any, Any, Any]] | list[Any], arg: Any,
                start_timeout: float = 300.0) -> list[LocalReplica]:
    """Spawn one replica process per `(name, pool)` and return their handles once every one is
    healthy; if one fails to start, the others are stopped and a `RuntimeError` names it. `build`:
    one for all, or a list with one per replica (picklable: the processes are spawned)."""
    ctx = multiprocessing.get_context("spawn")
    started: list[tuple[str, str, Any, Any]] = []
    replicas: list[LocalReplica] = []
    try:
        for name, pool in specs:
            here, there = ctx.Pipe(duplex=False)
            process = ctx.Process(target=replica_main, args=(build[len(started)] if isinstance(build, list) else build,
                                                              arg, os.getpid(), there),
                                  name=f"metroline-replica-{name}", daemon=True)
            process.start()
            there.close()
            started.append((name, pool, process, here))
        deadline = time.monotonic() + start_timeout
        for name, pool, process, here in started:
            while not here.poll(0.1):
                if not process.is_alive() and not here.poll(0):
                    raise RuntimeError(f"replica {name} exited while starting (status {process.exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {name} did not start in {start_timeout:g} s")
            try:
                kind, value = here.recv()
            except EOFError:
                raise RuntimeError(f"replica {name} exited while starting (status {process.exitcode})") from None
            if kind == "error":
                raise RuntimeError(f"replica {name} failed to start: {value}")
            replicas.append(LocalReplica(name, pool, process, f"http://127.0.0.1:{value}"))
        for r in replicas:
            wait_healthy(r.name, r.url, r.is_alive, deadline)
    except BaseException:
        for _, _, process, _ in started:
            if process.is_alive():
                process.kill()
                process.join(5)
        raise
    return replicas


def stop_all(replicas: list[Any], timeout: float = 10.0) -> None:
    """Stop every replica (SIGTERM all of them first, so they drain together)."""
    for r in replicas:
        proc = getattr(r, "process", None)
        if proc is not None and proc.is_alive():
            proc.terminate()
    for r in replicas:
        r.stop(timeout)
