"""A client that hangs up while its answer is computed: `until_disconnect(http, work)` awaits
`work` and cancels it (raising `ClientGone`) as soon as the client closes its connection, so a
non-streamed request whose client went away stops running (a stream learns of it when a write
fails: `metroline.core.serving.sse`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import Request as HTTPRequest


class ClientGone(Exception):
    """The client hung up."""


async def until_disconnect(http: HTTPRequest, work: Any) -> Any:
    """`await work`, cancelled (and `ClientGone` raised) if the client hangs up meanwhile. The
    request's body must have been read: what the connection receives next is its end."""
    async def gone() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise ClientGone
    return task.result()
