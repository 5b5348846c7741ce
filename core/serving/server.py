"""Running the app: `make_engine` for `metroline serve`, `serve` (uvicorn, blocking, SIGTERM drains)
and `ServerThread` (in-process on an ephemeral loopback port, for tests and benches; `AppThread`
for any app)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn

from ..config import EngineConfig
from ..step.engine import Engine
from .app import build_app
from .header_limits import uvicorn_http_settings
from .tenants import ServeConfig
from .tokens import ContentTokens


def make_engine(config: EngineConfig, executor: Any, plugins: list[Any] = ()) -> Engine:
    """An engine for serving: it forgets ended requests; on a simulated executor (no logits) its
    stand-in tokens depend only on each request's own tokens (`ContentTokens`)."""
    extra = list(plugins)
    if getattr(executor, "name", "") == "sim":
        extra.append(ContentTokens())
    return Engine(config, executor, plugins=extra, retain_finished=False)


KEEP_ALIVE_S = 30
"""Seconds an idle HTTP connection stays open (uvicorn's `timeout_keep_alive`); a front's client
lets its own go sooner (`metroline.core.serving.front_proxy`), so it never reuses one the server is
closing."""


def _uvicorn_config(app: Any, serve: ServeConfig, port: int | None = None) -> uvicorn.Config:
    # uvicorn picks httptools and uvloop when installed (the `serve` extra); no access log and no
    # proxy-header middleware: nothing here reads the client's address, and every streamed chunk
    # resumes the whole middleware stack
    return uvicorn.Config(
        app, host=serve.host, port=serve.port if port is None else port, log_level="warning",
        timeout_graceful_shutdown=2, lifespan="on", access_log=False, proxy_headers=False,
        timeout_keep_alive=KEEP_ALIVE_S, **uvicorn_http_settings(),  # a request's head bounded: 431
    )


class DrainingServer(uvicorn.Server):
    """uvicorn, draining the app before it closes connections: on SIGTERM (or `should_exit`) it
    stops accepting, awaits the app's `app.state.drain()` (streams finish within `drain_s`, the
    rest end with an error event and `[DONE]`), then shuts down as uvicorn does: nothing is left
    for its graceful timeout to cancel."""

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        state = getattr(self.config.app, "state", None)
        drain = getattr(state, "drain", None) if state is not None else None
        if drain is not None and not self.force_exit:
            for server in self.servers:
                server.close()  # stop accepting
            await drain()
        await super().shutdown(sockets)


def serve(engine: Engine, serve_config: ServeConfig, tokenizer: Any = None, on_stop: Any = None,
          on_listen: Any = None) -> None:
    """Serve until SIGINT/SIGTERM: the server stops accepting, in-flight streams get `drain_s`
    seconds to finish, then the engine loop cancels the rest (each ends with an error event and
    `[DONE]`) and frees their blocks; then `on_stop(server)` (the app's `Server`), if given.
    `on_listen(port)`: as in `serve_app`."""
    app = build_app(engine, serve_config, tokenizer)
    app.state.server.on_stop = on_stop
    serve_app(app, serve_config, on_listen=on_listen)


def serve_app(app: Any, serve_config: ServeConfig, sockets: list[Any] | None = None, on_listen: Any = None) -> None:
    """Serve any ASGI app with the server's uvicorn settings until SIGINT/SIGTERM, on `sockets`
    (already bound) when given, else on a socket bound here to `serve_config`'s host and port;
    `on_listen(port)`, if given, is called with the port it listens on (the one the system chose
    for port 0) once bound, before serving: so a caller asking for port 0 learns its port with no
    window in which another process could take it."""
    config = _uvicorn_config(app, serve_config)
    if sockets is None:
        sockets = [config.bind_socket()]
    if on_listen is not None:
        on_listen(sockets[0].getsockname()[1])
    DrainingServer(config).run(sockets=sockets)


class AppThread:
    """Any ASGI app on `host` (127.0.0.1) and an ephemeral port, in a background thread; a context
    manager (`ServerThread` serves an engine's app; the replicas' front and the Ray replicas use it
    as it is)."""

    def __init__(self, app: Any, serve: ServeConfig | None = None, start_timeout: float = 20.0,
                 host: str = "127.0.0.1") -> None:
        serve = (serve or ServeConfig()).model_copy(update={"host": host, "port": 0})
        self.app = app
        self._uv = DrainingServer(_uvicorn_config(self.app, serve))
        self._uv.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._run, name="metroline-server", daemon=True)
        self._start_timeout = start_timeout
        self.port = 0

    def _run(self) -> None:
        factory = getattr(self._uv.config, "get_loop_factory", lambda: None)()  # uvloop when installed
        if factory is None:
            asyncio.run(self._uv.serve())
        else:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(self._uv.serve())

    def __enter__(self) -> AppThread:
        self.start()
        return self

    def start(self) -> AppThread:
        """Start serving; return once the app accepts connections (its lifespan has started)."""
        self._thread.start()
        import time

        deadline = time.monotonic() + self._start_timeout
        while not self._uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self._uv.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout: float = 30.0) -> None:
        """Stop accepting, let the app's lifespan end, and join the thread."""
        self._uv.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._uv.force_exit = True
            self._thread.join(5)
            raise RuntimeError("the server did not stop in time; forced it")

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class ServerThread(AppThread):
    """The app on 127.0.0.1 and an ephemeral port, in a background thread; a context manager.

    ```python
    with ServerThread(engine, ServeConfig()) as srv:
        httpx.get(srv.url + "/health")
    ```
    """

    def __init__(self, engine: Engine, serve: ServeConfig | None = None, tokenizer: Any = None,
                 start_timeout: float = 20.0) -> None:
        serve = (serve or ServeConfig()).model_copy(update={"host": "127.0.0.1", "port": 0})
        super().__init__(build_app(engine, serve, tokenizer), serve, start_timeout)
        self.server_state = self.app.state.server
        self.engine = engine

    def __enter__(self) -> ServerThread:
        self.start()
        return self
