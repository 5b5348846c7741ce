"""Bounded request heads: a request line plus headers over `MAX_HEAD_BYTES`, or more than
`MAX_HEADERS` header fields, is answered 431 and its connection closed as soon as the limit is
passed, before the app (and its key check) sees it, so a flood of headers costs the server a few
buffers and no other client a stall.

uvicorn bounds neither with httptools (its parser buffers a header of any size, and calls the
protocol only once the header is whole), so `BoundedHttpTools` counts the bytes of a head as they
arrive and the fields as they are parsed. Without httptools, uvicorn's h11 parser is bounded by
`h11_max_incomplete_event_size` (it answers 400 past it, with no count of fields).
`uvicorn_http_settings()` gives the server's and the front's uvicorn whichever applies.
"""

from __future__ import annotations

import json
from typing import Any

from .backpressure import TRANSPORT

MAX_HEAD_BYTES = 64 * 1024
"""The most bytes of a request's head (request line and headers) a server reads: four times
Node's default (16 KiB), nginx's `large_client_header_buffers` (4 x 8 KiB) twice over."""
MAX_HEADERS = 100
"""The most header fields a request may have (Apache's `LimitRequestFields`)."""


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "request_header_fields_too_large"}}).encode()
    return (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's h11 bounds the head (`uvicorn_http_settings`)
    HttpToolsProtocol = None

if HttpToolsProtocol is not None:

    class BoundedHttpTools(HttpToolsProtocol):  # type: ignore[misc, valid-type]
        """uvicorn's httptools protocol, with a request's head bounded (see the module)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_bytes = 0
            self._in_head = True
            self._fields = 0
            self._refused: str | None = None

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._refused = (f"the request's head is over {MAX_HEAD_BYTES} bytes (its request line and "
                                 "headers), this server's limit")
                self.send_400_response(self._refused)  # sends the 431 (below)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._fields = 0

        def on_header(self, name: bytes, value: bytes) -> None:
            self._fields += 1
            if self._fields > MAX_HEADERS:
                self._refused = f"the request has more than {MAX_HEADERS} header fields, this server's limit"
                raise ValueError(self._refused)  # stops the parser: uvicorn answers (below)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self.scope[TRANSPORT] = self.transport  # type: ignore[literal-required]  # a stream measures its socket
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes = True, 0  # what comes next is the next request's head

        def send_400_response(self, msg: str) -> None:
            if self._refused is None:
                super().send_400_response(msg)
                return
            self.logger.warning("refused a request: %s", self._refused)
            self.transport.write(_refusal(self._refused))
            self.transport.close()

else:  # pragma: no cover
    BoundedHttpTools = None


def uvicorn_http_settings() -> dict[str, Any]:
    """The `uvicorn.Config` keywords that bound a request's head: the bounded httptools protocol
    when httptools is installed, else h11 with its incomplete-event limit."""
    settings: dict[str, Any] = {"h11_max_incomplete_event_size": MAX_HEAD_BYTES}
    if BoundedHttpTools is not None:
        settings["http"] = BoundedHttpTools
    return settings
