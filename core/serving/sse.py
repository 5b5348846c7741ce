"""Streaming a request's output: `EventStream`, the ASGI response that writes server-sent events
as the engine produces tokens, and `ChoiceText`, the text of one choice that is safe to send.

Each time the engine hands a request new tokens, its handler wakes once and writes one chunk per
choice that has new text, all in one write (`n > 1`: the choices' chunks interleave, each with its
`index`). The first token goes out in the write that follows the step that made it: there is no
batching window. Text frames are pre-encoded (`Shapes.delta`).

Disconnects: a task waits on the ASGI `receive` channel for `http.disconnect` and aborts the
request at once (its blocks are freed at the engine's next step), whether the handler is waiting
for tokens or blocked writing. A handler blocked writing (the client stopped reading and the
socket buffers are full) stops taking tokens, so the engine loop pauses the request once
`buffer_tokens` are unread; and a handler whose client's socket holds more than `buffer_bytes`
not taken pauses it at once, and cuts the stream (resets the connection) once the engine cancels
it after `stall_timeout` (see `backpressure.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from typing import Any

from ..requests.sequence import FinishReason
from . import protocol as p
from .backpressure import TRANSPORT, socket_backlog
from .quota import usage_comment
from .streams import Choice, RequestStream, StreamGroup

OPENAI_REASON = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
SOCKET_POLL_S = 0.02
"""How often a paused stream looks whether its client took what its socket holds."""
_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class ChoiceText:
    """What of a choice's text may be sent: the engine's detokenised text (it cuts stop strings
    itself), else the server tokenizer's decoding of its tokens; while the choice runs, the last
    `hold` characters (they may begin a stop string) and a trailing incomplete character wait."""

    __slots__ = ("choice", "index", "tokenizer", "hold", "sent", "first", "done", "lp_sent", "lp_offset")

    def __init__(self, choice: Choice, tokenizer: Any, hold: int, index: int = 0) -> None:
        self.choice = choice
        self.index = index  # OpenAI's index of the choice (several prompts: prompt by prompt)
        self.tokenizer = tokenizer
        self.hold = hold
        self.sent = 0
        self.first = True
        self.done = False
        self.lp_sent = 0  # tokens whose logprobs went out
        self.lp_offset = 0  # characters of those tokens' texts (a completion's text_offset)

    def text(self) -> str:
        c = self.choice
        return c.text if c.text is not None else self.tokenizer.decode(c.tokens)

    def new(self) -> str:
        """The text not sent yet that may be sent now (marked sent)."""
        text = self.text()
        if self.choice.finish_reason is None:
            upto = len(text) - self.hold
            if text.endswith("\ufffd"):
                upto = min(upto, len(text) - 1)
        else:
            upto = len(text)
        if upto <= self.sent:
            return ""
        new, self.sent = text[self.sent:upto], upto
        return new

    def new_logprobs(self, chat: bool) -> dict | None:
        """OpenAI's `logprobs` of the tokens not reported yet (marked reported); None when the
        request did not ask for them."""
        c = self.choice
        if c.logprobs is None:
            return None
        upto = len(c.tokens)
        entries = list(zip(c.tokens[self.lp_sent:upto], c.logprobs[self.lp_sent:upto]))
        body = p.logprobs_body(chat, entries, self.tokenizer, self.lp_offset)
        self.lp_sent = upto
        if not chat:
            self.lp_offset += sum(map(len, body["tokens"]))
        return body


def hold_for(stops: Any) -> int:
    """Characters to hold back so that no prefix of a stop string is sent before it completes."""
    if not stops:
        return 0
    return max(len(s) for s in ([stops] if isinstance(stops, str) else stops)) - 1


class EventStream:
    """The ASGI response of a streamed completion (an ASGI app: Starlette calls it as a
    response). `on_abort(request_id)` cancels the request when the client goes away."""

    def __init__(self, stream: RequestStream | StreamGroup, shapes: p.Shapes, tokenizer: Any, hold: int,
                 include_usage: bool, on_abort: Any, marks: list[float] | None = None, clock: Any = None,
                 writing: Any = None, usage_comment: bool = False, socket: Any = None) -> None:
        self.stream = stream
        self.shapes = shapes
        self.texts = [ChoiceText(c, tokenizer, hold, i) for i, c in enumerate(stream.choices)]
        self.include_usage = include_usage
        self.on_abort = on_abort
        self.marks = marks
        """When a list: the time of the first write of text is appended to it (`clock()`)."""
        self.clock = clock
        self.writing = writing
        """When given: `writing(1)` as the response starts, `writing(-1)` once it has ended (a
        server's drain waits for its streams' last bytes)."""
        self.socket = socket
        """When given, `(buffer_bytes, hold, release)`: past `buffer_bytes` held in the client's
        socket the handler stops writing and calls `hold(request_ids)` (the engine pauses them),
        then `release(request_ids)` once the socket holds half of that (`backpressure.py`)."""
        self.usage_comment = usage_comment
        """End the stream with the tokens it used as an SSE comment, for the front's quota
        (`metroline.core.serving.quota`)."""
        self.gone = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stream = self.stream
        if self.writing is not None:
            self.writing(1)
        watcher = asyncio.ensure_future(self._watch(receive))
        transport = scope.get(TRANSPORT) if self.socket is not None else None
        held = socket_backlog(transport) if transport is not None else None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            while not self.gone:
                await stream.wait()
                frames = self._frames()
                if frames:
                    if self.marks is not None and len(self.marks) == 1:
                        self.marks.append(self.clock())
                    await send({"type": "http.response.body", "body": frames, "more_body": True})
                if stream.finished:
                    break
                if held is not None and held() > self.socket[0] and not await self._drained(held):
                    reset(transport)  # cut: its socket held too much for too long; its blocks are freed
                    await asyncio.sleep(0)  # the protocol hears of it (the connection is lost)
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            if self.writing is not None:
                self.writing(-1)
            if not stream.finished:
                for rid in stream.request_ids:
                    self.on_abort(rid)

    async def _drained(self, held: Any) -> bool:
        """The client's socket holds more than `buffer_bytes`: pause the request until it holds
        half of that (True), or until the engine cancels it for `stall_timeout` (False: the stream
        is cut, with its reason on stderr) or the client goes."""
        limit, hold, release = self.socket
        stream, rids = self.stream, list(self.stream.request_ids)
        hold(rids)
        try:
            while not self.gone and not stream.finished:
                if held() <= limit // 2:
                    return True
                await asyncio.sleep(SOCKET_POLL_S)
        finally:
            if not stream.finished:
                release(rids)
        if stream.finished and not self.gone:
            print(f"metroline: cut the stream of {rids[0]}{' and more' if len(rids) > 1 else ''} with "
                  f"{held():,} bytes unread in its socket: {stream.error or 'cancelled'}", file=sys.stderr, flush=True)
            return False
        return not self.gone

    async def _watch(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.stream.finished:
            self.gone = True
            for rid in self.stream.request_ids:
                self.on_abort(rid)

    def _frames(self) -> bytes:
        """The frames of what the engine produced since the last write: new text of the running
        choices, the last chunk of those that ended (usage on the request's last), then, at the
        request's end, the usage chunk when asked (`stream_options.include_usage`: a chunk with no
        choices) and [DONE]."""
        stream, shapes = self.stream, self.shapes
        if stream.finish_reason in (FinishReason.FAILED, FinishReason.CANCELLED):
            msg = ((stream.error or "cancelled") if stream.finish_reason is FinishReason.CANCELLED
                   else f"the engine failed this request: {stream.error}")
            used = self._used() if self.usage_comment else ""
            return p.sse(p.error_body(msg, "server_error")) + used.encode() + p.DONE
        out: list[str] = []
        for t in self.texts:
            if t.done:
                continue
            new = t.new()
            if t.choice.finish_reason is None:
                if new:
                    if t.choice.logprobs is None:
                        out.append(shapes.delta(t.index, new, t.first))
                    else:
                        out.append(p.sse_text(shapes.chunk(new, first=t.first, index=t.index,
                                                           logprobs=t.new_logprobs(shapes.chat))))
                    t.first = False
                continue
            t.done = True
            reason = OPENAI_REASON.get(t.choice.finish_reason, "stop")
            out.append(p.sse_text(shapes.chunk(new, reason, first=t.first, index=t.index,
                                               logprobs=t.new_logprobs(shapes.chat))))
        if stream.finished and self.include_usage:  # OpenAI's: one last chunk, no choices, the usage
            use = p.usage(stream.num_prompt_tokens, stream.num_output_tokens, stream.cached_tokens)
            out.append(p.sse_text(shapes.usage_chunk(use)))
        if stream.finished:
            if self.usage_comment:
                out.append(self._used())
            out.append(p.DONE_TEXT)
        return "".join(out).encode()

    def _used(self) -> str:
        return usage_comment(self.stream.num_prompt_tokens + self.stream.num_output_tokens)


def reset(transport: Any) -> None:
    """Close the connection at once, dropping what its socket holds (a reset, not a close that
    waits to send it)."""
    sock = transport.get_extra_info("socket")
    # ValueError: uvloop's stand-in socket of a connection its client already closed (no descriptor)
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def final_texts(stream: RequestStream | StreamGroup, tokenizer: Any, chat: bool) -> list[tuple[str, str, dict | None]]:
    """(text, OpenAI finish reason, logprobs or None) of each choice of an ended request."""
    texts = [ChoiceText(c, tokenizer, 0, i) for i, c in enumerate(stream.choices)]
    return [(t.text(), OPENAI_REASON.get(t.choice.finish_reason, "stop"), t.new_logprobs(chat)) for t in texts]
