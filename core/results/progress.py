"""Progress on stderr while runs go on: `ProgressBar` for one run, `ProgressBoard` for several runs
going on at once (one entry per run, labelled with its policy).

Each shows in one of two modes (`progress_mode`): on a terminal a bar redrawn in place (drawn by
rich, imported only when it first draws), elsewhere (a pipe, a log file, CI) plain lines, one
every `PLAIN_INTERVAL_S` seconds at most and never a carriage return or a control sequence:
`progress 30 s: srpt 512/1500 (34%)`, or for a board
`progress 60 s: 3/20 runs done, srpt 512/1500 (34%)`. The interval is shared by every bar and board of one
command (`new_command` starts it afresh), so a command running many short runs one after another
still prints a line every interval, naming the run under way; a command that ends within the first interval prints none.
`ProgressBar.update` runs once per engine step: it reads the clock only every few calls and redraws
at most 10 times a second.
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


MODES = ("auto", "bar", "plain", "off")
"""The values of `--progress`: `auto` (the default) is `bar` on a terminal and `plain` elsewhere."""

PLAIN_INTERVAL_S = 30.0
"""Seconds between two plain progress lines (and before the first one)."""

_plain_clock = {"last": None}
"""When this process last printed a plain line (or started its first plain progress)."""


def new_command() -> None:
    """Start the plain-line interval afresh: the CLI calls it as each command starts, so that the
    interval is shared by the bars and boards of one command (its runs one after another), never
    carried over from an earlier command run in the same process."""
    _plain_clock["last"] = None


def progress_mode(progress: bool | str | None, stream: Any) -> str | None:
    """The mode a bar or board shows in: `"bar"`, `"plain"` or None (nothing). `progress` is
    `--progress`'s value, a mode of `MODES`, or True (auto) / False (off) / None (auto)."""
    if progress is False or progress == "off":
        return None
    if progress in (None, True, "auto"):
        return "bar" if is_terminal(stream) else "plain"
    if progress in ("bar", "plain"):
        return progress
    raise ValueError(f"--progress: expected one of {', '.join(MODES)}, got {progress!r}")


def _plain_line_due(now: float) -> bool:
    """Whether a plain line is due at `now` (and if so, the interval starts again)."""
    last = _plain_clock["last"]
    if last is None:
        _plain_clock["last"] = now
        return False
    if now - last < PLAIN_INTERVAL_S:
        return False
    _plain_clock["last"] = now
    return True


def _plain_entry(label: str, done: int, total: int) -> str:
    share = f" ({100 * done // total}%)" if total else ""
    return f"{label + ' ' if label else ''}{done}/{total}{share}"


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

    mode: str | None
    _started: float

    def _show(self, completed: list[int], now: float) -> None:
        """Redraw with `completed[i]` units done for the task of `labels[i]` (plain mode: a line,
        when one is due at `now`: a bar's share, or a board's count of finished runs and the
        shares of those under way)."""
        if self.mode == "plain":
            if _plain_line_due(now):
                if len(self.labels) == 1:
                    text = _plain_entry(self.labels[0], completed[0], self.total)
                else:
                    finished = sum(done >= self.total for done in completed)
                    text = ", ".join([f"{finished}/{len(self.labels)} runs done"] + [
                        _plain_entry(label, done, self.total)
                        for label, done in zip(self.labels, completed) if 0 < done < self.total])
                print(f"progress {now - self._started:.0f} s: {text}", file=self.stream, flush=True)
                self.draws += 1
            return
        if self._progress is None:
            self._progress = _rich_progress(self.stream)
            self._tasks = [self._progress.add_task(label, total=self.total) for label in self.labels]
            self._progress.start()
        for task, done in zip(self._tasks, completed):
            self._progress.update(task, completed=done)
        self._progress.refresh()
        self.draws += 1

    def _set_mode(self, progress: bool | str | None) -> None:
        self.mode = progress_mode(progress, self.stream)
        self.enabled = self.mode is not None
        self._started = time.monotonic()
        if self.mode == "plain" and _plain_clock["last"] is None:
            _plain_clock["last"] = self._started

    def _draw(self, now: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Draw the final state and end the lines (nothing when disabled)."""
        if self.enabled and self.mode == "bar":
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
    second, and redraws at most 10 times a second. `enabled`: a mode of `progress_mode` (default
    auto: a bar on a terminal, plain lines elsewhere).
    """

    MIN_INTERVAL_S = 0.1
    # Bounds how late a redraw can be when steps suddenly get slower (MAX_STRIDE slow steps).
    MAX_STRIDE = 64

    def __init__(
        self, total: int, stream: TextIO | None = None, enabled: bool | None = None, label: str = ""
    ) -> None:
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self._set_mode(enabled)
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
        self._show([self.done], now)


class ProgressBoard(_RichLines):
    """Several runs going on at once (the policies of `metroline compare`, in worker processes):
    one line per run on `stream` (default `sys.stderr`), labelled with `labels[i]`.

    `update(index, done)` with the requests done by run `index`, or `done=None` once it has
    finished (its line then shows `total`); redraws at most 10 times a second. `enabled`: as
    `ProgressBar`'s; a plain line names the runs under way.
    """

    MIN_INTERVAL_S = 0.1

    def __init__(
        self, labels: list[str], total: int, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.labels = list(labels)
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self._set_mode(enabled)
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
        self._show([self.total if done is None else done for done in self.done], now)
