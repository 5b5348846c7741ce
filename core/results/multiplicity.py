"""Error control over a whole comparison table: a p-value per paired difference, Holm's step-down
correction over every (policy, metric) verdict of the table, and a minimum effect size.

A table of `compare --seeds K` holds one directed verdict per policy (other than the baseline) and
metric: 15 metrics and 4 policies are 60 chances to call a difference that is not there. Each
verdict's own interval errs 5% of the time, so a table of identical policies shows at least one
`better` or `worse` far more often than 5%. This module controls the *family-wise error rate*
(FWER: the chance that a table shows any false verdict) at 1 - level with Holm's procedure
(Holm 1979, "A simple sequentially rejective multiple test procedure"): the m p-values sorted
ascending, the i-th (from 0) significant while p <= α / (m - i) and every smaller one was. Holm
holds under any correlation of the metrics (TTFT mean and p50 move together), at the price of
being conservative when they are strongly correlated.

`p_value` is the paired t-test's two-sided p-value of the draw-by-draw differences (Student's t
on K - 1 degrees of freedom). The interval of `stats.paired_difference` is the expanded percentile
bootstrap, built to be as wide as that t interval, so an uncorrected p-value below 1 - level and a
verdict agree but for the bootstrap's skew; the bootstrap itself cannot give the small p-values
Holm needs (with 5 draws all of one sign its tail is never below 3%, whatever their size).

A verdict also needs a minimum effect: |relative difference| >= the metric kind's `MIN_EFFECT`
(or `--min-effect`), so that `throughput +0.013% better` is `no difference` however tight its
interval. Counts without a relative form (a baseline mean of 0, or a resampled one:
`stats.relative_change`) are compared by their absolute difference against the same figure.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .min_effect import MIN_EFFECT, parse_min_effect
from .stats import ROUNDING, _t_two_sided_mass

HOLM, MIN_EFFECT_REMOVED = "holm", "min_effect"
"""Why a verdict the interval alone would give was removed: `removed_by` in a comparison document."""


def p_value(differences: Sequence[float]) -> float:
    """The paired t-test's two-sided p-value of "the mean of `differences` is 0" (see the module
    docstring): 1.0 for fewer than 2 values or all 0, 0.0 when they are all the same other value."""
    d = np.asarray(differences, dtype=float)
    n = d.size
    if n < 2 or np.all(d == 0):
        return 1.0
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 0.0
    t = abs(float(d.mean())) / (sd / math.sqrt(n))
    return float(max(0.0, 1.0 - _t_two_sided_mass(t, n - 1)))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which of `p_values` Holm's step-down procedure rejects at family-wise level `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    m, rejected = len(order), [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def paired_differences(baseline: Sequence[float], values: Sequence[float]) -> np.ndarray:
    """B - A draw by draw, with pairs equal but for float rounding set to 0 (as `paired_difference`)."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(values, dtype=float)
    d = b - a
    d[np.abs(d) <= ROUNDING * np.maximum(np.abs(a), np.abs(b))] = 0.0
    return d


def control(entries: list[dict[str, Any]], kinds: list[str], level: float, min_effect: dict[str, float]) -> None:
    """Apply the table's error control to its `vs_baseline` entries (`PairedDifference.as_dict()`
    plus `p_value`), each with its metric kind: set `verdict` to the controlled one, keep the
    interval's own as `verdict_uncorrected`, and `removed_by` (`HOLM`, `MIN_EFFECT_REMOVED` or None)
    where a better/worse was turned into no difference. Entries without a direction are left out."""
    directed = [(e, k) for e, k in zip(entries, kinds) if e.get("verdict") is not None]
    significant = holm([e["p_value"] for e, _ in directed], 1 - level)
    for (entry, kind), keep in zip(directed, significant):
        raw = entry["verdict"]
        entry["verdict_uncorrected"], entry["removed_by"] = raw, None
        if raw == "no difference":
            continue
        rel = entry["relative"]
        size = abs(rel["estimate"] if rel is not None else entry["difference"]["estimate"])
        if not keep:
            entry["verdict"], entry["removed_by"] = "no difference", HOLM
        elif size < min_effect[kind]:
            entry["verdict"], entry["removed_by"] = "no difference", MIN_EFFECT_REMOVED
