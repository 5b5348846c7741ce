"""The terminal report of a run: the summary table of one result document and the comparison
table of several, drawn by rich.

`print_summary_table` and `print_comparison_table` write to a stream (stdout by default): with
colour on a terminal, plain text in a pipe. `format_summary_table` and `format_comparison_table`
return the plain text. rich is imported when a table is drawn, not before. The tables read the
result document of `metroline.core.results.document.result_document`, after the run.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from .progress import is_terminal
from .report_numbers import fmt_float, fmt_int, fmt_ms, fmt_pct, format_fairness
from .summaries import LATENCY_FIELDS

LATENCY_ROWS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"), ("queue", "queue_s"))

def _name(part: Any) -> str:
    if isinstance(part, dict):
        for key in ("name", "kind", "type"):
            if part.get(key):
                return str(part[key])
        return "?"
    return "?" if part is None else str(part)


def cost_model_label(executor: Any) -> str | None:
    """A simulated executor's cost model in words (`roofline llama-3-8b on A100`, `steps 0.01 s`),
    or None for an executor without one."""
    cost = executor.get("cost_model") if isinstance(executor, dict) else None
    if not isinstance(cost, dict):
        return None
    if isinstance(cost.get("model"), str) and isinstance(cost.get("gpu"), str):
        return f"{_name(cost)} {cost['model']} on {cost['gpu']}"
    return f"{_name(cost)} {cost['step_time']} s" if "step_time" in cost else _name(cost)


# (label, summary key, formatter) of the headline figures, in display order.
HEADLINE = (
    ("requests", "requests", fmt_int),
    ("completed", "completed", fmt_int),
    ("rejected", "rejected", fmt_int),
    ("unfinished", "unfinished", fmt_int),
    ("steps", "steps", fmt_int),
    ("duration (s)", "duration_s", lambda v: fmt_float(v, 3)),
    ("wall (s)", "wall_s", lambda v: fmt_float(v, 3)),
    ("output tokens", "output_tokens", fmt_int),
    ("throughput (tok/s)", "output_throughput_tok_s", fmt_float),
    ("throughput (req/s)", "request_throughput_req_s", lambda v: fmt_float(v, 3)),
    ("preemptions", "preemptions", fmt_int),
    ("recomputed tokens", "recomputed_tokens", fmt_int),
    ("recompute tax", "recompute_tax", fmt_pct),
    ("prefix hit rate", "prefix_hit_rate", fmt_pct),
    ("KV peak blocks", "kv_peak_blocks", fmt_int),
    ("mean batch", "mean_batch_size", fmt_float),
    ("slot utilisation", "slot_utilization", fmt_pct),
    ("prefill share", "prefill_token_share", fmt_pct),
    ("zero-decode steps", "zero_decode_steps", fmt_int),
    ("draft acceptance", "acceptance_rate", fmt_pct),
    ("mean accepted len", "mean_acceptance_length", lambda v: fmt_float(v, 2)),
    ("tokens / req-step", "tokens_per_request_step", lambda v: fmt_float(v, 2)),
    ("drafts thrown away", "draft_tokens_thrown_away", fmt_int),
)
ONLY_WHEN_PRESENT = frozenset({
    "unfinished", "acceptance_rate", "mean_acceptance_length", "tokens_per_request_step", "draft_tokens_thrown_away",
})
"""Headline keys shown only when a summary has them (`unfinished`: a run with a `--horizon`; the
speculation figures: a run with speculative decoding)."""


def _title(doc: dict) -> str:
    """The table's first line: policy, preset (when one is on), workload, executor, cost model."""
    preset = (doc.get("config") or {}).get("preset")
    return (
        f"metroline | policy {doc.get('policy', '?')}"
        + (f" | preset {preset}" if preset else "")
        + f" | workload {_name(doc.get('workload'))}"
        f" | executor {_name(doc.get('executor'))}"
        + (f" | cost model {label}" if (label := cost_model_label(doc.get("executor"))) else "")
    )


# ----------------------------------------------------------------------------------------------
# Drawing (rich)


def _table(
    *columns: str, header: bool = True, min_width: int = 0, labels: tuple[int, ...] = (0,), gap: int = 1
) -> Any:
    """A borderless rich table: the columns of `labels` left-aligned, the others (figures)
    right-aligned and at least `min_width` wide; `gap` spaces each side of a cell."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD if header else None, show_header=header, show_edge=False, pad_edge=False,
                  header_style="bold", padding=(0, gap))
    for i, name in enumerate(columns):
        label = i in labels
        table.add_column(name, justify="left" if label else "right", no_wrap=True,
                         min_width=None if label else min_width, style="bold" if label and header else None)
    return table


def _indented(renderable: Any) -> Any:
    from rich.padding import Padding

    return Padding(renderable, (0, 0, 0, 2), expand=False)


def _draw(parts: list[Any], file: TextIO) -> None:
    """Draw `parts` (rich renderables, or strings as plain text) on `file`; colour only when
    `file` is a terminal."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file, highlight=False, markup=False, emoji=False, width=_WIDTH, soft_wrap=False)
    for part in parts:
        console.print(Text(part) if isinstance(part, str) else part)


def _print(parts: list[Any], file: TextIO | None = None) -> None:
    """`parts` on `file` (default stdout): drawn in colour on a terminal, else the plain text."""
    file = sys.stdout if file is None else file
    if is_terminal(file):
        _draw(parts, file)
    else:
        file.write(_plain(parts))
        file.flush()


_WIDTH = 1000
"""Lines are never wrapped by rich (a wide comparison stays one row per figure)."""


def _plain(parts: list[Any]) -> str:
    """`parts` drawn as plain text: no colour, no trailing spaces."""
    buffer = io.StringIO()
    _draw(parts, buffer)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


# ----------------------------------------------------------------------------------------------
# The summary of one run


def _summary_parts(doc: dict) -> list[Any]:
    from rich.text import Text

    s = doc["summary"]
    title = _title(doc)
    parts: list[Any] = [Text(title, style="bold"), "=" * len(title)]

    # two figures a line: a label 20 wide, its value right-aligned in 12, 4 spaces between the pairs
    headline = _table("", "", "", "", "", header=False, labels=(0, 2, 3), gap=0)
    for column, width in zip(headline.columns, (20, 12, 4, 20, 12)):
        column.min_width = width
    cells = [(label, fmt(s.get(key))) for label, key, fmt in HEADLINE if key in s or key not in ONLY_WHEN_PRESENT]
    for i in range(0, len(cells), 2):
        (a, x), *rest = cells[i:i + 2]
        headline.add_row(a, x, "", *(rest[0] if rest else ("", "")))
    parts += [_indented(headline), ""]

    latency = _table("latency (ms)", *LATENCY_FIELDS, min_width=9)
    for label, key in LATENCY_ROWS:
        dist = s.get(key) or {}
        latency.add_row(label, *(fmt_ms(dist.get(f)) for f in LATENCY_FIELDS))
    parts.append(_indented(latency))

    tenants = doc.get("tenants") or {}
    fairness = doc.get("fairness") or {}
    if len(tenants) > 1 and fairness.get("windows"):
        parts += ["", *("  " + line for line in format_fairness(fairness))]
    for label, groups in (("tenant", tenants), ("priority", doc.get("priorities") or {})):
        if len(groups) > 1:
            parts += ["", _indented(_group_table(label, groups))]
    return parts


def _group_table(label: str, groups: dict[str, dict]) -> Any:
    """A row per group (tenant or priority class): requests, throughput, TTFT, preemptions and,
    when the groups have them (tenants), the running mean and max."""
    running = all("running_mean" in g for g in groups.values())
    extra = ("running mean", "running max") if running else ()
    table = _table(label, "requests", "completed", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "preempted", *extra)
    for name, g in groups.items():
        ttft = g.get("ttft_s") or {}
        cells = (fmt_float(g.get("running_mean")), fmt_int(g.get("running_max"))) if running else ()
        table.add_row(name, fmt_int(g.get("requests")), fmt_int(g.get("completed")),
                      fmt_float(g.get("output_throughput_tok_s")), fmt_ms(ttft.get("p50")), fmt_ms(ttft.get("p99")),
                      fmt_int(g.get("preemptions")), *cells)
    return table


def format_summary_table(doc: dict) -> str:
    """The terminal report of one result document, as plain text.

    A title line (policy, workload, executor), the headline figures, a latency table in
    milliseconds (TTFT, TPOT, ITL, E2E, queue by mean, p50, p90, p95, p99, max) and, when the run
    had more than one tenant, the fairness lines (see `format_fairness`) and one row per tenant
    (requests, completed, tok/s, TTFT p50 and p99, preempted: its requests' preemptions, running
    mean and max: how many of its requests ran at once); the same per priority class (without the
    running counts).
    """
    return _plain(_summary_parts(doc))


def print_summary_table(doc: dict, file: TextIO | None = None) -> None:
    """`format_summary_table` printed to `file` (default stdout), with colour on a terminal."""
    _print(_summary_parts(doc), file)


FAIRNESS_ROWS = (
    ("Jain min", "min_jain", lambda v: fmt_float(v, 3)),
    ("Jain mean", "mean_jain", lambda v: fmt_float(v, 3)),
    ("max service gap (tokens)", "max_service_gap", lambda v: fmt_float(v, 1)),
)
"""(label, fairness key, formatter) of the fairness rows of the comparison table."""


COMPARISON_FIELDS = ("mean", "p50", "p99", "max")


def _comparison_table(docs: list[dict]) -> list[Any]:
    headers: list[str] = []
    seen: dict[str, int] = {}
    for doc in docs:
        name = str(doc.get("label") or doc.get("policy", "?"))
        seen[name] = seen.get(name, 0) + 1
        headers.append(name if seen[name] == 1 else f"{name}#{seen[name]}")

    rows: list[tuple[str, list[str]]] = [
        ("workload", [_name(d.get("workload")) for d in docs]),
        ("executor", [_name(d.get("executor")) for d in docs]),
    ]
    if any(labels := [cost_model_label(d.get("executor")) for d in docs]):
        rows.append(("cost model", [label or "-" for label in labels]))
    if any("outputs" in d for d in docs):  # deterministic runs of a real model (`output_digests`)
        rows.append(("outputs", [d.get("outputs", "-") for d in docs]))
    for label, key, fmt in HEADLINE:
        if key in ONLY_WHEN_PRESENT and not any(key in d["summary"] for d in docs):
            continue
        rows.append((label, [fmt(d["summary"].get(key)) for d in docs]))
    for label, key in LATENCY_ROWS:
        for f in COMPARISON_FIELDS:
            rows.append(
                (f"{label} {f} (ms)", [fmt_ms((d["summary"].get(key) or {}).get(f)) for d in docs])
            )
    for group, prefix, order in (("tenants", "", str), ("priorities", "priority ", int)):
        names = sorted({n for d in docs for n in (d.get(group) or {})}, key=order)
        if len(names) > 1:
            for n in names:
                rows.append((
                    f"TTFT p99 {prefix}{n} (ms)",
                    [fmt_ms((((d.get(group) or {}).get(n) or {}).get("ttft_s") or {}).get("p99")) for d in docs],
                ))
    if any(d.get("fairness") for d in docs):
        for label, key, fmt in FAIRNESS_ROWS:
            rows.append((label, [fmt((d.get("fairness") or {}).get(key)) for d in docs]))

    shared = [(label, values[0]) for label, values in rows
              if label in SHARED_ROWS and len(docs) > 1 and len(set(values)) == 1]
    rows = [(label, values) for label, values in rows if (label, values[0]) not in shared or len(set(values)) > 1]
    parts: list[Any] = [" | ".join(f"{label} {value}" for label, value in shared)] if shared else []
    for group in _column_groups(headers, rows):
        table = _table("", *(headers[i] for i in group), min_width=COMPARISON_MIN_WIDTH)
        for label, values in rows:
            table.add_row(label, *(values[i] for i in group))
        parts += [""] * bool(parts) + [table]
    return parts


SHARED_ROWS = ("workload", "executor", "cost model")
"""Rows printed once, on the line above the table, when every run has the same value."""
COMPARISON_WIDTH = 100
"""The comparison table's widest line: more runs than fit are shown in several tables, one under
the other, each with the row labels."""
COMPARISON_MIN_WIDTH = 8


def _column_groups(headers: list[str], rows: list[tuple[str, list[str]]]) -> list[list[int]]:
    """The runs' columns split, in order, into groups whose table fits `COMPARISON_WIDTH` (a
    column too wide for that even alone is a group of its own)."""

    def width(group: list[int]) -> int:
        table = _table("", *(headers[i] for i in group), min_width=COMPARISON_MIN_WIDTH)
        for label, values in rows:
            table.add_row(label, *(values[i] for i in group))
        return max(len(line) for line in _plain([table]).splitlines())

    groups: list[list[int]] = [[]]
    for i in range(len(headers)):
        if groups[-1] and width([*groups[-1], i]) > COMPARISON_WIDTH:
            groups.append([])
        groups[-1].append(i)
    size = -(-len(headers) // len(groups))  # as many tables, as even as they can be (5 + 2 -> 4 + 3)
    even = [list(range(i, min(i + size, len(headers)))) for i in range(0, len(headers), size)]
    if len(even) == len(groups) and all(width(g) <= COMPARISON_WIDTH for g in even):
        return even
    return groups


def format_comparison_table(docs: list[dict]) -> str:
    """The figures of `format_summary_table`, one column per run (headed by its policy name),
    with the fairness rows (`FAIRNESS_ROWS`) when the documents have them, as plain text.

    Runs with the same policy name get `#2`, `#3`... appended to their header. Latency rows are
    in milliseconds, at `COMPARISON_FIELDS` (the JSON has every percentile); with several tenants or
    priority classes, each one's TTFT p99 gets a row. The rows of `SHARED_ROWS` that every run
    shares make one line above the table; no line is wider than `COMPARISON_WIDTH` (100) unless one
    run's column alone is: runs that do not fit go to a second table under the first.
    """
    return _plain(_comparison_table(docs))


def print_comparison_table(docs: list[dict], file: TextIO | None = None) -> None:
    """`format_comparison_table` printed to `file` (default stdout), with colour on a terminal."""
    _print(_comparison_table(docs), file)
