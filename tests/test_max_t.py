"""Westfall and Young's step-down max-T over the draws' sign flips (metroline.core.results.max_t),
checked against cases whose permutation distribution can be counted by hand, its two limits
(metrics that move together cost nothing, independent ones cost Šidák's price), its step-down
monotonicity, and its family-wise error rate on simulated A/A tables."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from metroline.core.results.max_t import (
    EXACT_DRAWS,
    RANDOM_FLIPS,
    abs_t,
    max_t_adjusted,
    reaches,
    sign_patterns,
    smallest_p,
)
from metroline.core.results.multiplicity import holm_adjusted, p_value


def test_sign_patterns_enumerate_half_of_all_flips_observed_first():
    s = sign_patterns(4)
    assert s.shape == (8, 4) and np.all(s[0] == 1) and np.all(s[:, 0] == 1)
    assert len({tuple(row) for row in s}) == 8  # with their negations: all 16 patterns
    assert sign_patterns(EXACT_DRAWS + 4).shape == (RANDOM_FLIPS, EXACT_DRAWS + 4)
    assert np.array_equal(sign_patterns(20), sign_patterns(20))  # drawn from a fixed seed


def test_one_metric_is_its_own_sign_flip_test():
    # 6 draws all positive: only the observed pattern and its negation reach its |t|: 2 / 64
    assert max_t_adjusted(np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]]))[0] == 2 / 64
    # five +1 and one -1: |t| grows with |sum| (the sum of squares is fixed under flips), and
    # |sum| >= 4 takes 0, 1, 5 or 6 negative signs: 1 + 6 + 6 + 1 = 14 of the 64 patterns
    d = np.array([1.0, 1, 1, 1, 1, -1])[:, None]
    assert max_t_adjusted(d)[0] == 14 / 64
    # every difference 0: no evidence at all
    assert max_t_adjusted(np.zeros((5, 1)))[0] == 1.0


def test_perfectly_correlated_metrics_pay_no_multiplicity_price():
    """Metrics that are one metric up to a factor (TTFT mean and p50 moving in lockstep) have equal
    |t*| on every flip, so the maximum over them is any one of them: each adjusted p-value is the
    one metric's own test, where Holm would multiply by the family's size."""
    d = np.array([1.0, 1, 1, 1, 1, -1])
    family = np.column_stack([d, 2.5 * d, -0.3 * d, 1e3 * d])
    assert list(max_t_adjusted(family)) == [14 / 64] * 4
    strong = np.arange(1.0, 7.0)
    assert list(max_t_adjusted(np.column_stack([strong, 3 * strong, -strong]))) == [2 / 64] * 3
    assert holm_adjusted([p_value(strong)] * 3)[0] == pytest.approx(3 * p_value(strong))


@pytest.mark.parametrize("blocks", [2, 3])
def test_independent_metrics_pay_sidaks_price(blocks):
    """Metrics that differ on disjoint draws have independent flipped |t*| (each depends on its own
    draws' signs only), each with the marginal of a 4-draw block all positive: P = 2 / 16 = 1/8.
    The maximum of `blocks` of them reaches the observed |t| with probability 1 - (7/8)^blocks:
    Šidák's correction of 1/8, exactly; the step-down makes the later ones no smaller."""
    k = 4 * blocks
    d = np.zeros((k, blocks))
    for j in range(blocks):
        d[4 * j: 4 * j + 4, j] = 1.0
    assert list(max_t_adjusted(d)) == [1 - (7 / 8) ** blocks] * blocks


def test_step_down_drops_the_rejected_metric_from_the_maximum():
    """Metric A differs on draws 0-5 (all +1), metric B on draws 6-9 (all +1), 10 draws: |t_A| =
    0.6 / sqrt(0.2667 / 10) = 3.67 and |t_B| = 0.4 / sqrt(0.2667 / 10) = 2.45. Only A's all-equal
    flips (2 of 64) reach 3.67 (B's |t*| is at most 2.45; A's next, |sum| 4, is 1.81), so A's
    adjusted p is 1/32. Single-step, B's would be P(max >= 2.45) = 1 - (31/32)(7/8) = 39/256; the
    step-down compares B with its own flips alone, once A is rejected: 1/8."""
    d = np.zeros((10, 2))
    d[:6, 0] = 1.0
    d[6:, 1] = 1.0
    flips = abs_t(d, sign_patterns(10))
    assert flips[0] == pytest.approx([0.6 / np.sqrt(0.4 * 6 / 9 / 10), 0.4 / np.sqrt(0.4 * 6 / 9 / 10)])
    single_step_b = float((flips.max(axis=1) >= flips[0, 1] * (1 - 1e-9)).mean())
    assert single_step_b == 39 / 256
    assert list(max_t_adjusted(d)) == [1 / 32, 1 / 8]


def test_adjusted_p_values_step_down_monotonically():
    """On correlated random tables: the adjusted p-values rise as |t| falls; each is at least the
    metric's own sign-flip p-value and at most the single-step max-T p-value; the most significant
    one is the single-step value."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        k, m = int(rng.integers(6, 12)), int(rng.integers(2, 9))
        mixing = rng.normal(size=(m, m)) * rng.uniform(0, 1, size=m)
        d = rng.normal(size=(k, m)) @ mixing + rng.normal(0, 0.5, size=m)
        adjusted = max_t_adjusted(d)
        flips = abs_t(d, sign_patterns(k))
        observed = flips[0]
        order = np.argsort(-observed, kind="stable")
        assert np.all(np.diff(adjusted[order]) >= 0)
        own = np.array([max_t_adjusted(d[:, [j]])[0] for j in range(m)])
        single = np.array([(flips.max(axis=1) >= t * (1 - 1e-9)).mean() for t in observed])
        assert np.all(adjusted >= own) and np.all(adjusted <= single + 1e-12)
        assert adjusted[order[0]] == single[order[0]]


def test_sixteen_draws_are_still_enumerated_exactly():
    """`EXACT_DRAWS` = 16 is the last count whose 2^15 patterns are all enumerated: every row
    distinct, each with a first sign of +1 (with their negations, all 2^16), none drawn twice.
    Fifteen +1 and one -1 reach |sum| >= 14 on the patterns with 0, 1, 15 or 16 flips of the
    observed signs: 1 + 16 + 16 + 1 = 34 of 2^16, exactly; a sample of random flips would only
    come near it."""
    assert EXACT_DRAWS == 16
    s = sign_patterns(16)
    assert s.shape == (2 ** 15, 16) and np.all(s[0] == 1) and np.all(s[:, 0] == 1)
    assert len({row.tobytes() for row in s}) == 2 ** 15
    d = np.ones((16, 1))
    d[5] = -1.0
    assert max_t_adjusted(d)[0] == 34 / 2 ** 16
    assert max_t_adjusted(np.arange(1.0, 17.0)[:, None])[0] == 2 / 2 ** 16 == smallest_p(16)
    # one draw more: drawn patterns, the observed one first, some drawn twice
    drawn = sign_patterns(17)
    assert np.all(drawn[0] == 1) and not np.all(drawn[:, 0] == 1)
    assert len({row.tobytes() for row in drawn}) < RANDOM_FLIPS


def test_the_granularity_does_not_jump_where_enumeration_stops():
    """Beyond `EXACT_DRAWS` the patterns are drawn, as many as 16 draws enumerate (2^15), so the
    smallest p-value is 2^-15 on both sides of the switch."""
    assert smallest_p(EXACT_DRAWS) == smallest_p(EXACT_DRAWS + 1) == 2.0 ** -15
    assert sign_patterns(EXACT_DRAWS + 1).shape == (2 ** 15, EXACT_DRAWS + 1)


def test_one_draw_has_one_pattern_and_none_is_an_error():
    assert sign_patterns(1).tolist() == [[1.0]]
    assert sign_patterns(2).tolist() == [[1.0, 1.0], [1.0, -1.0]]
    with pytest.raises(ValueError, match="at least one draw, got 0"):
        sign_patterns(0)


def test_a_column_of_equal_nonzero_values_has_infinite_t_where_it_is_not_flipped_to_zero():
    """Four draws of 0.1 (any size, however small): on the observed pattern and its negation the
    flipped values are all equal, sd 0, so |t| is infinite; a pattern with two flips sums to 0
    (|t| 0); one flip or three leave mean +-0.05 and sd sqrt((0.04 - 0.2^2 / 4) / 3) = 0.1:
    |t| = 0.05 / (0.1 / sqrt(4)) = 1."""
    d = np.full((4, 1), 0.1)
    t = abs_t(d, sign_patterns(4))[:, 0]
    patterns = [tuple(row) for row in sign_patterns(4)]
    for row, value in zip(patterns, t):
        flips = row.count(-1.0)
        if flips == 0:
            assert value == np.inf
        elif flips == 2:
            assert value == 0.0
        else:
            assert value == pytest.approx(1.0, rel=1e-9)
    assert max_t_adjusted(d)[0] == 2 / 16


@pytest.mark.parametrize(("e", "flat"), [(0.99e-6, True), (1.01e-6, False)])
def test_values_equal_up_to_the_rounding_tolerance_count_as_equal(e, flat):
    """Draws 1 + e, 1 - e, 1 + e, 1 - e: unflipped, sum 4, sum of squares 4 (1 + e^2), sample
    variance (4 e^2) / 3; the tolerance, 1e-12 x 4 (1 + e^2) / 3, holds it up to e = 1e-6 (to
    within e^2 of 1). Below, the values are one value: |t| infinite; above, |t| = 1 / sqrt(e^2 / 3)."""
    d = np.array([1 + e, 1 - e, 1 + e, 1 - e])[:, None]
    t = abs_t(d, np.ones((1, 4)))[0, 0]
    if flat:
        assert t == np.inf
    else:
        assert t == pytest.approx(1 / np.sqrt(e * e / 3), rel=1e-3)


def _decimal_sign_flip_p(column: list[str]) -> Fraction:
    """A single verdict's sign-flip p-value in exact decimal arithmetic: the share of all 2^K sign
    patterns whose |sum| reaches the observed one (|t| grows with |sum|: the sum of squares is
    the same on every pattern)."""
    values = [Fraction(x) for x in column]
    observed = abs(sum(values))
    hits = sum(abs(sum(s * v for s, v in zip(signs, values))) >= observed
               for signs in itertools.product((1, -1), repeat=len(values)))
    return Fraction(hits, 2 ** len(values))


@pytest.mark.parametrize("column", [
    ["0.3", "0.2", "-0.5", "0.9", "0.4", "1.6"],
    ["0.8", "0.1", "-0.9", "1.3", "1.4", "2.0"],
    ["0.1", "0.8", "-0.9", "0.9", "0.8", "1.9"],
    ["0.8", "0.9", "-1.7", "0.4", "0.6", "1.7"],
])
def test_a_flipped_table_equal_but_for_float_rounding_reaches_the_observed_t(column):
    """Differences given as decimals (milliseconds as a result file prints them) whose first three
    sum to 0: flipping those three leaves the table's |sum|, so its |t|, exactly the observed one,
    but the float sums differ in the last bits, either way. The tie tolerance counts such a pattern
    as reaching the observed |t|: the p-value is the one exact decimal arithmetic gives."""
    expected = _decimal_sign_flip_p(column)
    assert max_t_adjusted(np.array([float(x) for x in column])[:, None])[0] == float(expected)


def test_few_draws_cannot_reach_five_percent():
    assert smallest_p(5) == 1 / 16 and not reaches(5, 0.05)
    assert smallest_p(6) == 1 / 32 and reaches(6, 0.05)
    assert smallest_p(EXACT_DRAWS + 1) == 1 / RANDOM_FLIPS
    with pytest.raises(ValueError, match="K >= 2 draws"):
        max_t_adjusted(np.ones((1, 3)))


def _aa_tables(rng: np.random.Generator, n: int, k: int) -> list[np.ndarray]:
    """`n` simulated A/A tables of `k` draws x 15 metrics: three latent factors (a draw's load,
    its long requests, its tail) each shared by a group of metrics, plus each metric's own noise;
    an A/A's differences are symmetric, here with heavy tails (Student's t, 3 degrees of freedom)."""
    loading = np.zeros((3, 15))
    loading[0, :6] = [1.0, 0.9, 0.8, 0.9, 0.7, 0.6]  # TTFT mean/p50/p99, queue, E2E mean/p99
    loading[1, 6:10] = [1.0, 0.8, -0.7, -0.6]  # TPOT mean/p99, throughputs
    loading[2, 10:12] = [1.0, 0.5]
    return [rng.standard_t(3, size=(k, 3)) @ loading + rng.standard_t(3, size=(k, 15)) * 0.3 for _ in range(n)]


def test_simulated_aa_tables_hold_the_family_wise_level():
    """400 A/A tables of 10 draws: the share with any adjusted p-value <= 5% lies within
    Binomial(400, 0.05)'s central 99% interval [10, 32] (an exact test's rate is 5%, so the check
    also fails a procedure that is much too conservative); Holm's, on the same tables, is lower
    (it counts the correlated metrics as separate chances)."""
    rng = np.random.default_rng(20_231_130)
    tables = _aa_tables(rng, 400, 10)
    max_t = sum(bool(np.any(max_t_adjusted(d) <= 0.05)) for d in tables)
    holm = sum(any(p <= 0.05 for p in holm_adjusted([p_value(d[:, j]) for j in range(15)])) for d in tables)
    assert 10 <= max_t <= 32
    assert holm < max_t
