"""Per-request deadlines as a metric: which requests finished by their deadline (`Request.deadline`,
an absolute engine-clock time: a workload's `deadline_s` after the arrival, or an HTTP body's
`deadline_s` after receipt), overall and per tenant.

A request meets its deadline when it completed (EOS, length or a stop) and its last token came at
or before the deadline; one that failed, was cancelled or was still running at the horizon misses
it. Requests without a deadline are not counted. The figures are the result document's
`deadlines` entry (absent when no request had one), compared across policies like any metric
(`paired.PAIRED_METRICS`: `deadlines.attainment`). A server counts the same as its requests end
(`metroline.core.serving.metrics.ServerMetrics`: `/metrics` and the summary `serve` prints on exit).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .collector import COMPLETED_REASONS


def met_deadline(record: Any, deadline: float) -> bool:
    """Whether a finished sequence's record (`RequestRecord`) met `deadline`: it completed (EOS,
    length or a stop) with its last token at or before it."""
    return record.finish_reason in COMPLETED_REASONS and record.finish_s is not None and record.finish_s <= deadline


def figures_of_counts(counts: Mapping[str, tuple[int, int]]) -> dict[str, Any] | None:
    """The figures (as `deadline_figures`) of `{tenant: (requests with a deadline, met)}`; None
    when no request had one."""
    counts = {t: c for t, c in counts.items() if c[0]}
    if not counts:
        return None
    n, met = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    return {"requests": n, "met": met, "attainment": met / n,
            "by_tenant": {t: {"requests": c[0], "met": c[1], "attainment": c[1] / c[0]} for t, c in sorted(counts.items())}}


def deadline_figures(records: Iterable[Any], deadlines: Mapping[str, float]) -> dict[str, Any] | None:
    """`{"requests", "met", "attainment", "by_tenant": {tenant: {"requests", "met", "attainment"}}}`
    over the records (`RequestRecord`) whose id has a deadline in `deadlines`; None when none has."""
    if not deadlines:
        return None
    counts: dict[str, list[int]] = {}
    for r in records:
        deadline = deadlines.get(r.id)
        if deadline is None:
            continue
        met = met_deadline(r, deadline)
        c = counts.setdefault(r.tenant, [0, 0])
        c[0] += 1
        c[1] += met
    return figures_of_counts(counts)


def deadline_line(figures: dict[str, Any] | None) -> str | None:
    """One line for a run's text output: `deadlines met: 83.1% of 160 (alpha 90.0%, beta 70.0%)`."""
    if not figures:
        return None
    tenants = ", ".join(f"{t} {f['attainment']:.1%}" for t, f in figures["by_tenant"].items())
    return f"deadlines met: {figures['attainment']:.1%} of {figures['requests']} ({tenants})"
