"""`metroline plot FILE...`: the plots of result documents already written, without running again:
a comparison over seeds, a sweep, a run; a file that is not a result document is one error line.
And the documentation's plots are those `plot` draws from the result document recorded beside
them, with the command shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from metroline import cli

pytest.importorskip("matplotlib")

ROOT = Path(__file__).parents[1]
SMALL = ["--workload", "chat", "--max-requests", "60", "--cost-model", "steps", "--no-progress"]
PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def plot(capsys, *argv: str) -> list[str]:
    assert cli.main(["plot", *argv]) == 0
    return capsys.readouterr().out.split()


def test_a_comparison_over_seeds_gets_its_differences_and_means(tmp_path, capsys):
    doc = tmp_path / "cmp.json"
    assert cli.main(["compare", "--policies", "fcfs,srpt,token_rr", "--seeds", "3", *SMALL, "--jobs", "1",
                     "--json", str(doc)]) == 0
    capsys.readouterr()
    written = plot(capsys, str(doc), "--out", str(tmp_path / "plots"))
    assert written == [str(tmp_path / "plots" / "cmp.differences.png"), str(tmp_path / "plots" / "cmp.means.png")]
    wide, _ = png_size(Path(written[0]))
    narrow = plot(capsys, str(doc), "--out", str(tmp_path / "two"))  # the same file drawn again
    assert png_size(Path(narrow[0]))[0] == wide
    assert all(png_size(Path(p))[0] > 300 for p in written)


def test_a_run_and_a_sweep_get_theirs(tmp_path, capsys):
    run, sweep = tmp_path / "run.json", tmp_path / "sweep.json"
    assert cli.main(["run", *SMALL, "--json", str(run)]) == 0
    assert cli.main(["sweep", "--policies", "fcfs", "--rates", "2,8", "--slo", "ttft=1", *SMALL, "--jobs", "1",
                     "--json", str(sweep)]) == 0
    capsys.readouterr()
    assert plot(capsys, str(run), str(sweep), "--out", str(tmp_path)) == [
        str(tmp_path / "run.latency.png"), str(tmp_path / "sweep.latency_vs_load.png"),
        str(tmp_path / "sweep.goodput_vs_load.png")]
    for name in ("run.latency.png", "sweep.latency_vs_load.png", "sweep.goodput_vs_load.png"):
        png_size(tmp_path / name)


def test_a_file_that_is_not_a_result_document_is_one_line(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    assert cli.main(["plot", str(other), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"metroline: error: plot: {other}: not a result document of run, compare or "
                                       "sweep (written with --json)\n")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert cli.main(["plot", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"metroline: error: plot: {broken}: not a JSON result document")
    assert list(tmp_path.glob("*.png")) == []


def test_the_docs_plots_are_drawn_by_the_command_they_show_from_the_recorded_document(tmp_path, capsys):
    """docs/guide/comparisons.md shows each PNG of docs/_static/plots with the `metroline plot`
    command that draws it from the document in docs/_static/results; that command, run here into
    another folder, writes files of the same names and sizes in pixels."""
    page = (ROOT / "docs" / "guide" / "comparisons.md").read_text()
    commands = re.findall(r"^metroline plot (.+)$", page, re.M)
    assert commands, "the page shows no metroline plot command"
    images = re.findall(r"!\[[^\]]*\]\(\.\./_static/plots/([^)]+\.png)\)", page)
    assert images
    drawn = []
    for command in commands:
        argv = command.split()
        assert argv[-2] == "--out" and argv[-1] == "docs/_static/plots"
        drawn += plot(capsys, *(str(ROOT / a) for a in argv[:-2]), "--out", str(tmp_path))
    assert sorted(Path(p).name for p in drawn) == sorted(images)
    for name in images:
        assert png_size(tmp_path / name) == png_size(ROOT / "docs" / "_static" / "plots" / name)
