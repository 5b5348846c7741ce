"""`AsyncEngine`: an `Engine` stepped by one asyncio task while requests stream in and out.

The engine is not thread-safe, so only the loop task touches it: `submit` and `abort` queue their
work, and the loop applies it between two steps. Each step runs in a worker thread
(`asyncio.to_thread`), so the event loop serving HTTP stays responsive while a step computes (or,
on the real-time simulated executor, sleeps). A cancelled request is aborted before the next step,
whose reap frees its blocks.

Each request has a `RequestStream`: its output tokens accumulate there until the handler reads them.
A reader that falls more than `buffer_tokens` tokens behind for longer than `stall_timeout` seconds
is cancelled, so a client that stops reading cannot hold blocks forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

from .engine import Engine, RequestOutput
from .request import Request
from .sequence import FinishReason


class Rejected(Exception):
    """A request refused before it reached the engine: HTTP `status`, and `retry_after` seconds
    for a 429."""

    def __init__(self, message: str, status: int = 429, retry_after: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.reason = reason or ("queue_full" if status == 429 else "unavailable")


class RequestStream:
    """One request's output as the engine produces it, for the handler that streams it.

    `tokens` holds every output token so far; `read` how many the handler has taken; `finish_reason`
    and `error` are set when the request ends."""

    __slots__ = ("request", "tokens", "text", "read", "finish_reason", "error", "full_since", "_event")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.tokens: list[int] = []
        self.text: str | None = None
        """The engine's detokenised output (None when its executor has no tokenizer)."""
        self.read = 0
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.full_since: float | None = None
        self._event = asyncio.Event()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    async def next(self) -> list[int]:
        """Wait for tokens not read yet (or the end) and take them; [] once the request has ended
        and every token was read."""
        while self.read == len(self.tokens) and not self.finished:
            self._event.clear()
            await self._event.wait()
        new = self.tokens[self.read:]
        self.read = len(self.tokens)
        self.full_since = None
        return new

    async def result(self) -> list[int]:
        """Wait for the end; every output token."""
        while not self.finished:
            await self.next()
        self.read = len(self.tokens)
        return self.tokens


class AsyncEngine:
    """Steps `engine` in a background task while requests are in flight.

    - `max_waiting`: a request submitted while that many requests wait (queued in the engine or
      about to be) is refused at once with `Rejected` (HTTP 429) instead of waiting unboundedly.
    - `ramp_s`: cold start; during the first `ramp_s` seconds after `start()`, at most
      `max_num_seqs * elapsed / ramp_s` requests (at least one) are in flight at once.
    - `buffer_tokens`, `stall_timeout`: a stream whose reader is more than `buffer_tokens` tokens
      behind for `stall_timeout` seconds is cancelled.
    - `after_step(engine, outputs)`: called on the event loop after every step (metrics).
    - `idle_poll`: seconds to wait after a step that scheduled nothing while requests wait and no
      plugin asked to be woken up at a given time.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_waiting: int | None = None,
        ramp_s: float = 0.0,
        buffer_tokens: int = 1024,
        stall_timeout: float = 30.0,
        after_step: Callable[[Engine, list[RequestOutput]], None] | None = None,
        idle_poll: float = 0.005,
    ) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.ramp_s = ramp_s
        self.buffer_tokens = buffer_tokens
        self.stall_timeout = stall_timeout
        self.after_step = after_step
        self.idle_poll = idle_poll
        self.streams: dict[str, RequestStream] = {}
        self.steps = 0
        self.failed_steps = 0
        self._pending: list[RequestStream] = []
        self._aborts: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._started_at = 0.0

    # --- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._started_at = time.monotonic()
        self._task = asyncio.create_task(self._run(), name="metroline-engine-loop")

    async def shutdown(self, drain_s: float = 0.0) -> None:
        """Refuse new requests, let those in flight finish for up to `drain_s` seconds, cancel the
        rest and stop the loop once the engine has freed their blocks."""
        self._closing = True
        deadline = time.monotonic() + drain_s
        while self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for rid in list(self.streams):
            self.abort(rid)
        self._poke()
        if self._task is not None:
            await self._task
            self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # --- requests --------------------------------------------------------------------------------

    def submit(self, request: Request) -> RequestStream:
        """Queue a validated request; its stream. Raises `Rejected` when the server is closing,
        the waiting queue is full or the cold-start ramp holds it back."""
        if self._closing or not self.running:
            raise Rejected("the server is shutting down", status=503)
        waiting = len(self.engine.scheduler.waiting) + len(self._pending)
        if self.max_waiting is not None and waiting >= self.max_waiting:
            raise Rejected(f"the waiting queue is full (max_waiting={self.max_waiting})", retry_after=1.0)
        if self.ramp_s > 0:
            elapsed = time.monotonic() - self._started_at
            if elapsed < self.ramp_s:
                cap = max(1, math.floor(self.engine.config.max_num_seqs * elapsed / self.ramp_s))
                if len(self.streams) >= cap:
                    raise Rejected(
                        f"cold start: at most {cap} requests in flight during the first {self.ramp_s} s",
                        retry_after=1.0, reason="ramp",
                    )
        stream = RequestStream(request)
        self.streams[request.request_id] = stream
        self._pending.append(stream)
        self._poke()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (a client that went away); its blocks are freed by the next step."""
        if request_id in self.streams:
            self._aborts.append(request_id)
            self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- the loop --------------------------------------------------------------------------------

    def _apply_pending(self) -> None:
        engine = self.engine
        if self._pending:
            pending, self._pending = self._pending, []
            for stream in pending:
                try:
                    engine.add_request(stream.request)
                except Exception as exc:  # validated before: only a duplicate id gets here
                    self._end(stream, FinishReason.FAILED, f"{type(exc).__name__}: {exc}")
        if self._aborts:
            aborts, self._aborts = self._aborts, []
            for rid in aborts:
                stream = self.streams.get(rid)
                if stream is not None and not engine.abort(rid):
                    self._end(stream, FinishReason.CANCELLED, None)

    def _end(self, stream: RequestStream, reason: FinishReason, error: str | None) -> None:
        stream.finish_reason = reason
        stream.error = error
        self.streams.pop(stream.request_id, None)
        stream._event.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        streams = self.streams
        now = time.monotonic()
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            if out.new_token_ids:
                stream.tokens.extend(out.new_token_ids)
                stream.text = out.seq.text
                if len(stream.tokens) - stream.read > self.buffer_tokens:
                    if stream.full_since is None:
                        stream.full_since = now
                    elif now - stream.full_since > self.stall_timeout:
                        self.abort(stream.request_id)
            if out.finished:
                self._end(stream, out.finish_reason or FinishReason.FAILED, out.seq.error)
            else:
                stream._event.set()

    def _fail_all(self, exc: BaseException) -> None:
        """A step raised (a plugin's bad answer): its requests cannot go on; the server does."""
        error = f"{type(exc).__name__}: {exc}"
        self.failed_steps += 1
        for rid, stream in list(self.streams.items()):
            with contextlib.suppress(Exception):  # the loop must outlive a broken request
                self.engine.abort(rid)
            self._end(stream, FinishReason.FAILED, error)

    async def _run(self) -> None:
        engine, wake = self.engine, self._wake
        assert wake is not None
        while True:
            self._apply_pending()
            if not engine.has_unfinished():
                if self._closing and not self._pending:
                    return
                wake.clear()
                if not (self._pending or self._aborts or self._closing):
                    await wake.wait()
                continue
            try:
                outputs = await asyncio.to_thread(engine.step)
            except Exception as exc:
                self._fail_all(exc)
                continue
            self.steps += 1
            self._dispatch(outputs)
            if self.after_step is not None:
                self.after_step(engine, outputs)
            if engine.last_plan_empty and not self._pending and not self._aborts:
                wakeup = engine.scheduler.ctx.wakeup
                timeout = self.idle_poll if wakeup is None else max(0.0, wakeup - engine.executor.now())
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except TimeoutError:
                    pass

    def describe(self) -> dict[str, Any]:
        return {"in_flight": len(self.streams), "steps": self.steps, "failed_steps": self.failed_steps}
