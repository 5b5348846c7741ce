"""Error control over a whole comparison table: a p-value per paired difference, a family-wise
correction over every (policy, metric) verdict of the table (`CORRECTIONS`), and a minimum effect.

A table of `compare --seeds K` holds one directed verdict per policy (other than the baseline) and
metric: 15 metrics and 4 policies are 60 chances to call a difference that is not there. Each
verdict's own interval errs 5% of the time, so a table of identical policies shows at least one
`better` or `worse` far more often than 5%. This module controls the *family-wise error rate*
(FWER: the chance that a table shows any false verdict) at 1 - level, by one of:

- `maxt` (the default): Westfall and Young's step-down max-T over the draws' sign flips
  (`metroline.core.results.max_t`). It uses the metrics' correlation: TTFT mean, p50 and queue
  time move together, and a family of metrics that move together costs little more than one of
  them. It needs K >= 6 draws at 95% (the smallest p-value it can give is 1 / 2^(K-1)); with
  fewer, the table falls back to Holm and says so.
- `holm`: Holm's step-down procedure (Holm 1979) on the paired t-test's p-values: sorted
  ascending, the i-th (from 0) significant while p <= alpha / (m - i) and every smaller one was.
  It holds under any correlation, at the price of treating correlated metrics as independent
  chances (15 metrics: 0.05 / 15 = 0.0033 for the first).
- `none`: each verdict's own interval (no family-wise control; the minimum effect still applies).

`p_value` is the paired t-test's two-sided p-value of the draw-by-draw differences (Student's t
on K - 1 degrees of freedom). The interval of `stats.paired_difference` is the expanded percentile
bootstrap, built to be as wide as that t interval, so an uncorrected p-value below 1 - level and a
verdict agree but for the bootstrap's skew; the bootstrap itself cannot give the small p-values
Holm needs (with 5 draws all of one sign its tail is never below 3%, whatever their size).

A verdict also needs a minimum effect: |relative difference| >= the metric kind's `MIN_EFFECT`
(or `--min-effect`), so that `throughput +0.013% better` is `no difference` however tight its
interval. Metrics without a relative form (a baseline with a negative value, a baseline mean
of 0, or a resampled one: `stats.relative_change`) are compared by their absolute difference
against the same figure.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .max_t import max_t_adjusted, reaches
from .min_effect import CORRECTIONS, DEFAULT_CORRECTION, MIN_EFFECT, parse_min_effect
from .stats import ROUNDING, _t_two_sided_mass

MAXT, HOLM, NONE, MIN_EFFECT_REMOVED = "maxt", "holm", "none", "min_effect"
"""The corrections (`CORRECTIONS`), and why a verdict the interval alone would give was removed:
`removed_by` in a comparison document is the correction's name or `MIN_EFFECT_REMOVED`."""


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
    return [p <= alpha for p in holm_adjusted(p_values)]


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values: the i-th smallest (from 0) times m - i, made monotone, at most 1;
    `p_values[j]` is rejected at family-wise level alpha where its adjusted value is <= alpha
    (as `holm`)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out, running = [1.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
        out[i] = running
    return out


def applied_correction(correction: str, draws: int, level: float) -> str:
    """The correction a table of `draws` draws gets when `correction` is asked: `maxt` falls back
    to `holm` where no sign-flip p-value can reach 1 - `level` (`max_t.reaches`)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"--correction: {correction!r} is not one of {', '.join(CORRECTIONS)}")
    return HOLM if correction == MAXT and not reaches(draws, 1 - level) else correction


def paired_differences(baseline: Sequence[float], values: Sequence[float]) -> np.ndarray:
    """B - A draw by draw, with pairs equal but for float rounding set to 0 (as `paired_difference`)."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(values, dtype=float)
    d = b - a
    d[np.abs(d) <= ROUNDING * np.maximum(np.abs(a), np.abs(b))] = 0.0
    return d


def control(entries: list[dict[str, Any]], kinds: list[str], differences: list[np.ndarray], level: float,
            min_effect: dict[str, float], correction: str = DEFAULT_CORRECTION) -> str:
    """Apply the table's error control to its `vs_baseline` entries (`PairedDifference.as_dict()`
    plus `p_value`), each with its metric kind and its paired differences (one per draw, the same
    draws for all): set `verdict` to the controlled one, keep the interval's own as
    `verdict_uncorrected`, the family-wise `p_adjusted` (None under `none`), and `removed_by` (the
    correction's name, `MIN_EFFECT_REMOVED` or None) where a better/worse was turned into no
    difference. Entries without a direction are left out. Returns the correction applied
    (`applied_correction`: `maxt` asked of too few draws is `holm`)."""
    picked = [i for i, e in enumerate(entries) if e.get("verdict") is not None]
    directed = [(entries[i], kinds[i]) for i in picked]
    draws = len(differences[picked[0]]) if picked else 0
    applied = applied_correction(correction, draws, level) if picked else correction
    if applied == MAXT:
        adjusted: list[float | None] = [float(p) for p in max_t_adjusted(np.column_stack([differences[i] for i in picked]))]
    elif applied == HOLM:
        adjusted = list(holm_adjusted([e["p_value"] for e, _ in directed]))
    else:
        adjusted = [None] * len(directed)
    for (entry, kind), p_adj in zip(directed, adjusted):
        raw = entry["verdict"]
        entry["verdict_uncorrected"], entry["removed_by"], entry["p_adjusted"] = raw, None, p_adj
        if raw == "no difference":
            continue
        rel = entry["relative"]
        size = abs(rel["estimate"] if rel is not None else entry["difference"]["estimate"])
        if p_adj is not None and p_adj > 1 - level:
            entry["verdict"], entry["removed_by"] = "no difference", applied
        elif size < min_effect[kind]:
            entry["verdict"], entry["removed_by"] = "no difference", MIN_EFFECT_REMOVED
    return applied
