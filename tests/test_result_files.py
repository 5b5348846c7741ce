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
