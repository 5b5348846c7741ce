"""Per-window fairness metrics (`metrics.fairness`) on hand-made request records, and where they
show up: the result document and the terminal tables."""

from __future__ import annotations

import json
import math
import random

import pytest

from metroline.core.results.metrics import MetricsCollector, RequestRecord, fairness, result_document
from metroline.core.results.report import format_comparison_table, format_fairness, format_summary_table


def record(rid, tenant, arrival, finish, *, prompt=0, cached=0, first_token=None, token_times=(),
           reason="length") -> RequestRecord:
    return RequestRecord(
        rid, tenant, 0, arrival, first_token, first_token, first_token,
        finish, prompt, cached, len(token_times), 0, 0, reason, tuple(token_times), None,
    )


@pytest.fixture
def records() -> list[RequestRecord]:
    """Windows of 1 s over [0, 2.5]:

    Each request waits from its arrival until it is first scheduled, at its first token.
    a/x: arrives 0.0, 10-token prompt with 4 cached (6 computed, at its first token 0.5), tokens at
         0.5, 0.8 (window 0) and 1.2 (window 1), finishes 1.2: backlogged (waiting) in window 0.
    b/y: arrives 0.2, 8 computed prompt tokens at 1.5 (window 1), tokens at 1.5 (window 1), 2.0
         (exactly on a boundary: window 2) and 2.5, finishes 2.5: waiting in windows 0 and 1.
    c/w: cancelled while waiting (0.1 to 0.3): backlogged in window 0, never served.
    c/r: rejected: counts nowhere.
    """
    return [
        record("x", "a", 0.0, 1.2, prompt=10, cached=4, first_token=0.5, token_times=(0.5, 0.8, 1.2)),
        record("y", "b", 0.2, 2.5, prompt=8, first_token=1.5, token_times=(1.5, 2.0, 2.5)),
        record("w", "c", 0.1, 0.3, prompt=5, reason="cancelled"),
        record("r", "c", 0.0, None, prompt=99, reason="rejected"),
    ]


def test_windows_tokens_backlog_jain_and_gap(records):
    f = fairness(records, window_s=1.0)
    assert (f["window_s"], f["w_in"], f["w_out"], f["weights"]) == (1.0, 1.0, 1.0, {})
    w0, w1, w2 = f["windows"]
    assert [(w["start_s"], w["end_s"]) for w in f["windows"]] == [(0.0, 1.0), (1.0, 2.0), (2.0, 2.5)]
    assert w0["input"] == {"a": 6, "b": 0, "c": 0} and w0["output"] == {"a": 2, "b": 0, "c": 0}
    assert w1["input"] == {"a": 0, "b": 8, "c": 0} and w1["output"] == {"a": 1, "b": 1, "c": 0}
    assert w2["input"] == {"a": 0, "b": 0, "c": 0} and w2["output"] == {"a": 0, "b": 2, "c": 0}
    assert [w["service"] for w in f["windows"]] == [
        {"a": 8.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 9.0, "c": 0.0}, {"a": 0.0, "b": 2.0, "c": 0.0},
    ]
    assert [w["backlogged"] for w in f["windows"]] == [["a", "b", "c"], ["b"], []]
    assert w0["jain"] == pytest.approx(1 / 3)  # one of three backlogged tenants got everything
    assert w1["jain"] == 1.0  # one backlogged tenant: a, served while running, is not compared
    assert w2["jain"] is None  # nobody waiting
    assert [w["max_service_gap"] for w in f["windows"]] == [8.0, 0.0, None]
    assert f["min_jain"] == pytest.approx(1 / 3)
    assert f["mean_jain"] == pytest.approx((1 / 3 + 1) / 2)
    assert f["max_service_gap"] == 8.0


def test_token_and_tenant_weights(records):
    f = fairness(records, window_s=1.0, w_in=1, w_out=2, weights={"b": 2})
    assert [w["service"] for w in f["windows"]] == [
        {"a": 10.0, "b": 0.0, "c": 0.0}, {"a": 2.0, "b": 10.0, "c": 0.0}, {"a": 0.0, "b": 4.0, "c": 0.0},
    ]
    # jain and the gap are over service / weight, among the tenants waiting in the window
    assert [w["max_service_gap"] for w in f["windows"]] == [10.0, 0.0, None]
    assert f["windows"][0]["jain"] == pytest.approx(1 / 3)
    assert f["weights"] == {"b": 2}


def test_one_long_window_and_the_run_span(records):
    f = fairness(records, window_s=60.0)
    (w,) = f["windows"]
    assert (w["start_s"], w["end_s"]) == (0.0, 2.5)
    assert w["service"] == {"a": 9.0, "b": 11.0, "c": 0.0}
    assert w["backlogged"] == ["a", "b", "c"]
    assert w["jain"] == pytest.approx(400 / (3 * 202))


def test_output_tokens_match_a_brute_force_count():
    rng = random.Random(7)
    recs = []
    for i in range(60):
        arrival = rng.uniform(0, 20)
        times = sorted(arrival + rng.uniform(0, 15) for _ in range(rng.randint(0, 40)))
        finish = (times[-1] if times else arrival) + rng.uniform(0, 1)
        recs.append(record(str(i), rng.choice("pqr"), arrival, finish, prompt=rng.randint(1, 50),
                           first_token=times[0] if times else None, token_times=times))
    f = fairness(recs, window_s=0.7)
    start = min(r.arrival_s for r in recs)
    bounds = [w["start_s"] for w in f["windows"]] + [math.inf]
    for k, w in enumerate(f["windows"]):
        for tenant in "pqr":
            mine = [r for r in recs if r.tenant == tenant]
            out = sum(1 for r in mine for t in r.token_times if bounds[k] <= t < bounds[k + 1])
            inp = sum(r.prompt_tokens for r in mine if r.first_token_s is not None
                      and bounds[k] <= r.first_token_s < bounds[k + 1])
            assert (w["output"][tenant], w["input"][tenant]) == (out, inp)
    assert sum(sum(w["output"].values()) for w in f["windows"]) == sum(r.output_tokens for r in recs)
    assert f["windows"][0]["start_s"] == start


def test_nothing_to_measure_gives_none():
    assert fairness([], window_s=5) == {
        "window_s": 5.0, "w_in": 1.0, "w_out": 1.0, "weights": {}, "windows": [], "min_jain": None,
        "mean_jain": None, "max_service_gap": None,
    }
    only_rejected = [record("r", "t", 1.0, None, reason="rejected")]
    assert fairness(only_rejected)["windows"] == []
    # backlogged but never served: no Jain's index (0/0), a gap of 0
    (w,) = fairness([record("w", "t", 1.0, 2.0, reason="cancelled")])["windows"]
    assert (w["jain"], w["max_service_gap"], w["backlogged"]) == (None, 0.0, ["t"])


@pytest.mark.parametrize("kw, message", [
    ({"window_s": 0}, "window_s must be a number > 0"),
    ({"window_s": -1.0}, "window_s must be a number > 0"),
    ({"window_s": float("nan")}, "window_s must be a number > 0"),
    ({"w_out": -1}, "w_out must be a number >= 0"),
    ({"weights": {"a": 0}}, r"weights\['a'\] must be a number > 0"),
])
def test_bad_arguments_are_named(records, kw, message):
    with pytest.raises(ValueError, match=message):
        fairness(records, **kw)


def collector_of(records: list[RequestRecord]) -> MetricsCollector:
    m = MetricsCollector(4)
    m.requests.extend(records)
    return m


def test_result_document_carries_fairness(records):
    doc = result_document("weighted_fair", {"name": "toy"}, {"name": "sim"}, {}, collector_of(records),
                          kv_peak_blocks=0, wall_s=0.0, window_s=1.0, service_weights={"w_out": 2, "weights": {"b": 2}})
    assert doc["fairness"] == json.loads(json.dumps(
        fairness(records, window_s=1.0, w_out=2, weights={"b": 2}), allow_nan=False))
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    default = result_document("fcfs", {}, {}, {}, collector_of(records), kv_peak_blocks=0, wall_s=0.0)
    assert default["fairness"]["window_s"] == 60.0 and len(default["fairness"]["windows"]) == 1
    with pytest.raises(ValueError, match="unknown key"):
        result_document("fcfs", {}, {}, {}, collector_of(records), kv_peak_blocks=0, wall_s=0.0,
                        service_weights={"w_output": 2})


def test_tables_show_fairness(records):
    doc = result_document("fcfs", {"name": "toy"}, {"name": "sim"}, {}, collector_of(records),
                          kv_peak_blocks=0, wall_s=0.0, window_s=1.0)
    assert format_fairness(doc["fairness"]) == [
        "fairness over 1 s windows: Jain min 0.333, mean 0.667; max service gap 8.0 tokens",
        "worst window 0.0-1.0 s: Jain 0.333, gap 8.0 tokens over 3 backlogged tenants",
    ]
    text = format_summary_table(doc)
    assert "  fairness over 1 s windows: Jain min 0.333" in text
    rows = {line.split("  ")[0]: line.split() for line in format_comparison_table([doc, doc]).splitlines()}
    assert rows["Jain min"][-2:] == ["0.333", "0.333"]
    assert rows["Jain mean"][-2:] == ["0.667", "0.667"]
    assert rows["max service gap (tokens)"][-2:] == ["8.0", "8.0"]
