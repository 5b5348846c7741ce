"""`metroline.core.results.stats`: Student's t, the (expanded) percentile bootstrap, paired differences and verdicts."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from metroline.core.results.stats import (
    BETTER,
    NO_DIFFERENCE,
    WORSE,
    Interval,
    bootstrap_ci,
    expanded_tail,
    interval,
    paired_difference,
    t_quantile,
    verdict,
)


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(p):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)


def test_t_quantile_falls_towards_the_normal_quantile_as_the_degrees_of_freedom_grow():
    z = NormalDist().inv_cdf(0.975)
    qs = [t_quantile(0.975, df) for df in (1, 2, 3, 5, 10, 30, 100, 10_000)]
    assert all(a > b for a, b in zip(qs, qs[1:]))
    assert qs[-1] == pytest.approx(z, rel=1e-3)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-9)


def test_t_quantile_refuses_a_probability_outside_its_range():
    with pytest.raises(ValueError):
        t_quantile(0.3, 4)
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)
    with pytest.raises(ValueError, match=r"0.5 <= p < 1 and df >= 1, got p=1.0, df=4"):
        t_quantile(1.0, 4)  # the quantile at 1 is infinite


@pytest.mark.parametrize("expanded", [False, True])
@pytest.mark.parametrize("statistic", ["mean", 90])
def test_the_interval_of_mirrored_values_is_the_mirrored_interval(expanded, statistic):
    """The bootstrap draws its resamples' indices from a fixed seed, whatever the values, so the
    resamples of 10 - x are the mirror images of those of x, and so are their statistics (a mean,
    or the 90th percentile against the 10th). An interval with equal tails is then mirrored
    exactly: its low end is 10 minus the other's high end. Tails of unequal size would not be."""
    x = np.random.default_rng(11).exponential(size=12)
    mirrored_statistic = statistic if statistic == "mean" else 100 - statistic
    a = bootstrap_ci(x, statistic, expanded=expanded)
    b = bootstrap_ci(10.0 - x, mirrored_statistic, expanded=expanded)
    assert b.estimate == pytest.approx(10.0 - a.estimate, rel=1e-12)
    assert b.low == pytest.approx(10.0 - a.high, rel=1e-12)
    assert b.high == pytest.approx(10.0 - a.low, rel=1e-12)
    assert a.low < a.estimate < a.high


def test_the_expanded_tail_is_smaller_than_alpha_and_approaches_it_with_many_values():
    tails = [expanded_tail(0.95, n) for n in (2, 3, 5, 10, 30, 1000)]
    assert all(t < 0.05 for t in tails)
    assert all(a < b for a, b in zip(tails, tails[1:]))
    assert tails[-1] == pytest.approx(0.05, rel=0.01)


def test_a_bootstrap_interval_is_reproducible_and_holds_the_mean():
    x = np.random.default_rng(3).exponential(size=200)
    a, b = bootstrap_ci(x), bootstrap_ci(list(x))
    assert a == b
    assert a.low < a.estimate < a.high
    assert a.estimate == pytest.approx(x.mean())
    assert a.n == 200 and a.level == 0.95


def test_the_mean_interval_of_a_large_sample_is_the_normal_interval():
    rng = np.random.default_rng(5)
    x = rng.normal(10.0, 2.0, size=4000)
    ci = bootstrap_ci(x, resamples=4000)
    half = NormalDist().inv_cdf(0.975) * x.std(ddof=1) / math.sqrt(x.size)
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.1)
    assert (ci.low + ci.high) / 2 == pytest.approx(x.mean(), abs=half * 0.1)


def test_an_interval_narrows_as_one_over_the_root_of_the_sample_size():
    rng = np.random.default_rng(8)
    small, large = rng.normal(size=100), rng.normal(size=1600)
    w_small = bootstrap_ci(small).high - bootstrap_ci(small).low
    w_large = bootstrap_ci(large).high - bootstrap_ci(large).low
    assert w_small / w_large == pytest.approx(4.0, rel=0.25)


def test_a_percentile_interval_covers_the_sample_percentile():
    x = np.random.default_rng(1).lognormal(size=3000)
    ci = bootstrap_ci(x, 90)
    assert ci.estimate == pytest.approx(np.percentile(x, 90))
    assert ci.low < ci.estimate < ci.high
    median = bootstrap_ci(x, 50)
    assert median.high < ci.low  # the 90th percentile is well above the median


def test_equal_values_and_a_single_value_give_a_zero_width_interval():
    assert bootstrap_ci([2.5, 2.5, 2.5]) == Interval(2.5, 2.5, 2.5, 0.95, 3)
    assert bootstrap_ci([7.0]) == Interval(7.0, 7.0, 7.0, 0.95, 1)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, float("nan")])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0], "lower")


def test_the_expanded_interval_is_wider_than_the_plain_one_with_few_values():
    x = [3.1, 2.7, 3.9, 3.3, 2.4]
    plain, wide = bootstrap_ci(x), bootstrap_ci(x, expanded=True)
    assert wide.low < plain.low and wide.high > plain.high
    assert interval(x) == wide


def test_with_three_values_the_expanded_interval_is_their_range():
    x = [4.0, 1.0, 2.5]
    ci = interval(x)
    assert ci.low == pytest.approx(min(x)) and ci.high == pytest.approx(max(x))


def test_the_expanded_interval_covers_the_true_mean_about_as_often_as_its_level():
    """Coverage over 400 samples of 8 normal values: the expanded interval's is near 95%; the
    plain percentile interval's is well below (the reason to expand it)."""
    rng = np.random.default_rng(11)
    hits_plain = hits_wide = 0
    trials = 400
    for _ in range(trials):
        x = rng.normal(0.0, 1.0, size=8)
        hits_plain += bootstrap_ci(x, resamples=2000).contains(0.0)
        hits_wide += bootstrap_ci(x, resamples=2000, expanded=True).contains(0.0)
    assert 0.92 <= hits_wide / trials <= 0.98
    assert hits_plain < hits_wide
    assert hits_plain / trials < 0.93


def test_verdicts_follow_the_metric_direction():
    above = Interval(1.0, 0.5, 1.5, 0.95, 5)
    below = Interval(-1.0, -1.5, -0.5, 0.95, 5)
    around = Interval(0.1, -0.2, 0.4, 0.95, 5)
    assert verdict(above, "lower") == WORSE and verdict(above, "higher") == BETTER
    assert verdict(below, "lower") == BETTER and verdict(below, "higher") == WORSE
    assert verdict(around, "lower") == NO_DIFFERENCE == verdict(around, "higher")
    assert verdict(above, None) is None
    with pytest.raises(ValueError):
        verdict(above, "up")


def test_a_paired_difference_sees_a_small_shift_that_the_spread_between_draws_would_hide():
    """Draws differ a lot from each other; B is A plus a little on every draw. Paired, the
    difference is certain; the two means' own intervals overlap."""
    rng = np.random.default_rng(2)
    a = rng.normal(100.0, 20.0, size=8)
    b = a + 1.0 + rng.normal(0.0, 0.05, size=8)
    d = paired_difference(a, b, "lower")
    assert d.verdict == WORSE
    assert 0.8 < d.difference.low < 1.0 < d.difference.high < 1.2
    assert d.relative.estimate == pytest.approx(d.difference.estimate / a.mean())
    assert interval(a).contains(interval(b).estimate)  # unpaired, no difference could be seen
    assert paired_difference(a, b, "higher").verdict == BETTER


def test_a_policy_against_its_own_values_has_no_difference():
    a = [3.0, 5.0, 4.0, 6.0]
    d = paired_difference(a, a, "lower")
    assert d.verdict == NO_DIFFERENCE
    assert d.difference == Interval(0.0, 0.0, 0.0, 0.95, 4)
    assert d.relative.estimate == 0.0


def test_the_relative_difference_is_none_when_the_baseline_mean_is_zero():
    d = paired_difference([0.0, 0.0, 0.0], [1.0, 2.0, 1.5], "higher")
    assert d.relative is None and d.verdict == BETTER
    assert d.as_dict()["relative"] is None and d.as_dict()["verdict"] == BETTER


def test_a_baseline_with_negative_values_has_no_relative_difference():
    """A relative change against values that can be negative says nothing (a mean near or below 0
    makes the ratio unbounded or flips its sign): only the absolute difference is given, and the
    verdict still follows it. B - A is 1.0 on every draw here."""
    negative_mean = paired_difference([-5.0, -4.0, -6.0], [-4.0, -3.0, -5.0], "higher")
    assert negative_mean.relative is None and negative_mean.verdict == BETTER
    assert negative_mean.difference == Interval(1.0, 1.0, 1.0, 0.95, 3)
    # one negative value under a positive mean (139 / 8): still no ratio, although no resample of
    # these 8 draws has a mean <= 0 (that needs all 8 draws to be the -1.0: 8^-8 of them)
    a = [-1.0, 20.0, 20.0, 20.0, 20.0, 20.0, 20.0, 20.0]
    d = paired_difference(a, [x + 0.5 for x in a], "lower")
    assert d.relative is None and d.verdict == WORSE
    assert d.difference.estimate == 0.5 and d.as_dict()["relative"] is None


def test_a_baseline_with_zeros_and_a_positive_mean_has_a_relative_difference():
    """Zeros are not negative: a count that is 0 on one draw of 8 (mean 14 / 8 = 1.75) still has a
    relative change, mean(d) / mean(a) = 0.35 / 1.75 = 0.2; its interval holds it."""
    a = [0.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    d = paired_difference(a, [x + 0.35 for x in a], "lower")
    assert d.relative is not None and d.relative.estimate == pytest.approx(0.2, rel=1e-12)
    assert d.relative.low < 0.2 < d.relative.high and d.verdict == WORSE


def test_differences_of_float_rounding_make_no_verdict():
    a = [0.01, 0.01, 0.01]
    b = [0.009999999999999998, 0.009999999999999997, 0.009999999999999998]
    d = paired_difference(a, b, "lower")
    assert d.verdict == NO_DIFFERENCE and d.difference.low == d.difference.high == 0.0


def test_the_bootstrap_draws_do_not_depend_on_how_they_are_chunked(monkeypatch):
    # the resamples are drawn in chunks of _CHUNK_CELLS values to bound memory; numpy's generator
    # gives the same index stream however the draws are split into calls, so the chunk size is
    # memory only (bench/mutation.toml lists its mutants as equivalent on this ground)
    from metroline.core.results import stats

    x = np.linspace(0.0, 1.0, 41) ** 3
    b = x + np.sin(np.arange(41.0))
    whole = bootstrap_ci(x, "mean", resamples=997)
    whole_p90 = bootstrap_ci(x, 90, resamples=997)
    whole_rel = paired_difference(x + 1.0, b + 1.0, "lower", resamples=997).relative
    assert whole_rel is not None
    for cells in (1, 41, 41 * 7 + 3, 41 * 500):
        monkeypatch.setattr(stats, "_CHUNK_CELLS", cells)
        assert bootstrap_ci(x, "mean", resamples=997) == whole
        assert bootstrap_ci(x, 90, resamples=997) == whole_p90
        assert paired_difference(x + 1.0, b + 1.0, "lower", resamples=997).relative == whole_rel
