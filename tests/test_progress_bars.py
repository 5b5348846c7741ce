"""The progress of a run (`metroline.core.results.progress`): a bar on a terminal, redrawn at most 10 times a
second, one line per policy under `compare`; plain lines elsewhere, at most one per interval, without carriage
returns or control sequences; and what a run without a bar loads."""

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


def test_progress_bar_disabled_when_off():
    stream = FakeTTY()
    bar = ProgressBar(10, stream=stream, enabled="off")
    assert not bar.enabled and bar.mode is None
    for i in range(10):
        bar.update(i + 1)
    bar.close()
    assert stream.getvalue() == "" and bar.draws == 0


def test_the_mode_is_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    assert progress.progress_mode(None, FakeTTY()) == "bar"
    assert progress.progress_mode(None, io.StringIO()) == "plain"
    assert progress.progress_mode("auto", io.StringIO()) == "plain"
    assert progress.progress_mode(True, FakeTTY()) == "bar"
    assert progress.progress_mode("plain", FakeTTY()) == "plain"
    assert progress.progress_mode(False, FakeTTY()) is None
    assert progress.progress_mode("off", io.StringIO()) is None


class Clock:
    """The progress module's clock, set by the test: `step` seconds pass at each reading."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def test_plain_lines_come_once_an_interval_without_carriage_returns(monkeypatch):
    """Off a terminal: nothing in the first interval, then one line per `PLAIN_INTERVAL_S` at most,
    each `progress N s: LABEL done/total (P%)`; nothing more at close, nothing from rich."""
    clock = Clock(0.5)
    monkeypatch.setattr(progress, "time", clock)
    monkeypatch.setattr(progress, "_plain_clock", {"last": None})
    stream = io.StringIO()
    bar = ProgressBar(1000, stream=stream, label="srpt")
    assert bar.mode == "plain"
    for i in range(1000):
        bar.update(i + 1)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    elapsed = clock.now
    assert len(lines) == bar.draws and 1 <= len(lines) <= elapsed / progress.PLAIN_INTERVAL_S
    stamps = []
    for line in lines:
        m = re.fullmatch(r"progress (\d+) s: srpt (\d+)/1000 \((\d+)%\)", line)
        assert m, line
        stamps.append(int(m.group(1)))
        assert int(m.group(3)) == int(m.group(2)) // 10
    assert stamps[0] >= progress.PLAIN_INTERVAL_S
    assert all(b - a >= progress.PLAIN_INTERVAL_S - 1 for a, b in zip(stamps, stamps[1:]))


def test_plain_lines_of_a_board_name_the_runs_under_way(monkeypatch):
    monkeypatch.setattr(progress, "time", Clock(progress.PLAIN_INTERVAL_S))
    monkeypatch.setattr(progress, "_plain_clock", {"last": None})
    stream = io.StringIO()
    board = ProgressBoard(["fcfs", "srpt", "lrpt"], total=200, stream=stream)
    board.update(0, None)
    board.update(1, 50)
    board.update(2, 0)
    board.close()
    # made at 30 s, updated at 60, 90 and 120 s: a line each time, as each is an interval apart
    assert stream.getvalue().splitlines() == ["progress 30 s: 1/3 runs done", "progress 60 s: 1/3 runs done, srpt 50/200 (25%)",
                                              "progress 90 s: 1/3 runs done, srpt 50/200 (25%)"]


def test_the_interval_is_shared_by_runs_one_after_another(monkeypatch):
    """Many short runs in a row (compare --jobs 1 over seeds): a line every interval, naming the run
    under way, though no single run lasts an interval."""
    monkeypatch.setattr(progress, "time", Clock(1.0))
    monkeypatch.setattr(progress, "_plain_clock", {"last": None})
    stream = io.StringIO()
    for seed in range(20):
        bar = ProgressBar(10, stream=stream, label=f"fcfs seed {seed}")
        for i in range(10):
            bar.update(i + 1)
        bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and all(re.fullmatch(r"progress \d+ s: fcfs seed \d+ \d+/10 \(\d+%\)", ln) for ln in lines)
    assert len({ln.split(": ")[1].split()[2] for ln in lines}) == len(lines)  # different runs


def test_run_and_compare_show_plain_progress_in_a_pipe(monkeypatch, capsys):
    """`run` and `compare` with stderr not a terminal (captured here) print plain lines only."""
    from metroline import cli

    monkeypatch.setattr(progress, "time", Clock(1.0))
    for argv in (["run", "--workload", "chat", "--max-requests", "200", "--cost-model", "steps"],
                 ["compare", "--policies", "fcfs,srpt", "--workload", "chat", "--max-requests", "200",
                  "--cost-model", "steps", "--jobs", "1"]):
        monkeypatch.setattr(progress, "_plain_clock", {"last": None})
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        assert "\r" not in err and "\x1b" not in err
        lines = [ln for ln in err.splitlines() if not ln.startswith("metroline: note: ")]  # the load check's
        assert lines and all(re.fullmatch(r"progress \d+ s: (\S+ )?\d+/200 \(\d+%\)", ln) for ln in lines), err
        monkeypatch.setattr(progress, "_plain_clock", {"last": None})
        assert cli.main([*argv, "--no-progress"]) == 0
        assert all(ln.startswith("metroline: note: ") for ln in capsys.readouterr().err.splitlines())


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


def test_board_off_tty_writes_nothing_within_the_first_interval(monkeypatch):
    monkeypatch.setattr(progress, "_plain_clock", {"last": None})
    monkeypatch.setattr(progress, "time", Clock(1.0))
    stream = io.StringIO()
    board = ProgressBoard(["fcfs"], total=10, stream=stream)
    board.update(0, 5)
    board.close()
    assert board.mode == "plain" and stream.getvalue() == ""


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


def test_each_command_starts_the_interval_afresh(monkeypatch, capsys):
    """A command run in a process where another ended long ago prints no line in its first
    interval (the CLI calls `new_command`)."""
    from metroline import cli

    clock = Clock(0.0)
    monkeypatch.setattr(progress, "time", clock)
    monkeypatch.setattr(progress, "_plain_clock", {"last": None})
    ProgressBar(10, stream=io.StringIO()).close()  # an earlier command's bar, at t = 0
    clock.now = 10 * progress.PLAIN_INTERVAL_S
    clock.step = 0.001  # the whole command lasts well under an interval
    assert cli.main(["run", "--workload", "chat", "--max-requests", "50", "--cost-model", "steps"]) == 0
    assert not any(line.startswith("progress ") for line in capsys.readouterr().err.splitlines())
