"""The files of a run: the result document as JSON, one CSV row per request record, one CSV row
per step tuple (with one running-count column per tenant).

Every file is written atomically (`atomic_open`): into a temporary file in the same folder, which
replaces the target only once it is whole, so a killed run or a full disk leaves either the old
file or none, never a truncated one. Only a regular file is ever replaced: a symbolic link, a
FIFO, a device or a folder at the path is refused (`check_writable`)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

from .collector import RequestRecord, StepRow

REQUESTS_CSV_FIELDS = (
    "id", "tenant", "priority", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s",
    "prompt_tokens", "cached_prompt_tokens", "output_tokens", "preemptions", "finish_reason",
)
"""Columns of `write_requests_csv`, named as the `RequestRecord` fields they hold."""

STEPS_CSV_FIELDS = (
    "step", "time_s", "running", "waiting", "swapped", "prefill_tokens", "decode_tokens",
    "free_blocks", "cached_blocks", "preemptions", "duration_s",
)
"""Columns of `write_steps_csv`, named as the `StepRow` fields they hold (`prefill_tokens`,
`decode_tokens` and `duration_s` make it a step log the `calibrated` cost model can fit)."""


def _cell(v: Any) -> Any:
    return "" if v is None else v


def not_regular(path: str | Path) -> str | None:
    """What `path` is when it is there and is not a regular file (a symbolic link, a FIFO, a device,
    a folder, a socket): a result file written there would replace it, not write into it. None
    when nothing is there or a regular file is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def check_writable(path: str | Path, what: str = "output") -> None:
    """Refuse (`ValueError` naming `what`, the flag) to write a result over anything but a regular
    file: a result replaces its file whole (`atomic_open`), so a symbolic link, a FIFO or a device
    there would be replaced by a regular file."""
    kind = not_regular(path)
    if kind is not None:
        raise ValueError(f"{what}: {path} is {kind}; results are written only to a regular file or a new path "
                         "(it would be replaced, not written through)")


@contextlib.contextmanager
def atomic_open(path: str | Path, what: str = "output"):
    """A text file to write `path` through: a temporary file in `path`'s folder (created if need
    be), flushed to disk and renamed onto `path` when the block ends; removed, leaving `path` as it
    was, when the block raises. Anything at `path` but a regular file is refused before
    (`check_writable`), and again just before the rename."""
    path = Path(path)
    check_writable(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        check_writable(path, what)  # nothing else appeared there meanwhile
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_requests_csv(path: str | Path, records: Iterable[RequestRecord]) -> None:
    """One row per request record, columns `REQUESTS_CSV_FIELDS`; None is an empty cell."""
    with atomic_open(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(REQUESTS_CSV_FIELDS)
        for r in records:
            w.writerow([_cell(getattr(r, name)) for name in REQUESTS_CSV_FIELDS])


def running_column(tenant: str) -> str:
    """The steps CSV's column of `tenant`'s running count: `running[<tenant>]`."""
    return f"running[{tenant}]"


def write_steps_csv(
    path: str | Path,
    steps: Iterable[tuple],
    running_by_tenant: list[dict[str, int]] | None = None,
    tenants: Iterable[str] = (),
) -> None:
    """One row per step tuple of `MetricsCollector.steps`, columns `STEPS_CSV_FIELDS`, then one
    column per tenant of `tenants` (in the order given), `running[<tenant>]`: how many of its
    sequences were running in that step, from `MetricsCollector.running_by_tenant` (aligned with
    `steps`; 0 where the tenant had none). Without `running_by_tenant` there are no tenant columns.
    """
    idx = [StepRow._fields.index(name) for name in STEPS_CSV_FIELDS]
    tenants = list(tenants) if running_by_tenant is not None else []
    with atomic_open(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow([*STEPS_CSV_FIELDS, *map(running_column, tenants)])
        if not tenants:
            for s in steps:
                w.writerow([_cell(s[i]) for i in idx])
            return
        for s, counts in zip(steps, running_by_tenant, strict=True):
            w.writerow([*(_cell(s[i]) for i in idx), *(counts.get(t, 0) for t in tenants)])


def write_json(path: str | Path, doc: dict) -> None:
    """Write a result document as indented JSON (refusing NaN, which a document never holds)."""
    with atomic_open(path) as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")
