"""Confidence intervals and verdicts for comparing policies over repeated runs.

A comparison over K seeds gives, for each policy and metric, K values (one per workload draw);
every policy ran on the same K draws (common random numbers), so policy B's value on draw i is
paired with the baseline A's value on draw i. This module turns such values into:

- `bootstrap_ci`: a percentile-bootstrap interval of a statistic (the mean, or a percentile) of
  some values: per-seed metric values, or one run's per-request latencies;
- `interval`: a metric's mean over the seeds with its interval;
- `paired_difference`: the mean of the paired differences B - A with its interval, the difference
  relative to A's mean (none where A has a negative value or a mean of 0: `relative_change`),
  and a `verdict` (better, worse, no difference) at the interval's level, in the metric's
  direction (lower latency is better, higher throughput is better).

The bootstrap draws from a fixed seed, so the same values always give the same interval (a result
document is reproducible). With few values the plain percentile interval is too narrow (with 5
seeds it covers the mean about 88% of the time, not 95%); `expanded=True` (the default for means
over seeds) widens it as Hesterberg's *expanded percentile interval* does: the bootstrap quantiles
are taken at the tail probability at which a normal interval would be as wide as Student's t
interval with n - 1 degrees of freedom, α' = 2 Φ(-sqrt(n / (n - 1)) t_{1-α/2, n-1}) (Hesterberg,
"What teachers should know about the bootstrap", The American Statistician 69(4), 2015).
With 30 values it is close to the plain interval. No percentile bootstrap reaches outside the
range of its values, and with 3 values the expanded interval is that range, which holds the true
mean only 75% of the time (both the lowest and the highest of 3 draws miss it with probability 1/8
each): measured coverage of a 95% interval of a normal mean is about 75% with 3 values, 93% with 5,
95% with 8 or more. `FEW_SEEDS` is the count below which a comparison should say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, Sequence

import numpy as np

BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no difference"
"""The three verdicts of `verdict`."""

Direction = Literal["lower", "higher"]
"""Which way a metric improves: "lower" (latencies, preemptions) or "higher" (throughputs)."""

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_231_130
"""The bootstrap's own seed: fixed, so equal values give equal intervals in every run."""
ROUNDING = 1e-9
"""Paired values closer than this, relative to the larger, are equal (`paired_difference`)."""
FEW_SEEDS = 5
"""Below this many values, a 95% interval of a mean covers it noticeably less often than 95%."""
_CHUNK_CELLS = 4_000_000  # resampled values held at once (32 MB of float64)


@dataclass(frozen=True)
class Interval:
    """An estimate with its confidence interval [`low`, `high`] at
    confidence `level`; `n` values went into it."""

    estimate: float
    low: float
    high: float
    level: float
    n: int

    def contains(self, x: float) -> bool:
        """Whether `x` lies in [low, high]."""
        return self.low <= x <= self.high

    def as_dict(self) -> dict[str, float | int]:
        """The interval as JSON types."""
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level, "n": self.n}


@dataclass(frozen=True)
class PairedDifference:
    """Policy B against the baseline A over paired draws: `difference` is the interval of the mean
    of B - A; `relative` is that difference over A's mean, its interval that ratio's over the same
    resamples (`relative_change`: never below -100% for a metric that is never negative; None
    when A's mean is 0 or a resample's is);
    `verdict` says whether B is better, worse or not different at the interval's level, in the
    metric's `direction` (None when the metric has no direction: only the difference is given)."""

    difference: Interval
    relative: Interval | None
    verdict: str | None

    def as_dict(self) -> dict[str, object]:
        return {
            "difference": self.difference.as_dict(),
            "relative": None if self.relative is None else self.relative.as_dict(),
            "verdict": self.verdict,
        }


# ----------------------------------------------------------------------------------------------
# Student's t, for the expanded interval (exact for integer degrees of freedom)


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with `df` degrees of freedom (Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd
        total, term = 0.0, s * math.cos(theta)
        if df > 1:
            total = term
            for k in range(2, df - 1, 2):
                term *= c2 * k / (k + 1)
                total += term
        return min(1.0, 2.0 / math.pi * (theta + total))
    total, term = 1.0, 1.0
    for k in range(1, df - 2, 2):
        term *= c2 * k / (k + 1)
        total += term
    return min(1.0, s * total)


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile (0.5 <= p < 1) of Student's t with `df` >= 1 degrees of freedom."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p!r}, df={df!r}")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while _t_two_sided_mass(hi, df) < target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided_mass(mid, df) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


def expanded_tail(level: float, n: int) -> float:
    """The two-sided tail probability α' whose percentile bootstrap interval of a mean of `n`
    values is as wide as Student's t interval at `level` (see the module docstring)."""
    alpha = 1 - level
    if n < 2:
        return alpha
    t = t_quantile(1 - alpha / 2, n - 1)
    return 2 * NormalDist().cdf(-math.sqrt(n / (n - 1)) * t)


# ----------------------------------------------------------------------------------------------
# The bootstrap


def _statistic(samples: np.ndarray, statistic: str | float) -> np.ndarray:
    """The statistic of each row of `samples`: "mean", or a percentile (0..100, numpy's linear
    definition, as `metrics.percentile`)."""
    if statistic == "mean":
        return samples.mean(axis=1)
    return np.percentile(samples, float(statistic), axis=1)


def _resamples(n: int, resamples: int, seed: int):
    """(first resample's number, index matrix) chunks of `resamples` draws of `n` indices with
    replacement; the same `seed` gives the same draws (two statistics resampled alike stay paired)."""
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_CELLS // n)
    for start in range(0, resamples, rows):
        yield start, rng.integers(0, n, size=(min(resamples, start + rows) - start, n))


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    statistic: str | float = "mean",
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    expanded: bool = False,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """The percentile-bootstrap interval of `statistic` ("mean", or a percentile 0..100) of
    `values`: the statistic of `resamples` resamples drawn with replacement, and its quantiles at
    (1 - level) / 2 and (1 + level) / 2 (at α'/2 and 1 - α'/2 with `expanded`, see the module
    docstring). The estimate is the statistic of `values` themselves. One value gives a zero-width
    interval; none is an error. Vectorised: resamples are drawn as index matrices, in chunks."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n == 0:
        raise ValueError("bootstrap_ci of no values")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap_ci: values must be finite numbers")
    estimate = float(_statistic(x[None, :], statistic)[0])
    if n == 1 or np.all(x == x[0]):
        return Interval(estimate, estimate, estimate, level, n)
    stats = np.empty(resamples)
    for start, index in _resamples(n, resamples, seed):
        stats[start:start + len(index)] = _statistic(x[index], statistic)
    tail = expanded_tail(level, n) if expanded else 1 - level
    low, high = np.quantile(stats, [tail / 2, 1 - tail / 2])
    return Interval(estimate, float(low), float(high), level, n)


def interval(values: Sequence[float], *, level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES) -> Interval:
    """The mean of per-seed `values` with its (expanded) bootstrap interval."""
    return bootstrap_ci(values, "mean", level=level, resamples=resamples, expanded=True)


def verdict(difference: Interval, direction: Direction | None) -> str | None:
    """`BETTER` or `WORSE` when the interval of B - A excludes 0 (in the metric's `direction`),
    `NO_DIFFERENCE` when it contains 0; None for a metric without a direction."""
    if direction is None:
        return None
    if direction not in ("lower", "higher"):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    if difference.contains(0.0):
        return NO_DIFFERENCE
    increased = difference.low > 0
    return BETTER if increased == (direction == "higher") else WORSE


def paired_difference(
    baseline: Sequence[float],
    values: Sequence[float],
    direction: Direction | None,
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
) -> PairedDifference:
    """B (`values`) against A (`baseline`), both one value per draw in the same order: the
    interval of the mean paired difference B - A (resampling the draws, so each pair stays
    together), its relative form (`relative_change`) and the verdict. A pair that differs by no
    more than float rounding (`ROUNDING`, relative) counts as equal: the same time per token
    summed in another order must not make a verdict."""
    a, b = np.asarray(baseline, dtype=float), np.asarray(values, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_difference needs two equal-length lists, got {a.shape} and {b.shape}")
    d = b - a
    d[np.abs(d) <= ROUNDING * np.maximum(np.abs(a), np.abs(b))] = 0.0  # equal but for float rounding
    diff = bootstrap_ci(d, "mean", level=level, resamples=resamples, expanded=True)
    return PairedDifference(diff, relative_change(a, d, diff, resamples), verdict(diff, direction))


def relative_change(a: np.ndarray, d: np.ndarray, diff: Interval, resamples: int = DEFAULT_RESAMPLES) -> Interval | None:
    """The paired difference relative to the baseline's mean: mean(d) / mean(a), its interval
    the quantiles of the same ratio over the same resampled draws as `diff`'s (each resample's
    difference over that resample's own baseline mean). For a metric that is never negative this
    is the relative change of the means, mean(b) / mean(a) - 1, so never below -100%; dividing
    `diff`'s bounds by the full baseline mean instead could be (a draw with a large baseline
    value, resampled often, has a difference larger than the whole mean). None, so that a report
    gives the absolute difference alone, when a baseline value is negative (a ratio to the mean
    of values that can be negative says nothing: the mean may be near 0 or below it, where the
    ratio is unbounded or flips its sign), when the baseline's mean is 0, or when a resample's
    mean is 0 (all its draws 0: the ratio is unbounded there)."""
    base = float(a.mean()) if a.size else 0.0
    if base <= 0.0 or np.any(a < 0):
        return None
    estimate = float(d.mean()) / base
    if not np.any(d):  # no difference on any draw: none in any resample either
        return Interval(estimate, estimate, estimate, diff.level, diff.n)
    ratios = np.empty(resamples)
    for start, index in _resamples(a.size, resamples, BOOTSTRAP_SEED):
        bases = a[index].mean(axis=1)
        if np.any(bases <= 0):
            return None
        ratios[start:start + len(index)] = d[index].mean(axis=1) / bases
    tail = expanded_tail(diff.level, diff.n)
    low, high = np.quantile(ratios, [tail / 2, 1 - tail / 2])
    return Interval(estimate, float(low), float(high), diff.level, diff.n)
