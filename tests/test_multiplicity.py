"""Error control over a whole `compare --seeds` table (metroline.core.results.multiplicity): the
corrections over every verdict (max-T, the default; Holm's step-down; none), the paired t-test's
p-value, the minimum effect, and `compare --aa` (one policy against itself, arms differing only in
their plugins' private randomness). The max-T procedure itself: tests/test_max_t.py."""

from __future__ import annotations

import json
import math

import pytest

from metroline import cli
from metroline.core.results.aa import aa_salts, wilson
from metroline.core.results.max_t import max_t_adjusted
from metroline.core.results.multiplicity import MIN_EFFECT, holm, holm_adjusted, p_value, paired_differences, parse_min_effect
from metroline.core.results.paired import format_paired_table, paired_comparison


def test_holm_steps_down_and_stops_at_the_first_failure():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stop (0.04 is not rejected either)
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.04, 0.04], 0.05) == [False, False]  # each alone would be, the family is not
    assert holm([0.02, 0.024], 0.05) == [True, True]
    # adjusted: sorted 0.005 x 4, 0.01 x 3, 0.03 x 2, then max(0.06, 0.04 x 1): monotone
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_p_value_is_the_paired_t_tests():
    d = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, sd sqrt(2.5): t = 3 sqrt(5) / sqrt(2.5) = 3 sqrt(2)
    t = 3 * math.sqrt(2)
    # Student's t with 4 degrees of freedom: P(|T| > t) = 1 - t (t^2 + 6) / (t^2 + 4)^1.5
    assert p_value(d) == pytest.approx(1 - t * (t * t + 6) / (t * t + 4) ** 1.5, rel=1e-9)
    assert p_value([0.0, 0.0, 0.0]) == 1.0 and p_value([2.0, 2.0]) == 0.0 and p_value([1.0]) == 1.0


def test_min_effect_flag():
    assert parse_min_effect(None) == MIN_EFFECT
    assert parse_min_effect("0.02") == dict.fromkeys(MIN_EFFECT, 0.02)
    assert parse_min_effect("count=0.1")["count"] == 0.1 and parse_min_effect("count=0.1")["latency"] == MIN_EFFECT["latency"]
    with pytest.raises(ValueError, match="--min-effect: 'speed' is not a metric kind"):
        parse_min_effect("speed=0.1")
    with pytest.raises(ValueError, match="--min-effect: latency: must be a fraction >= 0"):
        parse_min_effect("latency=-1")


def doc(e2e: float, ttft: float, tok_s: float) -> dict:
    return {"summary": {"e2e_s": {"mean": e2e, "p99": e2e}, "ttft_s": {"mean": ttft, "p50": ttft, "p99": ttft},
                        "output_throughput_tok_s": tok_s}}


SEEDS = list(range(6))
BASE = [1.0, 1.3, 0.9, 1.1, 1.2, 1.05]
NOISE = [0.03, -0.01, 0.04, 0.0, 0.02, 0.01]  # mean 0.015, sd 0.0187: t = 1.96, p = 0.107 -> no verdict anyway


@pytest.mark.parametrize("correction, name", [("maxt", "max-T"), ("holm", "Holm")])
def test_the_table_removes_a_verdict_below_the_min_effect(correction, name):
    strong = [-0.2 + 0.01 * i for i in range(6)]  # every TTFT 17.5-20% lower: far past any threshold
    weak = [0.021, 0.012, 0.019, 0.011, 0.02, 0.013]  # E2E 1.6% higher, t = 9.4, p = 2e-4: significant
    tiny = [2e-4, 1e-4, 3e-4, 2e-4, 1e-4, 2e-4]  # throughput 0.018% higher: p tiny, effect tiny
    runs = {"a": [doc(b, b / 2, 1000.0) for b in BASE],
            "b": [doc(b * (1 + w), b / 2 * (1 + s), 1000.0 * (1 + t)) for b, w, s, t in zip(BASE, weak, strong, tiny)]}
    comparison = paired_comparison(runs, SEEDS, "a", correction=correction)
    assert comparison["error_control"] == correction
    b = comparison["policies"]["b"]
    assert b["summary.ttft_s.mean"]["vs_baseline"]["verdict"] == "better"
    assert b["summary.e2e_s.mean"]["vs_baseline"]["verdict"] == "worse"  # 1.6% >= 1%, the correction keeps it
    tput = b["summary.output_throughput_tok_s"]["vs_baseline"]
    assert (tput["verdict_uncorrected"], tput["verdict"], tput["removed_by"]) == ("better", "no difference", "min_effect")
    table = format_paired_table(comparison)
    assert "better removed: < min effect" in table
    assert f"({name}" in table.splitlines()[1] and f"removed: 0 by {name}, 1 below the minimum effect" in table
    # 1% is a strict threshold: at 2% the E2E verdict goes too
    stricter = paired_comparison(runs, SEEDS, "a", min_effect=parse_min_effect("latency=0.02"), correction=correction)
    assert stricter["policies"]["b"]["summary.e2e_s.mean"]["vs_baseline"]["removed_by"] == "min_effect"


def test_holm_removes_a_verdict_whose_interval_alone_would_stand():
    # E2E 3% higher on 5 of 6 draws, 1% lower on one: the interval excludes 0, but p (0.02) is
    # above 0.05 / 6 (the table has 6 directed verdicts: e2e mean, p99, ttft mean/p50/p99, throughput)
    shift = [0.03, 0.03, 0.03, 0.03, 0.03, -0.01]
    runs = {"a": [doc(b, 0.5, 1000.0) for b in BASE], "b": [doc(b * (1 + s), 0.5, 1000.0) for b, s in zip(BASE, shift)]}
    entry = paired_comparison(runs, SEEDS, "a", correction="holm")["policies"]["b"]["summary.e2e_s.mean"]["vs_baseline"]
    # E2E mean and p99 (the same values) are the two smallest of 6 p-values: adjusted 6p and max(6p, 5p)
    assert 0.05 / 6 < entry["p_value"] < 0.05 and entry["p_adjusted"] == pytest.approx(6 * entry["p_value"])
    assert (entry["verdict_uncorrected"], entry["verdict"], entry["removed_by"]) == ("worse", "no difference", "holm")
    table = format_paired_table(paired_comparison(runs, SEEDS, "a", correction="none"))
    assert "worse removed" not in table and "no family-wise correction over the table's 6 verdicts" in table


BASE10 = [1.0, 1.3, 0.9, 1.1, 1.2, 1.05, 0.95, 1.15, 1.25, 1.0]
SHIFT10 = [0.02, 0.01, 0.03, -0.01, 0.02, 0.02, -0.01, 0.03, 0.01, 0.02]  # 1.4% higher on average


def test_max_t_keeps_a_verdict_of_correlated_metrics_that_holm_removes():
    """Five latencies that move in lockstep (E2E mean and p99, TTFT mean, p50, p99 all shifted as
    E2E) over 10 draws: each t-test's p-value is above 0.05 / 6, so Holm removes all five; max-T
    sees one metric five times over and gives each the one metric's sign-flip p-value, below 5%."""
    runs = {"a": [doc(b, b / 2, 1000.0) for b in BASE10],
            "b": [doc(b * (1 + s), b / 2 * (1 + s), 1000.0) for b, s in zip(BASE10, SHIFT10)]}
    one_metric = max_t_adjusted(paired_differences([d["summary"]["e2e_s"]["mean"] for d in runs["a"]],
                                                   [d["summary"]["e2e_s"]["mean"] for d in runs["b"]])[:, None])[0]
    latencies = ["summary.e2e_s.mean", "summary.e2e_s.p99", "summary.ttft_s.mean", "summary.ttft_s.p50", "summary.ttft_s.p99"]
    holm_table = paired_comparison(runs, list(range(10)), "a", correction="holm")["policies"]["b"]
    max_t_table = paired_comparison(runs, list(range(10)), "a")["policies"]["b"]
    for key in latencies:
        h, m = holm_table[key]["vs_baseline"], max_t_table[key]["vs_baseline"]
        assert 0.05 / 6 < h["p_value"] < 0.05 and h["verdict_uncorrected"] == "worse"
        assert (h["verdict"], h["removed_by"]) == ("no difference", "holm")
        assert m["p_adjusted"] == one_metric <= 0.05 and (m["verdict"], m["removed_by"]) == ("worse", None)


def test_max_t_of_too_few_draws_falls_back_to_holm():
    """5 draws have 16 sign-flip pairs: no max-T p-value can be below 1/16 > 5%, so the table
    applies Holm instead and says so."""
    runs = {"a": [doc(b, 0.5, 1000.0) for b in BASE[:5]], "b": [doc(b * 1.2, 0.5, 1000.0) for b in BASE[:5]]}
    comparison = paired_comparison(runs, SEEDS[:5], "a")
    assert (comparison["correction"], comparison["error_control"]) == ("maxt", "holm")
    assert comparison["policies"]["b"]["summary.e2e_s.mean"]["vs_baseline"]["verdict"] == "worse"
    assert "Holm: 5 draws are too few for max-T" in format_paired_table(comparison)
    with pytest.raises(ValueError, match="--correction: 'bonferroni' is not one of maxt, holm, none"):
        paired_comparison(runs, SEEDS[:5], "a", correction="bonferroni")


def test_aa_salts_are_distinct_for_every_arm_draw_and_table():
    salts = [s for t in range(3) for i in range(4) for s in aa_salts(t, i, 4)]
    assert len(set(salts)) == len(salts) == 24 and min(salts) > 0  # 0 is every engine's default


def test_wilson_interval():
    low, high = wilson(0, 20)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.161, abs=1e-3)  # z^2 / (n + z^2)
    low, high = wilson(10, 20)
    assert low == pytest.approx(1 - high) and low < 0.5 < high


SMALL = ["--workload", "chat", "--max-requests", "60", "--rate-scale", "0.16", "--no-progress", "--jobs", "1"]


def test_aa_of_a_deterministic_policy_says_it_checks_nothing(tmp_path, capsys):
    out = tmp_path / "aa.json"
    assert cli.main(["compare", "--aa", "fcfs", "--seeds", "2", "--trials", "2", *SMALL, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["aa"]["identical"] and doc["aa"]["tables_with_false_verdict"] == 0 and doc["aa"]["tables"] == 2
    assert [r["config"]["plugin_salt"] for r in doc["runs"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert "checks nothing" in capsys.readouterr().out


def test_aa_arms_with_private_randomness_differ(tmp_path, capsys):
    out = tmp_path / "aa.json"
    assert cli.main(["compare", "--aa", "fcfs+aa_plugins:RandomOrder", "--seeds", "2", *SMALL, "--rate-scale", "1",
                     "--json", str(out)]) == 0  # 6 x capacity: requests queue, and the order matters
    doc = json.loads(out.read_text())
    assert not doc["aa"]["identical"]
    a, b = doc["runs"][0]["summary"], doc["runs"][1]["summary"]  # draw 0, arms a and b: the same requests
    assert a["requests"] == b["requests"] and a["ttft_s"]["mean"] != b["ttft_s"]["mean"]


@pytest.mark.parametrize("argv, message", [
    (["--aa", "fcfs"], "--aa: give --seeds K"),
    (["--aa", "fcfs", "--seeds", "2", "--policies", "fcfs,srpt"], "--aa: compares one policy with itself"),
    (["--aa", "fcfs", "--seeds", "2", "--trials", "0"], "--trials: must be at least 1"),
    (["--policies", "fcfs,srpt", "--trials", "3", "--seeds", "2"], "--trials: applies with --aa only"),
    (["--policies", "fcfs,srpt", "--min-effect", "0.1"], "--min-effect: applies with --seeds only"),
    (["--policies", "fcfs,srpt", "--correction", "holm"], "--correction: applies with --seeds only"),
    (["--policies", "fcfs,srpt", "--seeds", "2", "--correction", "sidak"], "--correction: 'sidak' is not one of maxt, holm, none"),
])
def test_bad_aa_flags_are_refused_in_one_line(argv, message, capsys):
    assert cli.main(["compare", *argv, *SMALL]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_aa_tables_hold_their_family_wise_level(tmp_path):
    """30 A/A tables of 6 draws (the fewest at which max-T can reach 5%) of random order of
    service, 60 requests at the workload's full rate (requests queue, so the order of service moves
    every latency), under the default max-T: the share with any false verdict is within
    Binomial(30, 0.05)'s 99% quantile (5), and no metric's rate is above nominal's (3 of 30).

    The negative control: the same tables' uncorrected verdicts (each interval alone, the minimum
    effect kept) are false in more than 5 tables, so a table without the correction fails this
    test (14 of 30 when written, and 5 of 30 on E2E mean alone). At 120 requests and about a
    sixth of the rate (the test before) only 2 of 30 were, the queue too short for the order to
    matter: it passed with no correction at all, and took 1.8 times the CPU."""
    out = tmp_path / "aa.json"
    argv = ["compare", "--aa", "fcfs+aa_plugins:RandomOrder", "--seeds", "6", "--trials", "30", "--workload", "chat",
            "--max-requests", "60", "--rate-scale", "1", "--no-progress", "--json", str(out)]
    assert cli.main(argv) == 0
    rates = json.loads(out.read_text())["aa"]
    assert not rates["identical"] and rates["error_control"] == "maxt"
    assert rates["tables_with_false_verdict"] <= 5
    assert all(m["rate"] * 30 <= 3 for m in rates["per_metric"].values())
    assert rates["tables_with_false_verdict_uncorrected"] > 5
