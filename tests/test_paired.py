"""`metroline.core.results.paired`: the comparison document and table of `metroline compare --seeds`."""

from __future__ import annotations

import json

import pytest

from metroline.core.results.paired import PAIRED_METRICS, format_paired_table, metric_value, paired_comparison
from metroline.core.results.stats import interval, paired_difference


def doc(e2e: float, tok_s: float, tpot: float | None = 0.02, jain: float | None = 0.9) -> dict:
    return {
        "summary": {"e2e_s": {"mean": e2e, "p99": 3 * e2e}, "output_throughput_tok_s": tok_s,
                    "tpot_s": {"mean": tpot, "p99": tpot}, "completed": 100, "preemptions": 0},
        "fairness": {"min_jain": jain},
    }


BASE_E2E = [1.0, 1.4, 0.8, 1.2, 1.1]
RUNS = {
    "fcfs": [doc(e, 500.0 + 10 * i) for i, e in enumerate(BASE_E2E)],
    "srpt": [doc(0.8 * e, 500.0 + 10 * i + 0.01 * (-1) ** i) for i, e in enumerate(BASE_E2E)],
    "slow": [doc(1.1 * e, 490.0 + 10 * i, tpot=None) for i, e in enumerate(BASE_E2E)],
}
SEEDS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def comparison():
    return paired_comparison(RUNS, SEEDS, "fcfs")


def test_each_metric_gets_its_mean_interval_over_the_seeds(comparison):
    entry = comparison["policies"]["srpt"]["summary.e2e_s.mean"]
    values = [0.8 * e for e in BASE_E2E]
    assert entry["values"] == pytest.approx(values)
    assert entry["mean"] == interval(values).as_dict()


def test_each_policy_gets_its_paired_difference_from_the_baseline_with_a_verdict(comparison):
    p = comparison["policies"]
    assert p["fcfs"]["summary.e2e_s.mean"]["vs_baseline"] is None  # the baseline itself
    srpt = p["srpt"]["summary.e2e_s.mean"]["vs_baseline"]
    plain = paired_difference(BASE_E2E, [0.8 * e for e in BASE_E2E], "lower").as_dict()
    assert {k: srpt[k] for k in plain} == plain  # the table's control kept the interval's verdict
    assert srpt["verdict_uncorrected"] == "better" and srpt["removed_by"] is None
    assert srpt["verdict"] == "better" and srpt["relative"]["estimate"] == pytest.approx(-0.2)
    assert p["slow"]["summary.e2e_s.mean"]["vs_baseline"]["verdict"] == "worse"
    assert p["slow"]["summary.output_throughput_tok_s"]["vs_baseline"]["verdict"] == "worse"
    # srpt's throughput wobbles around fcfs's: no difference
    assert p["srpt"]["summary.output_throughput_tok_s"]["vs_baseline"]["verdict"] == "no difference"


def test_missing_metrics_are_left_out_and_none_values_have_no_interval(comparison):
    assert "summary.unfinished" not in comparison["metrics"]  # no run has it (no horizon)
    assert comparison["policies"]["slow"]["summary.tpot_s.mean"]["mean"] is None
    assert comparison["policies"]["slow"]["summary.tpot_s.mean"]["vs_baseline"] is None
    assert comparison["metrics"]["fairness.min_jain"] == {"label": "Jain min", "direction": "higher", "kind": "share"}


def test_the_comparison_is_json_and_records_seeds_baseline_and_level(comparison):
    again = json.loads(json.dumps(comparison))
    assert again == comparison
    assert (again["seeds"], again["baseline"], again["level"]) == (SEEDS, "fcfs", 0.95)


def test_the_table_shows_intervals_differences_and_verdicts(comparison):
    table = format_paired_table(comparison)
    lines = table.splitlines()
    assert "5 seeds (0, 1, 2, 3, 4)" in lines[0]
    e2e = next(i for i, line in enumerate(lines) if line.startswith("E2E mean (ms)"))
    mean = comparison["policies"]["srpt"]["summary.e2e_s.mean"]["mean"]
    assert f"{mean['estimate'] * 1000:.1f} [" in lines[e2e]
    assert lines[e2e + 1].strip().startswith("vs fcfs") and "baseline" in lines[e2e + 1]
    assert "-20.0% [" in lines[e2e + 1] and "better" in lines[e2e + 1] and "worse" in lines[e2e + 1]
    assert "note:" not in table
    few = paired_comparison({k: v[:3] for k, v in RUNS.items()}, SEEDS[:3], "fcfs")
    assert "note: with 3 seeds" in format_paired_table(few)


def test_an_unknown_baseline_or_a_missing_run_is_refused():
    with pytest.raises(ValueError, match="--baseline: 'sjf'"):
        paired_comparison(RUNS, SEEDS, "sjf")
    with pytest.raises(ValueError, match="4 runs for 5 seeds"):
        paired_comparison({"fcfs": RUNS["fcfs"][:4]}, SEEDS, "fcfs")


def test_metric_paths_read_numbers_only():
    d = doc(1.0, 2.0)
    assert metric_value(d, ("summary", "e2e_s", "mean")) == 1.0
    assert metric_value(d, ("summary", "nothing")) is None
    assert metric_value(d, ("summary", "e2e_s", "mean", "deeper")) is None
    assert metric_value({"summary": {"x": True}}, ("summary", "x")) is None
    assert len({path for _, path, *_ in PAIRED_METRICS}) == len(PAIRED_METRICS)


def test_a_tiny_but_consistent_difference_is_not_printed_as_zero():
    runs = {"a": [doc(e, 1000.0) for e in BASE_E2E], "b": [doc(e * 1.00002, 1000.0) for e in BASE_E2E]}
    table = format_paired_table(paired_comparison(runs, SEEDS, "a"))
    lines = table.splitlines()
    verdict_line = lines[next(i for i, x in enumerate(lines) if x.startswith("E2E mean")) + 1]
    assert "worse" in verdict_line and "+0.002%" in verdict_line and "+0.0%" not in verdict_line


def test_report_documents_carry_means_intervals_and_verdicts_where_the_report_reads_them(comparison):
    from metroline.core.ab_report.tables import comparison_table, verdict_table
    from metroline.core.results.paired import report_documents

    shown = report_documents(comparison, [RUNS[p][0] for p in RUNS])
    srpt = shown[1]
    mean = comparison["policies"]["srpt"]["summary.e2e_s.mean"]["mean"]
    assert srpt["summary"]["e2e_s"]["mean"] == mean["estimate"]
    assert srpt["summary"]["ci"]["e2e_s"]["mean"] == mean
    assert srpt["paired"]["E2E mean"]["verdict"] == "better" and srpt["baseline"] == "fcfs"
    assert shown[0]["paired"] == {} and RUNS["srpt"][0]["summary"]["e2e_s"]["mean"] != mean["estimate"]
    rows = comparison_table(shown, list(RUNS)).rows
    e2e = next(r for r in rows if r[0].startswith("E2E mean"))
    assert "[" in e2e[2]  # the interval is shown
    verdicts = verdict_table(shown, list(RUNS)).rows
    assert any(r[:3] == ["srpt", "fcfs", "E2E mean"] and r[-1] == "better" for r in verdicts)


def test_a_relative_difference_is_never_below_minus_100_percent_and_a_zero_baseline_shows_the_absolute_one():
    """Throughput (never negative) of a baseline with one large draw, and a policy that serves
    far less on every draw: the resampled differences, divided by the whole baseline mean,
    reach below -100% (what the table printed before); the relative change of the means cannot.
    Preemptions of a baseline that has none on most draws: some resamples have a baseline mean
    of 0, so the table gives the absolute difference, in the metric's unit."""
    import re

    import numpy as np

    base_tok_s = [10.0, 10.0, 10.0, 10.0, 400.0]
    low_tok_s = [1.0, 1.0, 1.0, 1.0, 0.0]
    runs = {"fcfs": [doc(1.0, t) for t in base_tok_s], "starved": [doc(1.0, t) for t in low_tok_s]}
    for d, p in zip(runs["fcfs"], [0, 0, 0, 0, 8]):
        d["summary"]["preemptions"] = p
    for d in runs["starved"]:
        d["summary"]["preemptions"] = 3
    comparison = paired_comparison(runs, SEEDS, "fcfs")
    diff = comparison["policies"]["starved"]["summary.output_throughput_tok_s"]["vs_baseline"]
    old_low = diff["difference"]["low"] / np.mean(base_tok_s)
    assert old_low < -1.0  # the interval as it was computed before
    rel = diff["relative"]
    assert rel["estimate"] == pytest.approx(np.mean(low_tok_s) / np.mean(base_tok_s) - 1)
    assert -1.0 <= rel["low"] <= rel["estimate"] <= rel["high"] <= 0.0
    assert diff["verdict_uncorrected"] == "worse"
    assert comparison["policies"]["starved"]["summary.preemptions"]["vs_baseline"]["relative"] is None
    table = format_paired_table(comparison)
    percents = [float(x) for x in re.findall(r"([+-]\d+(?:\.\d+)?)%", table)]
    assert percents and min(percents) >= -100.0
    lines = table.splitlines()
    preemptions_vs = lines[next(i for i, line in enumerate(lines) if line.startswith("preemptions")) + 1]
    assert preemptions_vs.split()[3] == f"{3 - np.mean([0, 0, 0, 0, 8]):+.2f}" and "%" not in preemptions_vs
