"""The report's tables, read from result documents, with confidence intervals and verdicts where
the documents carry them.

Intervals: a figure's interval is looked up, in order, as `summary[key]["ci"][stat]`,
`summary[key]["ci"]` (for a scalar key, or the mean), `summary["ci"][key][stat]` and
`summary["ci"][key]`; each an interval `{"low", "high", ...}` (`core/stats.Interval.as_dict`).
Verdicts: a document's `paired` maps a metric to `{"difference", "relative", "verdict"}`
(`PairedDifference.as_dict`) against the baseline the document names in `baseline`.
"""

from __future__ import annotations

import re
from typing import Any

from .document import Table

ROWS = (
    ("requests", "requests", None, "int"),
    ("completed", "completed", None, "int"),
    ("output throughput (tok/s)", "output_throughput_tok_s", None, "num"),
    ("request throughput (req/s)", "request_throughput_req_s", None, "num"),
    ("TTFT mean (ms)", "ttft_s", "mean", "ms"),
    ("TTFT p50 (ms)", "ttft_s", "p50", "ms"),
    ("TTFT p99 (ms)", "ttft_s", "p99", "ms"),
    ("TPOT mean (ms)", "tpot_s", "mean", "ms"),
    ("TPOT p99 (ms)", "tpot_s", "p99", "ms"),
    ("E2E mean (s)", "e2e_s", "mean", "num"),
    ("E2E p99 (s)", "e2e_s", "p99", "num"),
    ("queue mean (s)", "queue_s", "mean", "num"),
    ("preemptions", "preemptions", None, "int"),
    ("recomputed tokens", "recomputed_tokens", None, "int"),
    ("recompute tax", "recompute_tax", None, "pct"),
    ("slot utilisation", "slot_utilization", None, "pct"),
)
"""(row label, summary key, statistic or None for a scalar, format) of the comparison table."""


def fmt(value: Any, kind: str = "num") -> str:
    """A figure as text, 4 significant digits (whole numbers from 10,000): `ms` scales seconds to
    milliseconds, `pct` a share to a percentage; None (cannot be computed) is "-"."""
    if value is None:
        return "-"
    if kind == "int":
        return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    x = value * 1000 if kind == "ms" else value
    return f"{x:,.0f}" if abs(x) >= 10_000 else f"{x:.4g}"  # 15,420 rather than 1.542e+04


def interval(summary: dict[str, Any], key: str, stat: str | None) -> dict[str, Any] | None:
    """The interval of a summary figure, if the document has one (see the module docstring); an
    interval given for a whole distribution is its mean's."""
    value = summary.get(key)
    own = value.get("ci") if isinstance(value, dict) else None
    for ci in (own, (summary.get("ci") or {}).get(key)):
        if not isinstance(ci, dict):
            continue
        if stat is not None and isinstance(ci.get(stat), dict):
            ci = ci[stat]
        elif stat not in (None, "mean"):
            continue
        if "low" in ci and "high" in ci:
            return ci
    return None


def figure(summary: dict[str, Any], key: str, stat: str | None, kind: str) -> str:
    """A cell: the figure, with its interval in brackets when the document has one."""
    value = summary.get(key)
    if stat is not None:
        value = (value or {}).get(stat) if isinstance(value, dict) else None
    text = fmt(value, kind)
    ci = interval(summary, key, stat)
    if ci is not None:
        text += f" [{fmt(ci['low'], kind)}, {fmt(ci['high'], kind)}]"
    return text


def comparison_table(docs: list[dict[str, Any]], labels: list[str]) -> Table:
    """One column per policy; SLO rows when the documents have SLO figures."""
    table = Table(["metric", *labels])
    for label, key, stat, kind in ROWS:
        table.rows.append([label, *(figure(d["summary"], key, stat, kind) for d in docs)])
    fairness = [(d.get("fairness") or {}).get("min_jain") for d in docs]
    if any(f is not None for f in fairness):
        table.rows.append(["Jain's index, worst window", *(fmt(f) for f in fairness)])
    if any(d.get("slo") for d in docs):
        table.rows.append(["SLO attainment", *(fmt((d.get("slo") or {}).get("attainment"), "pct") for d in docs)])
        table.rows.append(["goodput (req/s within SLO)", *(fmt((d.get("slo") or {}).get("goodput_req_s")) for d in docs)])
    return table


def verdict_table(docs: list[dict[str, Any]], labels: list[str]) -> Table | None:
    """Each policy's paired difference from the baseline per metric, with its interval and
    verdict; None when no document has any."""
    metrics = list(dict.fromkeys(m for d in docs for m in (d.get("paired") or {})))
    if not metrics:
        return None
    table = Table(["policy", "baseline", "metric", "difference [95% interval]", "relative", "verdict"])
    for doc, label in zip(docs, labels):
        for metric in metrics:
            p = (doc.get("paired") or {}).get(metric)
            if not p:
                continue
            d, rel = p.get("difference") or {}, p.get("relative")
            diff = f"{fmt(d.get('estimate'))} [{fmt(d.get('low'))}, {fmt(d.get('high'))}]"
            relative = "-" if not rel else f"{fmt(rel.get('estimate'), 'pct')} [{fmt(rel.get('low'), 'pct')}, {fmt(rel.get('high'), 'pct')}]"
            table.rows.append([label, str(doc.get("baseline", "-")), metric, diff, relative, p.get("verdict") or "-"])
    return table


def capacity_table(doc: dict[str, Any]) -> Table:
    """A sweep's capacity at SLO per policy."""
    target = doc["sweep"]["attainment_target"]
    table = Table(["policy", f"capacity at SLO (req/s, >= {target:.0%} within SLO)", "attainment there",
                   "lowest rate failing (req/s)"])
    for label, c in doc["capacity"].items():
        lo, hi = c["bracket"]
        table.rows.append([label, fmt(c["rate_req_s"]) if lo is not None else "below the rates tried",
                           fmt(c["attainment"], "pct"), fmt(hi) if hi is not None else "none tried"])
    return table


def points_table(doc: dict[str, Any]) -> Table:
    """Every (policy, rate) a sweep ran, with its SLO figures and latencies."""
    table = Table(["policy", "offered (req/s)", "attainment", "goodput (req/s)", "TTFT p50 (ms)", "TTFT p99 (ms)",
                   "TPOT p50 (ms)", "E2E p99 (s)"])
    for p in doc["points"]:
        s = p["summary"]
        table.rows.append([
            p["policy"], fmt(p["offered"]["rate_req_s"]), fmt(p["slo"]["attainment"], "pct"),
            fmt(p["slo"]["goodput_req_s"]), figure(s, "ttft_s", "p50", "ms"), figure(s, "ttft_s", "p99", "ms"),
            figure(s, "tpot_s", "p50", "ms"), figure(s, "e2e_s", "p99", "num"),
        ])
    return table


def manifest_table(manifest: dict[str, Any] | None) -> Table | None:
    """What ran: version, commit, command line, workload and its hash, seeds."""
    if not manifest:
        return None
    git = manifest.get("metroline", {}).get("git") or {}
    commit = git.get("commit") or "not a git checkout"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    w = manifest.get("workload") or {}
    rows = [
        ["metroline", f"{manifest.get('metroline', {}).get('version')} at {commit}"],
        ["command", "metroline " + " ".join(manifest.get("command", {}).get("argv", []))],
        ["python", str(manifest.get("python", {}).get("version"))],
        ["workload", f"{w.get('name')} ({w.get('requests')} requests; requests sha256 {str(w.get('items_sha256'))[:12]}"
                     + (f", file sha256 {w['file_sha256'][:12]})" if w.get("file_sha256") else ")")],
        ["seeds", ", ".join(f"{k} {v}" for k, v in (manifest.get("seeds") or {}).items())],
        ["plugins", ", ".join(f"{p['spec']} ({str(p.get('sha256'))[:12]})" for p in manifest.get("plugins", []))],
    ]
    return Table(["", ""], rows)


def file_stem(label: str) -> str:
    """A policy label as a file name part."""
    return re.sub(r"[^A-Za-z0-9_.+@-]", "_", label)
