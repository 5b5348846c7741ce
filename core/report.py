"""Reports of a run: terminal tables, a progress bar, and the CSV and JSON files.

Everything here reads the result document of `metroline.core.metrics.result_document` (or the
collector's records and step tuples) after the run; only `ProgressBar.update` runs per step.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, Iterable, TextIO

from .metrics import LATENCY_FIELDS, RequestRecord, StepRow

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

LATENCY_ROWS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"), ("queue", "queue_s"))

# ----------------------------------------------------------------------------------------------
# Number formatting (None, for "cannot be computed", prints as "-")


def _int(v: Any) -> str:
    return "-" if v is None else f"{v:d}"


def _float(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v * 1000:.2f}"


def _name(part: Any) -> str:
    if isinstance(part, dict):
        for key in ("name", "kind", "type"):
            if part.get(key):
                return str(part[key])
        return "?"
    return "?" if part is None else str(part)


# (label, summary key, formatter) of the headline figures, in display order.
HEADLINE = (
    ("requests", "requests", _int),
    ("completed", "completed", _int),
    ("rejected", "rejected", _int),
    ("steps", "steps", _int),
    ("duration (s)", "duration_s", lambda v: _float(v, 3)),
    ("wall (s)", "wall_s", lambda v: _float(v, 3)),
    ("output tokens", "output_tokens", _int),
    ("throughput (tok/s)", "output_throughput_tok_s", _float),
    ("throughput (req/s)", "request_throughput_req_s", lambda v: _float(v, 3)),
    ("preemptions", "preemptions", _int),
    ("recomputed tokens", "recomputed_tokens", _int),
    ("prefix hit rate", "prefix_hit_rate", _pct),
    ("KV peak blocks", "kv_peak_blocks", _int),
    ("mean batch", "mean_batch_size", _float),
    ("slot utilisation", "slot_utilization", _pct),
    ("prefill share", "prefill_token_share", _pct),
    ("zero-decode steps", "zero_decode_steps", _int),
)


def _title(doc: dict) -> str:
    return (
        f"metroline | policy {doc.get('policy', '?')} | workload {_name(doc.get('workload'))}"
        f" | executor {_name(doc.get('executor'))}"
    )


def format_summary_table(doc: dict) -> str:
    """A fixed-width terminal report of one result document.

    A title line (policy, workload, executor), the headline figures, a latency table in
    milliseconds (TTFT, TPOT, ITL, E2E, queue by mean, p50, p90, p95, p99, max) and, when the run
    had more than one tenant, the fairness lines (see `format_fairness`) and one line per tenant
    (requests, completed, tok/s, TTFT p50 and p99).
    """
    s = doc["summary"]
    title = _title(doc)
    lines = [title, "=" * len(title)]

    cells = [f"{label:<20}{fmt(s.get(key)):>12}" for label, key, fmt in HEADLINE]
    for i in range(0, len(cells), 2):
        lines.append("  " + "    ".join(cells[i:i + 2]))

    lines.append("")
    lines.append("  " + f"{'latency (ms)':<14}" + "".join(f"{f:>11}" for f in LATENCY_FIELDS))
    for label, key in LATENCY_ROWS:
        dist = s.get(key) or {}
        lines.append("  " + f"{label:<14}" + "".join(f"{_ms(dist.get(f)):>11}" for f in LATENCY_FIELDS))

    tenants = doc.get("tenants") or {}
    fairness = doc.get("fairness") or {}
    if len(tenants) > 1 and fairness.get("windows"):
        lines.append("")
        lines.extend("  " + line for line in format_fairness(fairness))
    for label, groups in (("tenant", tenants), ("priority", doc.get("priorities") or {})):
        if len(groups) > 1:
            lines.append("")
            lines.extend(_group_table(label, groups))
    return "\n".join(lines) + "\n"


def _group_table(label: str, groups: dict[str, dict]) -> list[str]:
    """A line per group (tenant or priority class): requests, throughput and TTFT."""
    width = max(14, max(len(g) for g in groups) + 2)
    lines = [
        "  " + f"{label:<{width}}{'requests':>10}{'completed':>11}{'tok/s':>12}"
        f"{'TTFT p50 ms':>13}{'TTFT p99 ms':>13}"
    ]
    for name, g in groups.items():
        ttft = g.get("ttft_s") or {}
        lines.append(
            "  " + f"{name:<{width}}{_int(g.get('requests')):>10}{_int(g.get('completed')):>11}"
            f"{_float(g.get('output_throughput_tok_s')):>12}{_ms(ttft.get('p50')):>13}{_ms(ttft.get('p99')):>13}"
        )
    return lines


def _seconds(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def format_fairness(fairness: dict) -> list[str]:
    """Two lines on a result's `fairness`: Jain's index (min and mean over the windows) and the
    largest weighted-service gap between backlogged tenants, then the worst window (lowest Jain's
    index) with its span, index and gap."""
    lines = [
        f"fairness over {_seconds(fairness.get('window_s'))} s windows: Jain min "
        f"{_float(fairness.get('min_jain'), 3)}, mean {_float(fairness.get('mean_jain'), 3)}; "
        f"max service gap {_float(fairness.get('max_service_gap'), 1)} tokens"
    ]
    rated = [w for w in fairness.get("windows") or () if w.get("jain") is not None]
    if rated:
        worst = min(rated, key=lambda w: w["jain"])
        lines.append(
            f"worst window {worst['start_s']:.1f}-{worst['end_s']:.1f} s: Jain {worst['jain']:.3f}, "
            f"gap {_float(worst.get('max_service_gap'), 1)} tokens over {len(worst.get('backlogged') or ())} "
            "backlogged tenants"
        )
    return lines


FAIRNESS_ROWS = (
    ("Jain min", "min_jain", lambda v: _float(v, 3)),
    ("Jain mean", "mean_jain", lambda v: _float(v, 3)),
    ("max service gap", "max_service_gap", lambda v: _float(v, 1)),
)
"""(label, fairness key, formatter) of the fairness rows of the comparison table."""


COMPARISON_FIELDS = ("mean", "p50", "p99", "max")


def format_comparison_table(docs: list[dict]) -> str:
    """The figures of `format_summary_table`, one column per run (headed by its policy name),
    with the fairness rows (`FAIRNESS_ROWS`) when the documents have them.

    Runs with the same policy name get `#2`, `#3`... appended to their header. Latency rows are
    in milliseconds, at `COMPARISON_FIELDS` (the JSON has every percentile); with several tenants or
    priority classes, each one's TTFT p99 gets a row.
    """
    headers: list[str] = []
    seen: dict[str, int] = {}
    for doc in docs:
        name = str(doc.get("policy", "?"))
        seen[name] = seen.get(name, 0) + 1
        headers.append(name if seen[name] == 1 else f"{name}#{seen[name]}")

    rows: list[tuple[str, list[str]]] = [
        ("workload", [_name(d.get("workload")) for d in docs]),
        ("executor", [_name(d.get("executor")) for d in docs]),
    ]
    for label, key, fmt in HEADLINE:
        rows.append((label, [fmt(d["summary"].get(key)) for d in docs]))
    for label, key in LATENCY_ROWS:
        for f in COMPARISON_FIELDS:
            rows.append(
                (f"{label} {f} (ms)", [_ms((d["summary"].get(key) or {}).get(f)) for d in docs])
            )
    for group, prefix, order in (("tenants", "", str), ("priorities", "priority ", int)):
        names = sorted({n for d in docs for n in (d.get(group) or {})}, key=order)
        if len(names) > 1:
            for n in names:
                rows.append((
                    f"TTFT p99 {prefix}{n} (ms)",
                    [_ms((((d.get(group) or {}).get(n) or {}).get("ttft_s") or {}).get("p99")) for d in docs],
                ))
    if any(d.get("fairness") for d in docs):
        for label, key, fmt in FAIRNESS_ROWS:
            rows.append((label, [fmt((d.get("fairness") or {}).get(key)) for d in docs]))

    label_w = max(len(label) for label, _ in rows) + 2
    col_w = [max(12, len(h) + 2, *(len(vals[i]) + 2 for _, vals in rows)) for i, h in enumerate(headers)]
    lines = [f"{'':<{label_w}}" + "".join(f"{h:>{w}}" for h, w in zip(headers, col_w))]
    lines.append("-" * len(lines[0]))
    for label, vals in rows:
        lines.append(f"{label:<{label_w}}" + "".join(f"{v:>{w}}" for v, w in zip(vals, col_w)))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Progress bar


class _InPlaceLine:
    """A line redrawn in place on `self.stream` by the subclass's `_draw(now)`, when `self.enabled`."""

    enabled: bool
    stream: TextIO

    def _draw(self, now: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Draw the final state and end the line (nothing when disabled)."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> _InPlaceLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressBar(_InPlaceLine):
    """A one-line progress bar (`done/total`, percent, elapsed, ETA) redrawn in place on `stream`.

    `stream` defaults to `sys.stderr` (looked up when the bar is made); `label` (a policy's name)
    starts the line.

    `update(done)` is cheap enough to call every step: it reads the clock only every `stride`
    calls (at most `MAX_STRIDE`), adapting `stride` so that the clock is read about 20 times a
    second, and redraws at most 10 times a second. Enabled by default only when `stream` is a
    terminal.
    """

    MIN_INTERVAL_S = 0.1
    # Bounds how late a redraw can be when steps suddenly get slower (MAX_STRIDE slow steps).
    MAX_STRIDE = 64
    WIDTH = 30

    def __init__(
        self, total: int, stream: TextIO | None = None, enabled: bool | None = None, label: str = ""
    ) -> None:
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.label = f"{label} " if label else ""
        self.done = 0
        self._stride = 1
        self._countdown = 1
        self._start = time.monotonic()
        self._last_check = self._start
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
        total, done = self.total, self.done
        frac = min(1.0, done / total) if total > 0 else 1.0
        filled = int(frac * self.WIDTH)
        elapsed = now - self._start
        eta = f"{elapsed * (1 - frac) / frac:.0f}s" if 0 < frac < 1 else "-"
        self.stream.write(
            f"\r{self.label}[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} {frac * 100:5.1f}%"
            f"  {elapsed:.1f}s  eta {eta} "
        )
        self.stream.flush()



def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


class ProgressBoard(_InPlaceLine):
    """One line on `stream` (default `sys.stderr`) for several runs going on at once: each run's
    label and share done (`fcfs 41% | srpt 38% | ...`), and the time elapsed.

    `update(index, done)` with the requests done by run `index`, or `done=None` once it has
    finished; redraws at most 10 times a second. Enabled by default only on a terminal.
    """

    MIN_INTERVAL_S = 0.1

    def __init__(
        self, labels: list[str], total: int, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.labels = list(labels)
        self.total = total
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.done: list[int | None] = [0] * len(self.labels)
        self._start = time.monotonic()
        self._last_draw = float("-inf")

    def update(self, index: int, done: int | None) -> None:
        self.done[index] = done
        now = time.monotonic()
        if self.enabled and now - self._last_draw >= self.MIN_INTERVAL_S:
            self._draw(now)

    def line(self, now: float) -> str:
        """The text of the line at time `now` (`time.monotonic()`)."""
        cells = []
        for label, done in zip(self.labels, self.done):
            if done is None:
                cells.append(f"{label} done")
            else:
                frac = min(1.0, done / self.total) if self.total > 0 else 1.0
                cells.append(f"{label} {frac * 100:3.0f}%")
        return " | ".join(cells) + f"  {now - self._start:.1f}s"

    def _draw(self, now: float) -> None:
        self._last_draw = now
        self.stream.write("\r" + self.line(now) + " ")
        self.stream.flush()


# ----------------------------------------------------------------------------------------------
# Files


def _cell(v: Any) -> Any:
    return "" if v is None else v


def _open_for_write(path: str | Path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("w", newline="", encoding="utf-8")


def write_requests_csv(path: str | Path, records: Iterable[RequestRecord]) -> None:
    """One row per request record, columns `REQUESTS_CSV_FIELDS`; None is an empty cell."""
    with _open_for_write(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(REQUESTS_CSV_FIELDS)
        for r in records:
            w.writerow([_cell(getattr(r, name)) for name in REQUESTS_CSV_FIELDS])


def write_steps_csv(path: str | Path, steps: Iterable[tuple]) -> None:
    """One row per step tuple of `MetricsCollector.steps`, columns `STEPS_CSV_FIELDS`."""
    idx = [StepRow._fields.index(name) for name in STEPS_CSV_FIELDS]
    with _open_for_write(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(STEPS_CSV_FIELDS)
        for s in steps:
            w.writerow([_cell(s[i]) for i in idx])


def write_json(path: str | Path, doc: dict) -> None:
    """Write a result document as indented JSON (refusing NaN, which a document never holds)."""
    with _open_for_write(path) as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")
