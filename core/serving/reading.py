"""Refusing before reading: a request body is read only after its key was checked (by the caller),
never past `ServeConfig.max_body_bytes`, and parsed and validated in a worker thread, not on the
event loop that writes every other stream.

`read_body(http, limit)` refuses (413) a body whose `Content-Length` is over the limit without
reading a byte of it, and one sent without a length as soon as it has passed the limit.
`parse_body(raw, chat)` is the JSON and pydantic validation of an OpenAI body (run it with
`off_loop`); a body nested too deeply for the parser answers 400, not 500.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse

from . import protocol as p
from .bodies import ChatCompletionBody, CompletionBody

T = TypeVar("T")

_POOL: ThreadPoolExecutor | None = None


class Refused(Exception):
    """A request answered with an error before it reaches the engine: its status, OpenAI's error
    fields, a `reason` (the metrics' label) and a `Retry-After` in seconds when it may come back."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, reason: str = "invalid", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.reason, self.retry_after = reason, retry_after
        self.tenant: str | None = None  # who was refused, once known (the metrics' label)

    def response(self, http: HTTPRequest | None = None) -> JSONResponse:
        """The error response; given the request, one that leaves a large body unread closes the
        connection (`Connection: close`) rather than have the server read and drop what is left."""
        headers = {} if self.retry_after is None else {"Retry-After": str(max(1, math.ceil(self.retry_after)))}
        if self.status == 413 or (http is not None and _unread(http) > DRAIN_LIMIT):
            headers["Connection"] = "close"
        return JSONResponse(p.error_body(self.message, self.type, self.param, self.code), status_code=self.status,
                            headers=headers)


DRAIN_LIMIT = 64 * 1024
"""Bytes of a refused request's unread body past which its connection is closed, not drained."""


def _unread(http: HTTPRequest) -> int:
    length = http.headers.get("content-length", "")
    if getattr(http, "_stream_consumed", False):
        return 0
    return int(length) if length.isdigit() else DRAIN_LIMIT + 1 if "chunked" in http.headers.get(
        "transfer-encoding", "") else 0


def unauthorized() -> Refused:
    return Refused(401, "missing or unknown API key (Authorization: Bearer KEY)", code="invalid_api_key",
                   reason="auth")


def too_large(size: int | str, limit: int) -> Refused:
    return Refused(413, f"the body is {size} bytes, above this server's limit of {limit} bytes (max_body_bytes)",
                   code="body_too_large", reason="too_large")


INLINE_BYTES = 32 * 1024
"""A body (or a prompt, in characters) below this is parsed (tokenized) on the event loop itself:
it takes microseconds, less than the hand-off to a worker thread and back."""


async def off_loop(fn: Callable[..., T], *args: Any, size: int | None = None) -> T:
    """`fn(*args)` in the server's worker threads (parsing, validation, tokenization), so the event
    loop goes on writing the other streams meanwhile; inline when `size` (bytes or characters of
    the work) is below `INLINE_BYTES`."""
    if size is not None and size < INLINE_BYTES:
        return fn(*args)
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="metroline-intake")
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)


async def read_body(http: HTTPRequest, limit: int) -> bytes:
    """The request's body, at most `limit` bytes; `Refused` (413) past it, before reading any of it
    when its `Content-Length` says so."""
    length = http.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise Refused(400, f"Content-Length is not a number: {length[:40]!r}")
        if int(length) > limit:
            raise too_large(int(length), limit)
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {limit}", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """The body's JSON; `Refused` (400) when it is not JSON or is nested too deeply to parse."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refused(400, "the body is nested too deeply") from None


def parse_body(raw: bytes, chat: bool) -> ChatCompletionBody | CompletionBody:
    """The validated body of a chat completion or a completion; `Refused` (400 naming the field)."""
    data = parse_json(raw)
    try:
        return (ChatCompletionBody if chat else CompletionBody).model_validate(data)
    except ValidationError as exc:
        raise Refused(400, p.describe(exc), param=p.field_of(exc)) from None
    except RecursionError:
        raise Refused(400, "the body is nested too deeply") from None
