"""`metroline traces fetch` against a real HTTP server on a loopback port (no network): files are
saved only when their sha256 matches, an interrupted download resumes with a range request, a
mismatch or an HTTP error is one line naming the trace, and a present file is not fetched again."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from metroline import cli
from metroline.core.workloads import trace_fetch
from metroline.core.workloads.trace_fetch import SOURCES, TraceSource
from metroline.core.workloads.traces import find_traces_dir, load_trace

AZURE = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
    f"{i * 0.5},{100 + i},{10 + i}\n" for i in range(2000))
MOONCAKE = "".join(f'{{"timestamp": {i * 10}, "input_length": 600, "output_length": 5, "hash_ids": [1, {i + 2}]}}\n'
                   for i in range(300))


class Server:
    """A file server on 127.0.0.1 (port chosen by the OS) serving `root`, answering `Range:
    bytes=N-` with 206 unless `honour_range` is off; `cut_after` bytes into each body (when set)
    it drops the connection, as a network failure would. `requests` logs (path, Range header)."""

    def __init__(self, root: Path):
        self.root, self.honour_range, self.cut_after, self.requests = root, True, None, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                path = server.root / self.path.lstrip("/")
                if not path.is_file():
                    self.send_error(404, "Not Found")
                    return
                data, status = path.read_bytes(), 200
                if rng and server.honour_range:
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    if start >= len(data):
                        self.send_error(416, "Range Not Satisfiable")
                        return
                    data, status = data[start:], 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if server.cut_after is not None:
                    self.wfile.write(data[:server.cut_after])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fixtures(tmp_path, monkeypatch):
    """Two small traces served from `tmp_path/served`, registered as the downloadable traces
    (their published URLs on the local server); the traces folder is `tmp_path/traces`."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "azure_conv_2023.csv").write_text(AZURE)
    (served / "mooncake_synthetic.jsonl").write_text(MOONCAKE)
    server = Server(served)
    sources = {name: TraceSource(name, f"{server.url}/{file}", hashlib.sha256(text.encode()).hexdigest(), rows)
               for name, file, text, rows in (("azure-conv", "azure_conv_2023.csv", AZURE, 2000),
                                              ("mooncake", "mooncake_synthetic.jsonl", MOONCAKE, 300))}
    monkeypatch.setattr(trace_fetch, "SOURCES", sources)
    monkeypatch.delenv("METROLINE_TRACES", raising=False)
    with server:
        yield server, tmp_path / "traces"


def fetch(*argv: str) -> int:
    return cli.main(["traces", "fetch", *argv])


def test_fetch_saves_each_trace_checked_and_the_workload_reads_it(fixtures, capsys):
    server, folder = fixtures
    assert fetch("--traces-dir", str(folder)) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(folder / "azure_conv_2023.csv"), str(folder / "mooncake_synthetic.jsonl")]
    assert (folder / "azure_conv_2023.csv").read_text() == AZURE
    assert sorted(p.name for p in folder.iterdir()) == ["azure_conv_2023.csv", "mooncake_synthetic.jsonl"]
    assert "\r" not in err and f"azure-conv: downloading {server.url}/azure_conv_2023.csv" in err
    assert f"mooncake: {folder / 'mooncake_synthetic.jsonl'} ({len(MOONCAKE):,} bytes), sha256 ok" in err
    assert len(load_trace(folder / "azure_conv_2023.csv")) == 2000
    assert len(load_trace(folder / "mooncake_synthetic.jsonl")) == 300
    # a second fetch finds both present and downloads nothing
    before = len(server.requests)
    assert fetch("--traces-dir", str(folder)) == 0
    assert len(server.requests) == before
    assert "azure-conv: " + str(folder / "azure_conv_2023.csv") + " is present, sha256 ok" in capsys.readouterr().err


def test_the_default_folder_is_traces_in_the_working_directory_where_workloads_look(fixtures, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fetch("azure-conv") == 0
    assert (tmp_path / "traces" / "azure_conv_2023.csv").read_text() == AZURE
    assert find_traces_dir() == Path("traces").absolute()


def test_a_checksum_mismatch_writes_nothing_and_names_both_checksums(fixtures, capsys):
    server, folder = fixtures
    (server.root / "mooncake_synthetic.jsonl").write_text(MOONCAKE.replace('"output_length": 5', '"output_length": 6', 1))
    assert fetch("--traces-dir", str(folder), "mooncake") == 2
    err = capsys.readouterr().err.splitlines()[-1]
    expected = SOURCES_now()["mooncake"].sha256
    got = hashlib.sha256((server.root / "mooncake_synthetic.jsonl").read_bytes()).hexdigest()
    assert err == (f"metroline: error: traces fetch: mooncake: the download from {server.url}/mooncake_synthetic.jsonl "
                   f"({len(MOONCAKE):,} bytes) has sha256 {got}, expected {expected}: it changed upstream or was "
                   "corrupted; nothing written")
    assert list(folder.iterdir()) == []


def SOURCES_now() -> dict[str, TraceSource]:
    return trace_fetch.SOURCES


def test_an_interrupted_download_resumes_with_a_range_request(fixtures, capsys):
    server, folder = fixtures
    server.cut_after = 1000
    assert fetch("--traces-dir", str(folder), "azure-conv") == 2
    err = capsys.readouterr().err.splitlines()[-1]
    part = folder / "azure_conv_2023.csv.part"
    assert err == (f"metroline: error: traces fetch: azure-conv: cannot download {server.url}/azure_conv_2023.csv: "
                   f"ConnectionError: the connection closed after 1,000 of {len(AZURE):,} bytes; 1,000 bytes kept in "
                   f"{part}, a rerun resumes")
    assert part.read_bytes() == AZURE.encode()[:1000] and not (folder / "azure_conv_2023.csv").exists()
    server.cut_after = None
    assert fetch("--traces-dir", str(folder), "azure-conv") == 0
    assert server.requests[-1] == ("/azure_conv_2023.csv", "bytes=1000-")
    assert "azure-conv: resuming at byte 1,000" in capsys.readouterr().err
    assert (folder / "azure_conv_2023.csv").read_text() == AZURE and not part.exists()


def test_a_server_ignoring_the_range_is_read_from_the_start(fixtures, capsys):
    server, folder = fixtures
    folder.mkdir()
    (folder / "azure_conv_2023.csv.part").write_bytes(b"garbage that a resume would keep")
    server.honour_range = False
    assert fetch("--traces-dir", str(folder), "azure-conv") == 0
    assert "azure-conv: the server ignored the range: starting again" in capsys.readouterr().err
    assert (folder / "azure_conv_2023.csv").read_text() == AZURE


def test_a_present_file_with_another_checksum_is_kept_unless_forced(fixtures, capsys):
    server, folder = fixtures
    folder.mkdir()
    mine = folder / "azure_conv_2023.csv"
    mine.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n")
    assert fetch("--traces-dir", str(folder), "azure-conv") == 2
    found = hashlib.sha256(mine.read_bytes()).hexdigest()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"metroline: error: traces fetch: azure-conv: {mine} exists with sha256 {found}, expected "
        f"{SOURCES_now()['azure-conv'].sha256} (--force downloads it again and replaces it)")
    assert mine.read_text().endswith("0,1,1\n") and server.requests == []
    assert fetch("--traces-dir", str(folder), "--force", "azure-conv") == 0
    assert mine.read_text() == AZURE


def test_http_errors_and_unknown_names_are_one_line(fixtures, capsys):
    server, folder = fixtures
    (server.root / "azure_conv_2023.csv").unlink()
    assert fetch("--traces-dir", str(folder), "azure-conv") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"metroline: error: traces fetch: azure-conv: {server.url}/azure_conv_2023.csv answered HTTP 404 Not Found")
    assert fetch("--traces-dir", str(folder), "burstgpt") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "metroline: error: traces fetch: unknown trace 'burstgpt' (known: azure-conv, mooncake)")


def test_the_published_checksums_match_the_documented_copies(tmp_path, capsys):
    """With `--mirror` on a server of the traces folder's copies, each trace fetches and checks
    against the checksum pinned in `SOURCES`, the one docs/guide/workloads-and-traces.md prints."""
    try:
        shared = find_traces_dir()
    except ValueError:
        pytest.skip("no traces directory (../shared/traces or $METROLINE_TRACES)")
    page = (Path(__file__).parents[1] / "docs" / "guide" / "workloads-and-traces.md").read_text()
    served = tmp_path / "served"
    served.mkdir()
    for source in SOURCES.values():
        assert source.sha256 in page and source.url in page
        shutil.copy(shared / source.file, served / source.file)
    with Server(served) as server:
        assert fetch("--traces-dir", str(tmp_path / "traces"), "--mirror", server.url) == 0
    for source in SOURCES.values():
        assert len(load_trace(tmp_path / "traces" / source.file)) == source.rows
