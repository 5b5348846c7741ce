"""Result files are written atomically: a write that fails half-way (a document that cannot be
encoded, a disk that fills) leaves the previous file as it was and no temporary file behind; a
whole write replaces it."""

from __future__ import annotations

import json
import os

import pytest

from metroline.core.results.files import atomic_open, write_json, write_requests_csv


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "run.json"
    write_json(path, {"a": 1})
    with pytest.raises(ValueError):  # NaN is refused by json.dump half-way through the document
        write_json(path, {"a": 2, "b": [1.0] * 1000 + [float("nan")]})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["run.json"]


def test_a_disk_full_mid_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "requests.csv"
    path.write_text("old\n")

    class Full:
        def __iter__(self):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_requests_csv(path, Full())
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["requests.csv"]


def test_a_whole_write_replaces_the_file_in_a_new_folder(tmp_path):
    path = tmp_path / "deep" / "out.txt"
    with atomic_open(path) as f:
        f.write("x")
        assert not path.exists()  # nothing at the target until the block ends
    assert path.read_text() == "x"
    assert os.listdir(path.parent) == ["out.txt"]
    assert (path.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- only a regular file is ever replaced -------------------------------------------------------


def _not_regular(tmp_path, kind: str):
    """A path holding `kind`: a FIFO, a symbolic link to a file, a dangling symbolic link, or a
    link to this process's stdout (`/dev/stdout`'s kind)."""
    path = tmp_path / f"out-{kind}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "target.json").write_text("keep me\n")
        path.symlink_to(tmp_path / "target.json")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nowhere.json")
    else:
        path.symlink_to(f"/proc/{os.getpid()}/fd/1")
    return path


KINDS = {"fifo": "a FIFO", "link": "a symbolic link", "dangling": "a symbolic link", "stdout": "a symbolic link"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_result_is_never_written_over_anything_but_a_regular_file(tmp_path, kind):
    path = _not_regular(tmp_path, kind)
    before = os.lstat(path)
    with pytest.raises(ValueError, match=f"output: {path} is {KINDS[kind]}; results are written only to a regular"):
        write_json(path, {"a": 1})
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # the same thing, untouched
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    if kind == "link":
        assert (tmp_path / "target.json").read_text() == "keep me\n"


@pytest.mark.parametrize("flag", ["--json", "--outputs"])
@pytest.mark.parametrize("kind", ["fifo", "stdout"])
def test_run_refuses_a_json_or_outputs_path_that_is_no_regular_file_before_it_runs(tmp_path, kind, flag, capsys):
    from metroline import cli

    path = _not_regular(tmp_path, kind)
    code = cli.main(["run", "--workload", "chat", "--max-requests", "3", flag, str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{flag}: {path} is {KINDS[kind]}; results are written only to a regular file" in err, err
    assert os.path.islink(path) == (kind == "stdout") and (kind != "fifo" or os.path.exists(path))


def test_outputs_replace_the_previous_file_only_once_the_run_is_done(tmp_path, monkeypatch):
    from metroline import cli

    out = tmp_path / "outputs.jsonl"
    out.write_text('{"id": "from the previous run"}\n')
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "breaks_late.py").write_text(
        "from metroline.api import hookimpl\n\n\nclass BreaksLate:\n    name = 'breaks_late'\n\n"
        "    @hookimpl\n    def on_step_end(self, ctx):\n        if ctx.step == 40:\n"
        "            raise RuntimeError('the run breaks at step 40')\n")
    monkeypatch.syspath_prepend(str(plugins))
    argv = ["run", "--workload", "chat", "--max-requests", "20", "--outputs", str(out)]
    assert cli.main([*argv, "--plugin", "breaks_late:BreaksLate"]) != 0
    assert out.read_text() == '{"id": "from the previous run"}\n'  # untouched by the failed run
    assert sorted(os.listdir(tmp_path)) == ["outputs.jsonl", "plugins"]  # no temporary left behind
    assert cli.main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 20 and {r["finish_reason"] for r in lines} <= {"length", "eos", "stop"}


def test_a_plugin_that_calls_sys_exit_at_import_is_an_error_naming_it(tmp_path, monkeypatch, capsys):
    from metroline import cli

    (tmp_path / "exits_at_import.py").write_text("import sys\n\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["run", "--workload", "chat", "--max-requests", "3", "--plugin", "exits_at_import:Policy"])
    assert code == 2
    assert "plugin 'exits_at_import:Policy': importing 'exits_at_import' called sys.exit(0)" in capsys.readouterr().err
