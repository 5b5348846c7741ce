"""Loaders for request trace files, each row validated by a pydantic `TraceRow` model.

- Azure CSV (`.csv`): header `arrived_at,num_prefill_tokens,num_decode_tokens` (seconds, prompt
  tokens, output tokens), optional `tenant` and `priority` columns, any order. Every prompt is
  unique.
- Mooncake JSONL (`.jsonl`): `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one id
  per 512-token block; equal ids mean equal blocks), optional `tenant` and `priority`. The prompt
  is one segment per block id, so equal leading ids give a shared prefix.

Arrivals are made relative to the earliest row; rows are sorted by arrival (stable). A bad row
raises `WorkloadError` naming the file, the 1-based line (the CSV header is line 1) and the column.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from .generators import TRACE_FILES
from .items import MAX_ITEM_TOKENS, MAX_REQUESTS, WorkloadError, WorkloadItem

MOONCAKE_BLOCK = 512


class TraceRow(BaseModel):
    """Fields common to every trace row; each field's description is the 'expected ...' text of
    its error message."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tenant: str = Field(default="default", min_length=1, description="a non-empty string")
    priority: int = Field(default=0, description="an integer")


class AzureRow(TraceRow):
    """One row of an Azure CSV trace."""

    arrived_at: float = Field(ge=0, allow_inf_nan=False, description="a number of seconds >= 0")
    num_prefill_tokens: int = Field(ge=1, le=MAX_ITEM_TOKENS, description=f"an integer in [1, {MAX_ITEM_TOKENS}]")
    num_decode_tokens: int = Field(ge=1, le=MAX_ITEM_TOKENS, description=f"an integer in [1, {MAX_ITEM_TOKENS}]")


class MooncakeRow(TraceRow):
    """One line of a Mooncake JSONL trace."""

    timestamp: float = Field(ge=0, allow_inf_nan=False, description="a number of milliseconds >= 0")
    input_length: int = Field(ge=1, le=MAX_ITEM_TOKENS, description=f"an integer in [1, {MAX_ITEM_TOKENS}]")
    output_length: int = Field(ge=1, le=MAX_ITEM_TOKENS, description=f"an integer in [1, {MAX_ITEM_TOKENS}]")
    hash_ids: list[int] = Field(description="a list of integer block ids")

    @field_validator("hash_ids")
    @classmethod
    def _blocks_cover_input(cls, ids: list[int], info: ValidationInfo) -> list[int]:
        n, length = len(ids), info.data.get("input_length")
        if n and length is not None and not 0 < length - MOONCAKE_BLOCK * (n - 1) <= MOONCAKE_BLOCK:
            raise ValueError(
                f"{n} block ids of {MOONCAKE_BLOCK} tokens need input_length in "
                f"[{MOONCAKE_BLOCK * (n - 1) + 1}, {MOONCAKE_BLOCK * n}], got {length}"
            )
        return ids


def _row_error(where: str, kind: str, model: type[TraceRow], err: ValidationError) -> WorkloadError:
    parts = []
    for e in err.errors():
        loc = e["loc"]
        if not loc:
            parts.append(f"expected a JSON object, got {e['input']!r}")
            continue
        name = loc[0] + "".join(f"[{p}]" for p in loc[1:])
        if e["type"] == "missing":
            detail = "missing"
        elif e["type"] == "value_error":
            detail = str(e["ctx"]["error"])
        elif len(loc) > 1 or loc[0] not in model.model_fields:
            detail = f"{e['msg'][0].lower()}{e['msg'][1:]}, got {e['input']!r}"
        else:
            detail = f"expected {model.model_fields[loc[0]].description}, got {e['input']!r}"
        parts.append(f"{kind} {name}: {detail}")
    return WorkloadError(f"{where}: " + "; ".join(parts))


def _open(path: Path):
    try:
        return path.open("rb")
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read trace: {e.strerror}") from None


def _lines(f, path: Path):
    """The lines of a file opened in binary, decoded one by one so that a byte that is not UTF-8
    is an error naming the file and its line; a byte-order mark is dropped."""
    for lineno, raw in enumerate(f, 1):
        try:
            yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise WorkloadError(f"{path}:{lineno}: not UTF-8 text ({e.reason}, byte {raw[e.start]:#04x})") from None


def _too_many(path: Path, where: str) -> WorkloadError:
    return WorkloadError(f"{where}: more than {MAX_REQUESTS} requests (the limit of a workload)")


def _finish(rows: list[tuple[float, tuple, int, str, int]]) -> list[WorkloadItem]:
    start = min(r[0] for r in rows)
    if not math.isfinite(max(r[0] for r in rows) - start):
        raise WorkloadError("arrival times span more than a float can hold")
    rows.sort(key=lambda r: r[0])
    return [WorkloadItem(t - start, segs, out, tenant, prio) for t, segs, out, tenant, prio in rows]


def load_azure(path: str | Path) -> list[WorkloadItem]:
    """Requests of an Azure CSV trace (see the module docstring)."""
    path = Path(path)
    required = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    rows = []
    with _open(path) as f:
        reader = csv.reader(_lines(f, path))
        try:
            _azure_rows(reader, path, required, rows)
        except csv.Error as e:
            raise WorkloadError(f"{path}:{reader.line_num}: malformed CSV: {e}") from None
    if not rows:
        raise WorkloadError(f"{path}: no requests")
    return _finish(rows)


def _azure_rows(reader, path: Path, required: tuple[str, ...], rows: list) -> None:
    """Parse the rows of an Azure CSV into `rows`."""
    header = [c.strip() for c in next(reader, [])]
    seen = set()
    for col in header:
        if col in seen and col:
            raise WorkloadError(f"{path}:1: column {col} appears twice (header: {','.join(header)})")
        seen.add(col)
    for col in required:
        if col not in header:
            raise WorkloadError(f"{path}:1: missing column {col} (header: {','.join(header) or 'empty'})")
    columns = [c if c in AzureRow.model_fields else None for c in header]
    for values in reader:
        if not values:
            continue
        where = f"{path}:{reader.line_num}"
        if len(rows) >= MAX_REQUESTS:
            raise _too_many(path, where)
        if len(values) < len(header):
            raise WorkloadError(f"{where}: column {header[len(values)]}: missing")
        if len(values) > len(header):
            raise WorkloadError(f"{where}: {len(values)} fields, the header has {len(header)}")
        data = {}
        for col, value in zip(columns, values):
            value = value.strip()
            if col is not None and (value or col in required):
                data[col] = value
        try:
            row = AzureRow.model_validate(data)
        except ValidationError as e:
            raise _row_error(where, "column", AzureRow, e) from None
        segments = ((("azure", path.stem, len(rows)), row.num_prefill_tokens),)
        rows.append((row.arrived_at, segments, row.num_decode_tokens, row.tenant, row.priority))


def load_mooncake(path: str | Path) -> list[WorkloadItem]:
    """Requests of a Mooncake JSONL trace (see the module docstring)."""
    path = Path(path)
    rows = []
    with _open(path) as f:
        for lineno, line in enumerate(_lines(f, path), 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            if len(rows) >= MAX_REQUESTS:
                raise _too_many(path, where)
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise WorkloadError(f"{where}: malformed JSON: {e}") from None
            except RecursionError:
                raise WorkloadError(f"{where}: malformed JSON: nested too deeply") from None
            try:
                row = MooncakeRow.model_validate(data, strict=True)
            except ValidationError as e:
                raise _row_error(where, "key", MooncakeRow, e) from None
            ids = row.hash_ids
            if ids:
                last = row.input_length - MOONCAKE_BLOCK * (len(ids) - 1)
                segments = tuple((("mooncake", path.stem, h), MOONCAKE_BLOCK) for h in ids[:-1])
                segments += ((("mooncake", path.stem, ids[-1]), last),)
            else:
                segments = ((("mooncake", path.stem, "line", lineno), row.input_length),)
            rows.append((row.timestamp / 1000, segments, row.output_length, row.tenant, row.priority))
    if not rows:
        raise WorkloadError(f"{path}: no requests")
    return _finish(rows)


def load_trace(path: str | Path) -> list[WorkloadItem]:
    """Load a trace by its suffix: `.csv` (Azure) or `.jsonl` (Mooncake)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_azure(path)
    if suffix == ".jsonl":
        return load_mooncake(path)
    raise WorkloadError(f"{path}: unknown trace format {suffix!r} (expected .csv or .jsonl)")


def find_traces_dir(traces_dir: str | Path | None = None) -> Path:
    """The traces folder: `traces_dir`, else $METROLINE_TRACES, else `traces` in the working
    directory (where `metroline traces fetch` saves), else `../shared/traces` next to the
    repository root or the working directory."""
    if traces_dir is not None or os.environ.get("METROLINE_TRACES"):
        path = Path(traces_dir if traces_dir is not None else os.environ["METROLINE_TRACES"])
        if not path.is_dir():
            given = "--traces-dir" if traces_dir is not None else "METROLINE_TRACES"
            raise WorkloadError(f"{given}: traces directory {path} does not exist")
        return path
    candidates = [
        Path.cwd() / "traces",
        Path(__file__).resolve().parents[2] / "../shared/traces",
        Path.cwd() / "../shared/traces",
    ]
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise WorkloadError(
        "no traces directory found: give --traces-dir DIR (`traces_dir` in a config file's [run] table) or "
        "set METROLINE_TRACES to the folder holding the trace files "
        f"({', '.join(TRACE_FILES.values())}; looked in {', '.join(str(p) for p in candidates)})"
    )

