"""A comparison of policies over several workload draws (seeds): each metric's mean with its
confidence interval, and each policy's paired difference from a baseline with a verdict.

`metroline compare --seeds K` runs every policy on the same K draws of the workload (common random
numbers: policy B's run on draw i meets exactly the requests the baseline's run on draw i met), so
the differences B - A are paired draw by draw, which removes the spread between draws from the
comparison. `paired_comparison` turns the K result documents of each policy into the JSON-ready
comparison; `format_paired_table` prints it. The statistics are `metroline.core.results.stats`'s; the verdicts
are controlled over the whole table (the family-wise error rate over every policy and metric, by
max-T over the draws' sign flips unless Holm or none is asked, and a minimum effect per metric
kind: `metroline.core.results.multiplicity`).
"""

from __future__ import annotations

import copy
from typing import Any

from .min_effect import DEFAULT_CORRECTION
from .multiplicity import control, p_value, paired_differences, parse_min_effect
from .stats import DEFAULT_LEVEL, FEW_SEEDS, interval, paired_difference

# (label, path in a result document, direction, display scale, display unit): the metrics compared.
PAIRED_METRICS: tuple[tuple[str, tuple[str, ...], str | None, float, str], ...] = (
    ("requests", ("summary", "requests"), None, 1.0, ""),
    ("throughput", ("summary", "output_throughput_tok_s"), "higher", 1.0, "tok/s"),
    ("requests done", ("summary", "request_throughput_req_s"), "higher", 1.0, "req/s"),
    ("completed", ("summary", "completed"), "higher", 1.0, ""),
    ("unfinished", ("summary", "unfinished"), "lower", 1.0, ""),
    ("TTFT mean", ("summary", "ttft_s", "mean"), "lower", 1000.0, "ms"),
    ("TTFT p50", ("summary", "ttft_s", "p50"), "lower", 1000.0, "ms"),
    ("TTFT p99", ("summary", "ttft_s", "p99"), "lower", 1000.0, "ms"),
    ("TPOT mean", ("summary", "tpot_s", "mean"), "lower", 1000.0, "ms"),
    ("TPOT p99", ("summary", "tpot_s", "p99"), "lower", 1000.0, "ms"),
    ("E2E mean", ("summary", "e2e_s", "mean"), "lower", 1000.0, "ms"),
    ("E2E p99", ("summary", "e2e_s", "p99"), "lower", 1000.0, "ms"),
    ("queue mean", ("summary", "queue_s", "mean"), "lower", 1000.0, "ms"),
    ("prefix hit rate", ("summary", "prefix_hit_rate"), "higher", 100.0, "%"),
    ("preemptions", ("summary", "preemptions"), "lower", 1.0, ""),
    ("recomputed tokens", ("summary", "recomputed_tokens"), "lower", 1.0, ""),
    ("recompute tax", ("summary", "recompute_tax"), "lower", 100.0, "%"),
    ("slot utilisation", ("summary", "slot_utilization"), None, 100.0, "%"),
    ("Jain min", ("fairness", "min_jain"), "higher", 1.0, ""),
    ("deadlines met", ("deadlines", "attainment"), "higher", 100.0, "%"),
)
"""Each compared metric: its label, its path in a result document, which way is better ("lower",
"higher", or None: no verdict, only the difference), and how the table shows it (scale, unit).
A metric missing from the documents (`unfinished` without a horizon) is left out."""

METRIC_KINDS: dict[str, str] = {
    "output_throughput_tok_s": "throughput", "request_throughput_req_s": "throughput", "completed": "count",
    "unfinished": "count", "preemptions": "count", "recomputed_tokens": "count", "recompute_tax": "share",
    "prefix_hit_rate": "share",
    "min_jain": "share", "attainment": "share",
}
"""The kind of each metric without a latency's (`multiplicity.MIN_EFFECT`), by its path's last key."""


def metric_kind(path: tuple[str, ...]) -> str:
    """The kind of the metric at `path`: latency, throughput, count or share."""
    return METRIC_KINDS.get(path[-1], "latency" if path[-2:-1] and path[-2].endswith("_s") else "count")


def metric_value(doc: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path` in a result document (None when a step of it is missing or None)."""
    value: Any = doc
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metric_key(path: tuple[str, ...]) -> str:
    """The metric's name in the comparison document: its path, dotted."""
    return ".".join(path)


def paired_comparison(
    runs: dict[str, list[dict[str, Any]]], seeds: list[int], baseline: str, *, level: float = DEFAULT_LEVEL,
    min_effect: dict[str, float] | None = None, correction: str = DEFAULT_CORRECTION,
) -> dict[str, Any]:
    """The comparison of `runs` ({policy label: one result document per seed, in the order of
    `seeds`}) against the policy `baseline`:

    `{"seeds", "baseline", "level", "min_effect", "correction", "error_control", "policies":
    {label: {metric: {"values", "mean", "vs_baseline"}}}, "metrics": {metric: {"label",
    "direction", "kind"}}}` where `mean` is the
    interval of the mean over the seeds (`stats.interval`) and `vs_baseline` the paired difference
    from the baseline's values (`stats.paired_difference`, with its `p_value`; None for the
    baseline itself), its `verdict` controlled over the whole table (`multiplicity.control`:
    `verdict_uncorrected`, `p_adjusted`, `removed_by`). A metric that is None in any run of a
    policy (or of the baseline) gets `mean` (or `vs_baseline`) None. `min_effect`: by metric kind,
    default `multiplicity.MIN_EFFECT`. `correction`: `maxt`, `holm` or `none` (`CORRECTIONS`);
    `error_control` is the one applied (`maxt` of fewer than 6 draws is `holm`:
    `multiplicity.applied_correction`)."""
    if baseline not in runs:
        raise ValueError(f"--baseline: {baseline!r} is not one of the compared policies ({', '.join(runs)})")
    for label, docs in runs.items():
        if len(docs) != len(seeds):
            raise ValueError(f"{label}: {len(docs)} runs for {len(seeds)} seeds")
    min_effect = parse_min_effect(None) if min_effect is None else min_effect
    metrics: dict[str, dict[str, Any]] = {}
    policies: dict[str, dict[str, Any]] = {label: {} for label in runs}
    family: list[tuple[dict[str, Any], str, Any]] = []
    for label_text, path, direction, _, _ in PAIRED_METRICS:
        if not any(metric_value(d, path) is not None for docs in runs.values() for d in docs):
            continue
        key, kind = metric_key(path), metric_kind(path)
        metrics[key] = {"label": label_text, "direction": direction, "kind": kind}
        base = [metric_value(d, path) for d in runs[baseline]]
        for label, docs in runs.items():
            values = [metric_value(d, path) for d in docs]
            whole = None not in values
            entry: dict[str, Any] = {"values": values, "mean": interval(values, level=level).as_dict() if whole else None,
                                     "vs_baseline": None}
            if label != baseline and whole and None not in base:
                diff = paired_difference(base, values, direction, level=level).as_dict()
                d = paired_differences(base, values)
                diff["p_value"] = p_value(d)
                entry["vs_baseline"] = diff
                family.append((diff, kind, d))
            policies[label][key] = entry
    applied = control([e for e, _, _ in family], [k for _, k, _ in family], [d for _, _, d in family], level,
                      min_effect, correction)
    return {"seeds": list(seeds), "baseline": baseline, "level": level, "min_effect": min_effect,
            "correction": correction, "error_control": applied, "metrics": metrics, "policies": policies}


def removed_counts(comparison: dict[str, Any]) -> dict[str, int]:
    """How many verdicts of the table are directed (`family`), and how many better/worse ones the
    correction (under its name: `maxt`, `holm`) and the minimum effect (`min_effect`) turned into
    no difference."""
    counts = {"family": 0, comparison["error_control"]: 0, "min_effect": 0}
    for metrics in comparison["policies"].values():
        for entry in metrics.values():
            diff = entry["vs_baseline"]
            if diff is None or diff.get("verdict") is None:
                continue
            counts["family"] += 1
            if diff.get("removed_by"):
                counts[diff["removed_by"]] += 1
    return counts


CORRECTION_NAMES = {"maxt": "max-T", "holm": "Holm"}
"""How the table names a correction that removed a verdict."""


def _format_of(x: float) -> str:
    """The format of a figure of magnitude `x`: whole numbers from 1000, then 1, 2 decimals, then 3
    significant digits."""
    x = abs(x)
    return ".0f" if x >= 1000 else ".1f" if x >= 10 else ".2f" if x >= 1 else ".3g"


def _mean_cell(mean: dict[str, Any] | None, scale: float) -> str:
    if mean is None:
        return "-"
    est, low, high = (mean[k] * scale for k in ("estimate", "low", "high"))
    f = _format_of(est)
    return f"{est:{f}} [{low:{f}}, {high:{f}}]"


def _pct(x: float) -> str:
    """A relative difference in percent: one decimal, or two significant digits below 0.05%."""
    p = x * 100
    return f"{p:+.2g}%" if 0 < abs(p) < 0.05 else f"{p:+.1f}%"


def _diff_cell(diff: dict[str, Any] | None, scale: float = 1.0, unit: str = "") -> str:
    """The relative difference [interval] and verdict; the absolute difference in the metric's
    unit where there is no relative one (a baseline with a negative value or a mean of 0, or
    resamples with a mean of 0: `stats.relative_change`)."""
    if diff is None:
        return ""
    rel = diff["relative"]
    if rel is None:
        d = diff["difference"]["estimate"] * scale
        text = f"{d:+{_format_of(d)}}{f' {unit}' if unit else ''}"
    else:
        text = f"{_pct(rel['estimate'])} [{_pct(rel['low'])}, {_pct(rel['high'])}]"
    if diff.get("removed_by"):
        why = CORRECTION_NAMES.get(diff["removed_by"], "< min effect")
        return f"{text} no difference ({diff['verdict_uncorrected']} removed: {why})"
    return f"{text} {diff['verdict']}" if diff["verdict"] else text


def _control_line(comparison: dict[str, Any], counts: dict[str, int]) -> str:
    """The table's second line: how its verdicts were controlled, and how many each step removed."""
    applied, level = comparison["error_control"], comparison["level"]
    effect = ", ".join(f"{kind} {x:.2%}".replace(".00%", "%") for kind, x in comparison.get("min_effect", {}).items())
    k = len(comparison["seeds"])
    if applied == "none":
        control = f"no family-wise correction over the table's {counts['family']} verdicts (each at {level:.0%})"
    else:
        how = ("max-T over the draws' sign flips" if applied == "maxt" else
               f"Holm{f': {k} draws are too few for max-T at this level' if comparison.get('correction') == 'maxt' else ''}")
        control = f"family-wise error <= {1 - level:.0%} over the table's {counts['family']} verdicts ({how})"
    removed = "" if applied == "none" else f"{counts[applied]} by {CORRECTION_NAMES[applied]}, "
    return (f"verdicts: {control}, each also at least the minimum effect ({effect}); removed: {removed}"
            f"{counts['min_effect']} below the minimum effect")


def format_paired_table(comparison: dict[str, Any]) -> str:
    """The comparison as a table: per metric, a row of each policy's mean [interval], and a row
    of each policy's difference from the baseline, relative to the baseline's mean [interval]
    with its verdict."""
    labels = list(comparison["policies"])
    base = comparison["baseline"]
    level = comparison["level"]
    rows: list[tuple[str, list[str]]] = []
    scales = {metric_key(path): (scale, unit) for _, path, _, scale, unit in PAIRED_METRICS}
    for key, meta in comparison["metrics"].items():
        scale, unit = scales[key]
        name = f"{meta['label']} ({unit})" if unit else meta["label"]
        cells = [comparison["policies"][p][key] for p in labels]
        rows.append((name, [_mean_cell(c["mean"], scale) for c in cells]))
        rows.append((f"  vs {base}", ["baseline" if p == base else _diff_cell(c["vs_baseline"], scale, unit)
                                      for p, c in zip(labels, cells)]))
    label_w = max(len(r[0]) for r in rows) + 2
    widths = [max(len(p), *(len(vals[i]) for _, vals in rows)) + 2 for i, p in enumerate(labels)]
    k = len(comparison["seeds"])
    lines = [f"{k} seeds ({', '.join(map(str, comparison['seeds']))}); mean [{level:.0%} interval] over the seeds; "
             f"differences paired seed by seed, relative to {base}'s mean"]
    counts = removed_counts(comparison)
    if counts["family"]:
        lines.append(_control_line(comparison, counts))
    if k < FEW_SEEDS:
        lines.append(f"note: with {k} seeds an interval covers the true value less often than {level:.0%} "
                     "(about 75% with 3 seeds, 93% with 5); use --seeds 10 for intervals to trust")
    header = f"{'':<{label_w}}" + "".join(f"{p:>{w}}" for p, w in zip(labels, widths))
    lines += [header, "-" * len(header)]
    lines += [f"{name:<{label_w}}" + "".join(f"{v:>{w}}" for v, w in zip(vals, widths)) for name, vals in rows]
    return "\n".join(lines) + "\n"


def report_documents(comparison: dict[str, Any], docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For `--report` with `--seeds`: per policy (in the comparison's order), a copy of its
    document `docs[i]` (one draw's) in which every compared metric is its mean over the seeds,
    with its interval under `summary["ci"]` (`summary.ttft_s.mean` at `summary["ci"]["ttft_s"]
    ["mean"]`), and `paired` ({metric label: its paired difference}), `baseline` and `seeds` added:
    the shape `core/ab_report` reads. What the comparison does not cover stays the draw's."""
    shown = []
    for doc, (label, metrics) in zip(docs, comparison["policies"].items()):
        d = copy.deepcopy(doc)
        ci = d.setdefault("summary", {}).setdefault("ci", {})
        paired = {}
        for key, entry in metrics.items():
            if entry["mean"] is None:
                continue
            path = key.split(".")
            node = d
            for step in path[:-1]:
                if not isinstance(node.get(step), dict):
                    node[step] = {}
                node = node[step]
            node[path[-1]] = entry["mean"]["estimate"]
            if path[0] == "summary":
                node = ci
                for step in path[1:-1]:
                    node = node.setdefault(step, {})
                node[path[-1]] = entry["mean"]
            if entry["vs_baseline"] is not None:
                paired[comparison["metrics"][key]["label"]] = entry["vs_baseline"]
        d.update(policy=label, paired=paired, baseline=comparison["baseline"], seeds=comparison["seeds"])
        shown.append(d)
    return shown
