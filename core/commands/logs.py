"""Where the `--debug` events go: stderr, one line each, so that stdout holds only the report."""

from __future__ import annotations

import sys

from ..results.progress import is_terminal


class _Stderr:
    """Whatever `sys.stderr` is when an event is written (a test may replace it), one whole line
    per write: the worker processes of `compare` share the file, and a line written in pieces
    could be cut by another process's line."""

    def __init__(self) -> None:
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        text, self._pending = "".join(self._pending), []
        sys.stderr.write(text)
        sys.stderr.flush()


def log_to_stderr() -> None:
    """Send structlog's events to stderr: the event name, then its fields as key=value (the
    policy, the request, its tenant, the step, the clock `t`), without timestamps (`t` is the
    engine's clock); coloured on a terminal."""
    import structlog

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.dev.ConsoleRenderer(colors=is_terminal(sys.stderr), sort_keys=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),
        cache_logger_on_first_use=False,
    )
