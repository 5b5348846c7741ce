"""The progress bars of a run (`metroline.core.results.progress`): off unless the stream is a terminal, redrawn at
most 10 times a second, one line per policy under `compare`; and what a run without a bar loads."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import types

from metroline.core.results import progress
from metroline.core.results.progress import ProgressBar, ProgressBoard

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def plain(stream: io.StringIO) -> str:
    """What `stream` shows, without the terminal's control sequences (colours, cursor)."""
    return ANSI.sub("", stream.getvalue())


def last_frame(stream: io.StringIO) -> list[str]:
    """The lines of the last redraw: rich starts each redraw with a carriage return."""
    return plain(stream).rsplit("\r", 1)[-1].strip("\n").splitlines()


def test_progress_bar_disabled_off_tty():
    stream = io.StringIO()
    bar = ProgressBar(10, stream=stream)
    assert not bar.enabled
    for i in range(10):
        bar.update(i + 1)
    bar.close()
    assert stream.getvalue() == "" and bar.draws == 0


def test_progress_bar_draws_rate_limited_on_tty(monkeypatch):
    """On a clock the test sets (the bar's `time`), so that no count hangs on the machine's speed
    or load: 5,000 calls 10 us apart read the clock less and less often (the stride doubles up to
    `MAX_STRIDE` while reads are under 25 ms apart) and draw once in their 50 ms, at the first
    read; then 5,000 calls 2 ms apart (10 s) read it more often again and draw at least 0.1 s apart."""
    now = [0.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    stream = FakeTTY()
    bar = ProgressBar(10_000, stream=stream, label="srpt")
    assert bar.enabled
    for i in range(5000):
        now[0] = (i + 1) * 1e-5
        bar.update(i + 1)
    assert bar._stride == ProgressBar.MAX_STRIDE and bar.draws == 1
    start, drawn = now[0], []
    for i in range(5000, 10_000):
        now[0] = start + (i - 4999) * 2e-3
        before = bar.draws
        bar.update(i + 1)
        if bar.draws > before:
            drawn.append(now[0])
    assert 1 < bar._stride < ProgressBar.MAX_STRIDE  # slower calls: the clock is read more often
    assert len(drawn) >= 10.0 / (2 * ProgressBar.MIN_INTERVAL_S)  # a draw at least every 0.2 s
    assert min(b - a for a, b in zip([start, *drawn], drawn)) >= ProgressBar.MIN_INTERVAL_S
    bar.close()
    assert plain(stream).endswith("\n")
    (line,) = last_frame(stream)
    assert line.startswith("srpt ") and "10000/10000" in line and "100%" in line


def test_progress_bar_zero_total():
    stream = FakeTTY()
    with ProgressBar(0, stream=stream) as bar:
        bar.update(0)
    assert "0/0" in last_frame(stream)[0] and plain(stream).endswith("\n")


def test_progress_board_draws_one_line_per_policy():
    stream = FakeTTY()
    board = ProgressBoard(["fcfs", "srpt+reserve"], total=200, stream=stream)
    assert board.enabled
    board.update(0, 50)
    board.update(1, None)  # within 0.1 s of the last redraw: not drawn yet
    board.close()  # the final state is drawn
    fcfs, srpt = last_frame(stream)
    assert fcfs.split()[0] == "fcfs" and "50/200" in fcfs and "25%" in fcfs
    assert srpt.split()[0] == "srpt+reserve" and "200/200" in srpt and "100%" in srpt
    assert plain(stream).endswith("\n")


def test_board_off_tty_writes_nothing():
    stream = io.StringIO()
    board = ProgressBoard(["fcfs"], total=10, stream=stream)
    board.update(0, 5)
    board.close()
    assert not board.enabled and stream.getvalue() == ""


def loaded_modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_help_loads_neither_rich_nor_torch():
    mods = loaded_modules("from metroline.cli import build_parser; build_parser().format_help()")
    assert not {"rich", "torch", "numpy"} & mods


def test_a_simulated_run_in_a_pipe_loads_no_torch_and_no_progress_bar():
    code = ("import contextlib, io\nfrom metroline.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['run', '--workload', 'chat', '--max-requests', '20']) == 0")
    mods = loaded_modules(code)
    assert "torch" not in mods
    assert "rich.progress" not in mods  # stderr is not a terminal: no bar
    assert "rich.table" in mods  # the table is drawn by rich
