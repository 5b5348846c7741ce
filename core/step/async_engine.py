"""`AsyncEngine`: an `Engine` stepped by one asyncio task while requests stream in and out.

The engine is not thread-safe, so only the loop task steps it: `submit` and `abort` queue their
work, and the loop applies it between two steps. Where a step runs:

- an executor that can defer its wait (`executor.deferred`, the real-time simulated one) steps on
  the event loop itself: the step's CPU work runs there, then the loop sleeps asynchronously until
  the step's modeled end (`executor.ready_at`) and hands the tokens out. No thread, so no
  interpreter-lock hand-off between the loop and a stepping thread (on a loaded machine a thread
  descheduled while holding the lock stalls every HTTP write behind it);
- any other executor (a real model) steps in a worker thread (`asyncio.to_thread`), so the loop
  keeps serving HTTP while the device computes.

Each request has a `RequestStream`: its output accumulates there, one `Choice` per sample
(`n > 1`), until the handler reads it. Backpressure: a stream whose reader is `buffer_tokens`
tokens behind is paused (the `Backpressure` plugin: the engine stops serving it and frees nothing),
resumed as soon as its reader catches up, and cancelled once paused for `stall_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import PluginError
from ..requests.request import Request
from ..requests.sequence import FinishReason
from ..serving.backpressure import Backpressure
from ..serving.streams import Choice, Rejected, RequestStream, request_end
from .engine import Engine, RequestOutput

_yield_cpu = getattr(os, "sched_yield", lambda: None)
_SPIN = 0.001  # seconds before a step's end at which the loop stops sleeping on a timer (`_step`)

__all__ = ["AsyncEngine", "Choice", "Rejected", "RequestStream"]


class AsyncEngine:
    """Steps `engine` in a background task while requests are in flight.

    - `max_waiting`: a request submitted while that many requests wait (queued in the engine or
      about to be) is refused at once with `Rejected` (HTTP 429) instead of waiting unboundedly.
    - `ramp_s`: cold start; during the first `ramp_s` seconds after `start()`, at most
      `max_num_seqs * elapsed / ramp_s` requests (at least one) are in flight at once.
    - `buffer_tokens`, `stall_timeout`: a stream whose reader is `buffer_tokens` tokens behind is
      paused; paused for `stall_timeout` seconds, it is cancelled.
    - `after_step(engine, outputs)`: called on the event loop after every step (metrics).
    - `on_end(stream)`: called on the event loop when a request has ended (a quota's refund).
    - `on_plugin_error(error)`: called on the event loop for each `PluginError` a step raised
      (metrics); the requests it failed end with it, the others are served on.
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
        on_end: Callable[[RequestStream], None] | None = None,
        on_plugin_error: Callable[[PluginError], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.ramp_s = ramp_s
        self.buffer_tokens = buffer_tokens
        self.stall_timeout = stall_timeout
        self.after_step, self.on_end, self.idle_poll = after_step, on_end, idle_poll
        self.on_plugin_error = on_plugin_error
        self.plugin_errors = 0
        self.streams: dict[str, RequestStream] = {}
        self.steps = self.failed_steps = self.pauses = self.socket_pauses = 0
        self.backpressure = Backpressure()
        engine.plugins.add(Backpressure.name, self.backpressure)
        self._inline = hasattr(engine.executor, "deferred")
        self._pending: list[RequestStream] = []
        self._firsts = 0
        self._aborts: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._started_at = 0.0

    # --- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._started_at = time.monotonic()
        if self._inline:
            self.engine.executor.deferred = True
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
        if self._inline:
            self.engine.executor.deferred = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # --- requests --------------------------------------------------------------------------------

    def submit(self, request: Request, event: asyncio.Event | None = None) -> RequestStream:
        """Queue a validated request; its stream (waking `event` when given: a `StreamGroup`'s).
        Raises `Rejected` when the server is closing, the queue is full or the ramp holds it back."""
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
        stream = RequestStream(request, self._caught_up, event)
        self.streams[request.request_id] = stream
        self._pending.append(stream)
        self._poke()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a request (a client that went away); its blocks are freed by the next step."""
        if request_id in self.streams:
            self._aborts.append(request_id)
            self._poke()

    def hold(self, request_ids: list[str]) -> None:
        """Pause these requests now: their client's socket holds more than it may (`EventStream`,
        `buffer_bytes`); cancelled after `stall_timeout` as any paused request."""
        now = self.engine.executor.now()
        for rid in request_ids:
            if rid in self.streams and rid not in self.backpressure.paused:
                self.backpressure.pause(rid, now, self.stall_timeout)
                self.pauses += 1
                self.socket_pauses += 1

    def release(self, request_ids: list[str]) -> None:
        """Resume requests `hold` paused: their client took what its socket held."""
        for rid in request_ids:
            if self.backpressure.resume(rid, self.stall_timeout):
                self._poke()

    def is_paused(self, request_id: str) -> bool:
        return request_id in self.backpressure.paused

    def _caught_up(self, stream: RequestStream) -> None:
        if self.backpressure.resume(stream.request_id, self.stall_timeout):
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
        bp = self.backpressure
        if bp.deadline is not None:
            for rid in bp.overdue(engine.executor.now(), self.stall_timeout):
                self._aborts.append(rid)  # paused too long: the client is gone in all but name
                stream = self.streams.get(rid)
                if stream is not None and stream.error is None:
                    stream.error = (f"cancelled: the client took none of this stream's output for "
                                    f"{self.stall_timeout:g} s (stall_timeout)")
        if self._aborts:
            aborts, self._aborts = self._aborts, []
            for rid in aborts:
                bp.resume(rid, self.stall_timeout)
                stream = self.streams.get(rid)
                if stream is not None and not engine.abort(rid):
                    self._end(stream, FinishReason.CANCELLED, None)

    def _end(self, stream: RequestStream, reason: FinishReason, error: str | None) -> None:
        stream.finish_reason = reason
        stream.error = error
        self.streams.pop(stream.request_id, None)
        self.backpressure.resume(stream.request_id, self.stall_timeout)
        stream._event.set()
        if self.on_end is not None:
            self.on_end(stream)

    def _dispatch(self, outputs: list[RequestOutput]) -> list[RequestStream]:
        """Hand the step's tokens to their streams, end those that ended, pause those whose reader
        is too far behind; returns the streams to wake, those that got their first token first."""
        streams = self.streams
        firsts: dict[str, RequestStream] = {}
        touched: dict[str, RequestStream] = {}
        for out in outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue
            seq = out.seq
            choice = stream.choices[seq.index]
            if not choice.tokens and seq.index == 0:
                firsts[out.request_id], stream.cached_tokens = stream, seq.num_cached_prompt_tokens
            else:
                touched[out.request_id] = stream
            if out.new_token_ids:
                choice.tokens.extend(out.new_token_ids)
                choice.text, choice.logprobs = seq.text, seq.logprobs
                stream.unread += len(out.new_token_ids)
            if out.finished:
                choice.finish_reason = seq.finish_reason or FinishReason.FAILED
                stream._live.discard(seq.index)
                if seq.error and stream.error is None:
                    stream.error = seq.error
            else:
                stream._live.add(seq.index)
        limit, bp = self.buffer_tokens, self.backpressure
        wake = []
        for stream in (*firsts.values(), *(s for rid, s in touched.items() if rid not in firsts)):
            if not stream._live:
                self._end(stream, request_end(stream.choices), stream.error)
            else:
                if stream.unread >= limit and stream.request_id not in bp.paused:
                    bp.pause(stream.request_id, self.engine.executor.now(), self.stall_timeout)
                    self.pauses += 1
                wake.append(stream)
        self._firsts = len(firsts)
        return wake

    async def _wake_readers(self, wake: list[RequestStream]) -> None:
        """Wake the handlers of `wake`. Those with a first token run (and write it) before the loop
        goes on to the next step; the others write while that step computes."""
        firsts = self._firsts
        for stream in wake[:firsts]:
            stream._event.set()
        if firsts:
            await asyncio.sleep(0)
            # the writes wake their readers with a hint that this thread is about to block, so
            # Linux may queue a reader on this CPU; the loop goes on working (the other streams,
            # the next step), so give the CPU up once now (a no-op when nothing else waits for it)
            _yield_cpu()
        for stream in wake[firsts:]:
            stream._event.set()

    def _plugin_failed(self, exc: PluginError) -> list[RequestOutput]:
        """A step raised a plugin's error: the engine has failed the requests it concerns (one
        request, for an error of that request's own; else those the step left in doubt) and
        serves the others on. Their ends are in the error's outputs; it is logged, with the
        requests it failed, to stderr."""
        self.failed_steps += 1
        self.plugin_errors += 1
        outputs = exc.outputs if exc.outputs is not None else []
        failed = sorted({o.request_id for o in outputs if o.finished and o.seq.finish_reason is FinishReason.FAILED})
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        print(f"metroline: {exc} (failed {len(failed)} request{'s' * (len(failed) != 1)}"
              f"{': ' + shown if failed else ''})", file=sys.stderr, flush=True)
        if self.on_plugin_error is not None:
            self.on_plugin_error(exc)
        return outputs

    def _fail_all(self, exc: BaseException) -> None:
        """A step raised an error that is no plugin's (the engine's own state is in doubt): every
        request in flight fails; the server goes on."""
        error = f"{type(exc).__name__}: {exc}"
        self.failed_steps += 1
        print(f"metroline: a step failed every request in flight: {error}", file=sys.stderr, flush=True)
        for rid, stream in list(self.streams.items()):
            with contextlib.suppress(Exception):  # the loop must outlive a broken request
                self.engine.abort(rid)
            self._end(stream, FinishReason.FAILED, error)

    async def _step(self) -> list[RequestOutput]:
        engine = self.engine
        if not self._inline:
            return await asyncio.to_thread(engine.step)
        outputs = engine.step()
        executor = engine.executor
        if not engine.last_plan_empty:
            # the loop's timers are coarse (uvloop: 1 ms): a timer until `_SPIN` before the end,
            # then yield to the loop (it still serves I/O) until the end: tokens go out on time
            while (left := executor.ready_at - executor.now()) > 0:
                await asyncio.sleep(left - _SPIN if left > _SPIN else 0)
        return outputs

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
                outputs = await self._step()
            except PluginError as exc:
                outputs = self._plugin_failed(exc)
            except Exception as exc:
                self._fail_all(exc)
                continue
            self.steps += 1
            await self._wake_readers(self._dispatch(outputs))
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
        return {"in_flight": len(self.streams), "steps": self.steps, "failed_steps": self.failed_steps,
                "plugin_errors": self.plugin_errors,
                "paused": len(self.backpressure.paused), "pauses": self.pauses,
                "socket_pauses": self.socket_pauses}
