"""Progress bars on the terminal, drawn by rich: `ProgressBar` for one run, `ProgressBoard` for
several runs going on at once (one line per run, labelled with its policy).

Both are off by default unless their stream is a terminal, and import rich only when they first
draw, so a run without a bar (a pipe, CI, a test) never loads it. `ProgressBar.update` runs once
per engine step: it reads the clock only every few calls and redraws at most 10 times a second.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal (False for anything without a working `isatty`)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


def _rich_progress(stream: TextIO) -> Any:
    """A rich `Progress` on `stream` that redraws only when asked (no refresh thread) and leaves
    sys.stdout and sys.stderr alone; each task is one line: label, bar, done/total, percent,
    elapsed, eta."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"), BarColumn(bar_width=30), MofNCompleteColumn(), TaskProgressColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=Console(file=stream, highlight=False, markup=False, emoji=False),
        auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
    )


class _RichLines:
    """The rich `Progress` behind a bar or a board: one task per label, started on first use."""

    enabled: bool
    stream: TextIO
    labels: list[str]
    total: int

    _progress: Any = None
    _tasks: list[Any]

    def _show(self, completed: list[int]) -> None:
        """Redraw with `completed[i]` units done for the task of `labels[i]`."""
        if self._progress is None:
            self._progress = _rich_progress(self.stream)
            self._tasks = [self._progress.add_task(label, total=self.total) for label in self.labels]
            self._progress.start()
        for task, done in zip(self._tasks, completed):
            self._progress.update(task, completed=done)
        self._progress.refresh()
        self.draws += 1

    def _draw(self, now: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Draw the final state and end the lines (nothing when disabled)."""
        if self.enabled:
            self._draw(time.monotonic())
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> _RichLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressBar(_RichLines):
    """A one-line progress bar (label, bar, `done/total`, percent, elapsed, ETA) on `stream`.

    `stream` defaults to `sys.stderr` (looked up when the bar is made); `label` (a policy's name)
    starts the line.

    `update(done)` is cheap enough to call every step: it reads the clock only every `stride`
    calls (at most `MAX_STRIDE`), adapting `stride` so that the clock is read about 20 times a
    second, and redraws at most 10 times a second. Enabled by default only when `stream` is a
    terminal.
    """

    MIN_INTERVAL_S = 0.1
    # Bounds how late a redraw can be when steps suddenly get slower (MAX_STRIDE slow steps).
    MAX_STRIDE = 64

    def __init__(
        self, total: int, stream: TextIO | None = None, enabled: bool | None = None, label: str = ""
    ) -> None:
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self.labels = [label]
        self.done = 0
        self.draws = 0
        self._stride = 1
        self._countdown = 1
        self._last_check = time.monotonic()
        self._last_draw = float("-inf")

    def update(self, done: int) -> None:
        """Report that `done` of `total` units are finished; redraws when enough time has passed."""
        self.done = done
        self._countdown -= 1
        if self._countdown > 0 or not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self._last_check
        self._last_check = now
        if elapsed < 0.025:
            self._stride = min(self._stride * 2, self.MAX_STRIDE)
        elif elapsed > 0.1:
            self._stride = max(1, int(self._stride * 0.05 / elapsed))
        self._countdown = self._stride
        if now - self._last_draw >= self.MIN_INTERVAL_S:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        self._show([self.done])


class ProgressBoard(_RichLines):
    """Several runs going on at once (the policies of `metroline compare`, in worker processes):
    one line per run on `stream` (default `sys.stderr`), labelled with `labels[i]`.

    `update(index, done)` with the requests done by run `index`, or `done=None` once it has
    finished (its line then shows `total`); redraws at most 10 times a second. Enabled by default
    only on a terminal.
    """

    MIN_INTERVAL_S = 0.1

    def __init__(
        self, labels: list[str], total: int, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.labels = list(labels)
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self.done: list[int | None] = [0] * len(self.labels)
        self.draws = 0
        self._last_draw = float("-inf")

    def update(self, index: int, done: int | None) -> None:
        """Run `index` has `done` requests finished (None: it has ended)."""
        self.done[index] = done
        now = time.monotonic()
        if self.enabled and now - self._last_draw >= self.MIN_INTERVAL_S:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        self._show([self.total if done is None else done for done in self.done])
