"""Westfall and Young's step-down max-T procedure over the draws' sign flips: family-wise error
control of a `compare --seeds` table that uses the metrics' correlation.

The table's family is every (policy, metric) verdict; its data are the paired differences
d[i, j] = B - A of verdict j on draw i (K draws, m verdicts). Verdict j's statistic is the paired
t statistic |t_j| = |mean_i d[i, j]| / (sd_i d[i, j] / sqrt(K)).

**The null distribution.** If no policy differs from the baseline, the draws' difference vectors
d[i, :] are symmetric about 0: an A/A's two arms are exchangeable, so swapping them on draw i
(negating the whole row, every metric of it together) leaves the table's distribution unchanged.
Each of the 2^K sign patterns s gives a table s_i d[i, :] as likely as the observed one, and
recomputing every |t_j| on it keeps the metrics' joint behaviour: TTFT mean, p50 and queue time
move together in every flipped table as they did in the observed one. Up to `EXACT_DRAWS` draws
every pattern is enumerated (s and -s give the same |t|, so the 2^(K-1) with s_0 = +1); with more,
`RANDOM_FLIPS` patterns drawn from a fixed seed, the observed one first. With several policies the
rows hold every policy's differences, flipped together (exact when the differences are jointly
symmetric, as under the normality the t-test assumes; for two arms, as in an A/A, always).

**Step-down** (Westfall and Young 1993, *Resampling-Based Multiple Testing*, algorithm 2.8;
Ge, Dudoit and Speed 2003, box 2): order the verdicts by observed |t|, largest first, r_1 .. r_m;
for each pattern take the successive maxima u_i = max(|t*_{r_i}|, ..., |t*_{r_m}|) over the
verdicts not yet rejected; verdict r_i's adjusted p-value is the share of patterns with
u_i >= |t_{r_i}|, made monotone (never below r_{i-1}'s). The first is the single-step max-T
p-value P(max_j |t*_j| >= |t_{r_1}|); each later one compares with the maximum over fewer verdicts,
so the threshold loosens as verdicts are rejected, as Holm's does. The family-wise error rate is
at most alpha whichever verdicts are truly null (subset pivotality: a flipped verdict's |t*|
depends on its own column only, so the true nulls' flipped maxima are the same whatever the other
verdicts' effects, given that the true nulls' differences are symmetric).

Two limits follow from the construction. When every metric is the same up to a factor, all
|t*_j| are equal on every pattern and the adjusted p-value is each metric's own sign-flip p-value:
no multiplicity price. When the metrics are independent (and their |t| alike in distribution,
as t statistics are), the first adjusted p-value is Šidák's 1 - (1 - p)^m. A table's correlation
sits between: max-T is close to the per-metric test where the metrics move together, and close to
Šidák (a little below Bonferroni's m p) where they do not. The granularity is the
price: the smallest adjusted p-value is 1 / 2^(K-1), so K draws reach a family-wise level alpha
only from K >= 1 + log2(1 / alpha) (6 draws at 5%); `reaches` says whether they do.
"""

from __future__ import annotations

import itertools

import numpy as np

from .stats import BOOTSTRAP_SEED

EXACT_DRAWS = 16
"""Up to this many draws every sign pattern is enumerated (2^15 = 32768 of them)."""
RANDOM_FLIPS = 32_768
"""With more draws, this many sign patterns are drawn (the observed one first), from a fixed seed."""
_TIE = 1e-9  # a flipped |t| within this relative distance of the observed one counts as reaching it


def sign_patterns(k: int) -> np.ndarray:
    """The sign patterns (rows of +1/-1, `k` columns) of the null distribution: all 2^(k-1) with a
    first sign of +1 up to `EXACT_DRAWS` draws (the observed all-plus row first), else
    `RANDOM_FLIPS` drawn from `stats.BOOTSTRAP_SEED` after the all-plus row."""
    if k < 1:
        raise ValueError(f"sign_patterns needs at least one draw, got {k}")
    if k <= EXACT_DRAWS:
        rest = np.array(list(itertools.product((1.0, -1.0), repeat=k - 1)), dtype=float)
        rest = rest.reshape(2 ** (k - 1), k - 1)  # k = 1: one empty row
        return np.hstack([np.ones((len(rest), 1)), rest])
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    drawn = rng.choice((1.0, -1.0), size=(RANDOM_FLIPS - 1, k))
    return np.vstack([np.ones((1, k)), drawn])


def abs_t(differences: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """|t| of every column of `differences` (K draws x m verdicts) on every sign pattern (rows of
    `signs`, B x K): a B x m matrix. A column of zeros has |t| 0; a pattern on which a column's
    flipped values are all equal but not 0 has |t| infinite. Equal up to float rounding counts as
    equal: a sample variance of at most 1e-12 x the column's sum of squares / (K - 1)."""
    d = np.asarray(differences, dtype=float)
    k = d.shape[0]
    sums = signs @ d  # B x m
    squares = (d * d).sum(axis=0)  # unchanged by a flip
    var = (squares - sums * sums / k) / (k - 1)
    flat = var <= 1e-12 * np.maximum(squares, np.finfo(float).tiny) / (k - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(sums) / k / np.sqrt(np.where(flat, 1.0, var) / k)
    return np.where(flat, np.where(np.abs(sums) > 0, np.inf, 0.0), t)


def smallest_p(k: int) -> float:
    """The smallest adjusted p-value max-T can give with `k` draws: one pattern pair of all 2^k."""
    return 2.0 ** (1 - k) if k <= EXACT_DRAWS else 1.0 / RANDOM_FLIPS


def reaches(k: int, alpha: float) -> bool:
    """Whether `k` draws can give any verdict at family-wise level `alpha` (`smallest_p` <= alpha)."""
    return k >= 2 and smallest_p(k) <= alpha


def max_t_adjusted(differences: np.ndarray) -> np.ndarray:
    """The step-down max-T adjusted p-values (module docstring) of the columns of `differences`
    (K draws x m verdicts, K >= 2): verdict j is significant at family-wise level alpha where its
    value is <= alpha."""
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2:
        raise ValueError(f"max_t_adjusted needs a K x m matrix with K >= 2 draws, got shape {d.shape}")
    m = d.shape[1]
    if m == 0:
        return np.zeros(0)
    flipped = abs_t(d, sign_patterns(d.shape[0]))  # row 0 is the observed table
    observed = flipped[0]
    order = np.argsort(-observed, kind="stable")  # r_1 (largest |t|) .. r_m
    # successive maxima from the least significant verdict up: u[:, i] = max over r_i .. r_m
    u = np.maximum.accumulate(flipped[:, order[::-1]], axis=1)[:, ::-1]
    threshold = np.where(np.isinf(observed[order]), np.inf, observed[order] * (1 - _TIE))
    raw = (u >= threshold).mean(axis=0)
    adjusted = np.maximum.accumulate(raw)
    out = np.empty(m)
    out[order] = adjusted
    return out
