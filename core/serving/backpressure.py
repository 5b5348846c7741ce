"""`Backpressure`: the plugin that pauses the requests whose client stopped reading.

Design: a paused request keeps everything it holds (its KV blocks, its place in `running`) and is
simply not served: `order_running` leaves it out (so it gets no decode token nor prefill chunk)
and `admission` passes it over if it is queued (preempted meanwhile, it is not brought back for
nothing). Nothing it will need again is freed, so resuming costs no recomputation: the next step
decodes it where it stopped. Its blocks stay taken while it is paused; when memory runs short the
policy's `select_victim` may still preempt it like any running request (its tokens are kept), and
its own cancellation after `stall_timeout` frees them for good. It also keeps its slot
(`max_num_seqs`): a server that expects many slow readers lowers `stall_timeout` (or raises
`buffer_tokens`) so that paused requests do not crowd out new ones for long.

While something is paused the plugin asks to be woken up (`ctx.wake_at`) at the earliest pause
deadline, so a step that schedules nothing because every runnable request is paused is the
plugins' choice (the core's rescue does not serve a paused request) and the loop wakes up in time
to cancel it.

`AsyncEngine` owns the pause set (`pause`, `resume`); the hooks only read it, so a step running in
a worker thread sees at worst a pause one step late.

Two things pause a stream: its reader `buffer_tokens` behind in the server's own buffer, and its
socket holding more than `buffer_bytes` that the client has not taken (the transport's buffer
plus the kernel's send queue, `socket_backlog`; the bytes a client leaves unread in its own
receive buffer are its memory, not the server's): the handler then stops writing and pauses the
request at once (`AsyncEngine.hold`), and resumes it (`AsyncEngine.release`) once the socket holds
half of that.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..plugins.candidates import Candidates
from ..plugins.hookspecs import hookimpl
from ..requests.sequence import Sequence


class Backpressure:
    """Holds back the requests in `paused` (request id -> the engine time its pause began).

    `deadline` is the earliest time a paused request is due to be cancelled (None when none is
    paused); `AsyncEngine` keeps it up to date."""

    name = "backpressure"

    def __init__(self) -> None:
        self.paused: dict[str, float] = {}
        self.deadline: float | None = None

    def pause(self, request_id: str, now: float, timeout: float) -> None:
        if request_id not in self.paused:
            self.paused[request_id] = now
            self._update(timeout)

    def resume(self, request_id: str, timeout: float) -> bool:
        """Unpause; True if the request was paused."""
        if self.paused.pop(request_id, None) is None:
            return False
        self._update(timeout)
        return True

    def overdue(self, now: float, timeout: float) -> list[str]:
        """The requests paused for longer than `timeout` (they leave the pause set)."""
        if self.deadline is None or now < self.deadline:
            return []
        late = [rid for rid, since in self.paused.items() if now - since >= timeout]
        for rid in late:
            del self.paused[rid]
        self._update(timeout)
        return late

    def _update(self, timeout: float) -> None:
        self.deadline = min(self.paused.values()) + timeout if self.paused else None

    def _holding(self, ctx: Any) -> dict[str, float] | None:
        """The pause set when a request is paused (asking to be woken up at the first deadline),
        else None."""
        if not self.paused:
            return None
        if self.deadline is not None:
            ctx.wake_at(self.deadline)
        return self.paused

    @hookimpl(wrapper=True)
    def order_running(self, ctx: Any, running: list[Sequence]) -> Iterable[Sequence] | None:
        order = yield
        paused = self._holding(ctx)
        return order if paused is None or order is None else [s for s in order if s.request_id not in paused]

    @hookimpl(wrapper=True)
    def admission(self, ctx: Any) -> Iterable[Sequence] | None:
        answer = yield
        paused = self._holding(ctx)
        if paused is None or answer is None:
            return answer
        return Candidates.of(answer).filter(lambda s: s.request_id not in paused)


TRANSPORT = "metroline.transport"
"""The ASGI scope key under which the server's HTTP protocol (`header_limits.BoundedHttpTools`)
hands a request's handler its connection's transport, to measure what its socket holds."""


def socket_backlog(transport: Any) -> Callable[[], int] | None:
    """A function giving the bytes written to `transport` that its client has not taken: the
    transport's own buffer plus the kernel's send queue (`TIOCOUTQ`: not yet sent or not yet
    acknowledged); None where they cannot be read (no socket, not Linux)."""
    try:
        import fcntl
        import termios

        fd = transport.get_extra_info("socket").fileno()
        fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, ImportError, OSError, ValueError):
        return None
    ioctl, outq, size = fcntl.ioctl, termios.TIOCOUTQ, transport.get_write_buffer_size

    def held() -> int:
        try:
            queued = int.from_bytes(ioctl(fd, outq, b"\0\0\0\0"), sys.byteorder, signed=True)
        except OSError:
            queued = 0
        return size() + queued

    return held
