"""`metroline traces fetch`: download the public traces the built-in trace workloads replay.

Each trace (`SOURCES`) has its published URL and the sha256 of the copy the documentation's
figures were measured on (docs/guide/workloads-and-traces.md). A download goes to `FILE.part` in
the traces folder; an interrupted one is resumed from where it stopped (an HTTP range request; a
server that ignores the range is read from the start again). Only a download whose sha256 matches
is renamed to `FILE` (an atomic rename in the same folder), so the folder never holds a partial or
changed trace under a trace's name; a mismatch deletes the partial file and is an error naming
both checksums. A file already present with the right checksum is not downloaded again.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .generators import TRACE_FILES
from .items import WorkloadError

CHUNK = 1 << 16
TIMEOUT_S = 60.0
"""Seconds a connection may stay silent before the download is abandoned (resumable)."""


@dataclass(frozen=True)
class TraceSource:
    """Where a built-in trace workload's file comes from and what it must hash to."""

    name: str
    url: str
    sha256: str
    rows: int

    @property
    def file(self) -> str:
        """The file's name in the traces folder."""
        return TRACE_FILES[self.name]


SOURCES: dict[str, TraceSource] = {
    source.name: source for source in (
        TraceSource("azure-conv", "https://raw.githubusercontent.com/microsoft/vidur/main/data/processed_traces/"
                    "splitwise_conv.csv", "439e4138b7e384f316de614c071f7162be05b8af0cef866f82faacd1b0472249", 19_366),
        TraceSource("azure-code", "https://raw.githubusercontent.com/microsoft/vidur/main/data/processed_traces/"
                    "splitwise_code.csv", "f266b907d109d471c61283ab69771c17ad79a18b33ff6e96aa546346f52767a6", 8_819),
        TraceSource("mooncake", "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"
                    "synthetic_trace.jsonl", "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 3_993),
    )
}
"""The downloadable traces, by workload name."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def url_of(source: TraceSource, mirror: str | None) -> str:
    """The source's published URL, or `MIRROR/FILE` when a mirror is given."""
    return source.url if mirror is None else f"{mirror.rstrip('/')}/{source.file}"


def _download(url: str, part: Path, say: Callable[[str], None]) -> None:
    """Append `url`'s bytes to `part`, from `part`'s current size when the server honours a range."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the range starts at the end: the partial file is complete
            return
        raise
    with response:
        resumed = have and response.status == 206
        if have:
            say(f"resuming at byte {have:,}" if resumed else "the server ignored the range: starting again")
        expected, got = response.headers.get("Content-Length"), 0
        with part.open("ab" if resumed else "wb") as out:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                out.write(chunk)
                got += len(chunk)
        if expected is not None and got < int(expected):
            raise ConnectionError(f"the connection closed after {got:,} of {int(expected):,} bytes")


def fetch(names: list[str], folder: Path, mirror: str | None = None, force: bool = False,
          say: Callable[[str], None] = print) -> list[Path]:
    """Download the traces `names` (workload names of `SOURCES`) into `folder` (made if missing),
    each checked against its sha256; returns their paths. `say` gets one line per event (no
    carriage returns: fit for a log). Raises `WorkloadError` naming the trace on an unknown name,
    a network or HTTP error (the partial file is kept for a rerun to resume), a checksum mismatch
    (the partial file is deleted), or a file already present with another checksum (unless
    `force`: it is then downloaded again and replaced only once the new copy checks)."""
    unknown = [name for name in names if name not in SOURCES]
    if unknown:
        raise WorkloadError(f"traces fetch: unknown trace {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(SOURCES)})")
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        source = SOURCES[name]
        path, part = folder / source.file, folder / (source.file + ".part")
        paths.append(path)
        if path.exists():
            found = sha256_of(path)
            if found == source.sha256:
                say(f"{name}: {path} is present, sha256 ok")
                continue
            if not force:
                raise WorkloadError(f"traces fetch: {name}: {path} exists with sha256 {found}, expected "
                                    f"{source.sha256} (--force downloads it again and replaces it)")
        url = url_of(source, mirror)
        say(f"{name}: downloading {url}")
        try:
            _download(url, part, lambda line: say(f"{name}: {line}"))
        except urllib.error.HTTPError as exc:
            raise WorkloadError(f"traces fetch: {name}: {url} answered HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
            kept = f"; {part.stat().st_size:,} bytes kept in {part}, a rerun resumes" if part.exists() else ""
            raise WorkloadError(f"traces fetch: {name}: cannot download {url}: {reason}{kept}") from None
        found = sha256_of(part)
        if found != source.sha256:
            size = part.stat().st_size
            part.unlink()
            raise WorkloadError(f"traces fetch: {name}: the download from {url} ({size:,} bytes) has sha256 {found}, "
                                f"expected {source.sha256}: it changed upstream or was corrupted; nothing written")
        os.replace(part, path)
        say(f"{name}: {path} ({path.stat().st_size:,} bytes), sha256 ok")
    return paths


def default_folder(traces_dir: str | None) -> Path:
    """Where `traces fetch` saves: `--traces-dir`, else $METROLINE_TRACES, else `./traces` (a folder
    the trace workloads find by themselves, `traces.find_traces_dir`)."""
    if traces_dir is not None:
        return Path(traces_dir)
    if os.environ.get("METROLINE_TRACES"):
        return Path(os.environ["METROLINE_TRACES"])
    return Path("traces")
