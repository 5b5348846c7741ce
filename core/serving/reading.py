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
import re
import sys
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


def authorization(http: HTTPRequest) -> str | None:
    """The request's one `Authorization` header (None without one); `Refused` (400) when it has
    several: which one names the tenant would be a guess (a front and its replica could guess
    differently, routing as one tenant and billing another)."""
    values = http.headers.getlist("authorization")
    if len(values) > 1:
        raise Refused(400, f"the request has {len(values)} Authorization headers; send one",
                      param="Authorization", code="duplicate_header", reason="auth")
    return values[0] if values else None


def unauthorized() -> Refused:
    return Refused(401, "missing or unknown API key (Authorization: Bearer KEY)", code="invalid_api_key",
                   reason="auth")


def too_large(size: int | str, limit: int) -> Refused:
    return Refused(413, f"the body is {size} bytes, above this server's limit of {limit} bytes (max_body_bytes)",
                   code="body_too_large", reason="too_large")


def check_batch(body: Any, chat: bool, max_waiting: int) -> None:
    """Refuse (413) a completion whose batch has more prompts than `max_waiting`: it could never be
    queued whole, so it is refused as too large rather than told to come back (429)."""
    if chat:
        return
    count = len(p.prompts_of(body.prompt))
    if count > max_waiting:
        raise Refused(413, f"a batch of {count} prompts can never be queued whole: at most "
                      f"max_waiting={max_waiting} requests wait at once", param="prompt", code="batch_too_large",
                      reason="too_large")


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


class _LongInteger:
    """Stands for a JSON integer of more digits than Python converts (`sys.get_int_max_str_digits`),
    so that the refusal can name the field it is in."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
"""A `\\uD800`-`\\uDFFF` escape: the only way a JSON body can carry a lone surrogate."""


def parse_json(raw: bytes) -> Any:
    """The body's JSON; `Refused` (400) when it is not JSON, is nested too deeply to parse, holds an
    integer of more digits than Python converts or a string with a lone UTF-16 surrogate (no
    character: it cannot be encoded to UTF-8), the last two naming the field."""
    long_ints: list[_LongInteger] = []

    def parse_int(text: str) -> Any:
        try:
            return int(text)
        except ValueError:  # past the int-str digit limit
            long_ints.append(_LongInteger(len(text.lstrip("-"))))
            return long_ints[-1]

    try:
        data = json.loads(raw, parse_int=parse_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refused(400, "the body is nested too deeply") from None
    if long_ints:
        path, value = _find(data, lambda x: isinstance(x, _LongInteger))
        raise Refused(400, f"{path or 'the body'}: an integer of {value.digits} digits is out of range (at most "
                      f"{sys.get_int_max_str_digits()} digits are read, and every field's own bound is far below)",
                      param=path or None)
    if _SURROGATE_ESCAPE.search(raw):
        found = _find(data, _lone_surrogate)
        if found is not None:
            path = found[0]
            raise Refused(400, f"{path or 'the body'}: a string holds a lone UTF-16 surrogate (an unpaired "
                          "\\uD800-\\uDFFF escape), which is no character", param=path or None)
    return data


def _lone_surrogate(x: Any) -> bool:
    if not isinstance(x, str):
        return False
    try:
        x.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _find(data: Any, bad: Callable[[Any], bool]) -> tuple[str, Any] | None:
    """The dotted path (`messages.0.content`) and the value of the first item of `data` (keys
    included) for which `bad` holds, walked without recursion; None when none does."""
    def dotted(path: tuple) -> str:  # a key that is itself bad is shown escaped
        return ".".join(str(p).encode("utf-8", "backslashreplace").decode("utf-8") for p in path)

    stack: list[tuple[tuple, Any]] = [((), data)]
    while stack:
        path, x = stack.pop()
        if bad(x):
            return dotted(path), x
        if isinstance(x, dict):
            for k, v in reversed(list(x.items())):
                if bad(k):
                    return dotted((*path, k)), k
                stack.append(((*path, k), v))
        elif isinstance(x, list):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(x))))
    return None


def parse_body(raw: bytes, chat: bool) -> ChatCompletionBody | CompletionBody:
    """The validated body of a chat completion or a completion; `Refused` (400 naming the field)."""
    data = parse_json(raw)
    try:
        return (ChatCompletionBody if chat else CompletionBody).model_validate(data)
    except ValidationError as exc:
        raise Refused(400, p.describe(exc), param=p.field_of(exc)) from None
    except RecursionError:
        raise Refused(400, "the body is nested too deeply") from None
