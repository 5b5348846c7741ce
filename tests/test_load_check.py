"""The load check: a load far below capacity is called light, one far above it heavy, and the
estimated capacity and suggested `--rate-scale` match the capacity derived from the workload
(`tests/test_sweep.py` explains it: C = SLOTS / (OUT * STEP) under the `steps` cost model)."""

from __future__ import annotations

import pytest
from test_sweep import CAPACITY, OUT, STEP, N, config, sim, workload

from metroline.core.experiments import load_check
from metroline.core.experiments.run_series import series_of
from metroline.core.experiments.runner import run_workload
from metroline.core.experiments.sweep import at_rate


def stats_at(rate: float, rate_scale: float = 1.0) -> dict:
    w = at_rate(workload(), rate)
    w.params["rate_scale"] = rate_scale  # as if the user had asked for it with --rate-scale
    doc, engine = run_workload(w, config(), sim())
    return series_of(engine, doc).load


def test_a_load_far_below_capacity_is_light_and_the_suggestion_brings_it_near_capacity():
    stats = stats_at(0.1 * CAPACITY, rate_scale=2.0)
    # Little's law: each request holds a slot OUT steps, so the slots are 10% used
    assert stats["slot_use"] == pytest.approx(0.1, rel=0.05)
    assert stats["queued_share"] == 0.0
    found = load_check.estimate(stats)
    assert found["kind"] == "light" and found["binding"] == "slot_use"
    assert found["capacity_req_s"] == pytest.approx(CAPACITY, rel=0.05)
    # 2.0 gave 0.1 C: the scale for 0.95 C is 2.0 * 9.5
    assert found["suggested_rate_scale"] == pytest.approx(2.0 * load_check.TARGET_LOAD / 0.1, rel=0.05)
    message = load_check.message(found["kind"], found)
    assert message.startswith("warning: load too light") and f"--rate-scale {found['suggested_rate_scale']:g}" in message


def test_a_load_far_above_capacity_is_heavy_and_its_capacity_is_the_rate_served():
    rate = 3 * CAPACITY
    stats = stats_at(rate)
    span = (N - 1) / rate
    # saturated: the first requests finish OUT steps after the start, then C a second
    assert stats["queued_share"] > 0.9
    found = load_check.estimate(stats)
    assert found["kind"] == "heavy"
    assert found["capacity_req_s"] == pytest.approx(CAPACITY * (1 - OUT * STEP / span), rel=0.05)
    assert found["suggested_rate_scale"] == pytest.approx(load_check.TARGET_LOAD * CAPACITY / rate, rel=0.15)
    assert "load too heavy" in load_check.message("heavy", found)


def test_several_policies_are_light_only_when_every_one_is():
    light, heavy = stats_at(0.1 * CAPACITY), stats_at(3 * CAPACITY)
    assert load_check.check([light, light], ["a", "b"])["kind"] == "light"
    mixed = load_check.check([light, heavy], ["a", "b"])
    assert mixed["kind"] == "fine" and mixed["message"] is None
    assert set(mixed["runs"]) == {"a", "b"}
    assert load_check.check([{}], ["a"]) is None


def test_a_run_shorter_than_a_few_service_times_is_not_judged():
    # 30 requests at 0.1 C arrive over 7.25 s, each served OUT steps = 0.2 s: long enough; at
    # 5 C they arrive over 0.145 s, under 3 service times, and the batch is still filling
    w = at_rate(workload(), 5 * CAPACITY)
    w.items = w.items[:30]
    doc, engine = run_workload(w, config(), sim())
    stats = series_of(engine, doc).load
    assert stats["service_s"] == pytest.approx(OUT * STEP, rel=0.05)
    found = load_check.check([stats], ["fcfs"])
    assert found["kind"] == "short" and found["message"].startswith("note: the load cannot be judged")


def test_a_burst_far_faster_than_the_engine_is_heavy_judged_by_the_rate_its_backlog_drains_at():
    # all N requests within (N - 1) / (50 C) = 0.15 s, under 3 service times (OUT steps = 0.2 s):
    # too short to judge while they arrive, but the backlog then keeps every slot busy for about
    # N / C = 7.5 s, finishing SLOTS requests every OUT steps: C exactly, at 50 x the offered rate
    rate = 50 * CAPACITY
    stats = stats_at(rate, rate_scale=4.0)
    assert stats["span_s"] < load_check.STEADY_SPANS * stats["service_s"]
    assert stats["drain_s"] >= load_check.STEADY_SPANS * stats["service_s"]
    assert stats["drain_queued_share"] > 0.9
    found = load_check.check([stats], ["fcfs"])
    assert found["kind"] == "heavy"
    assert found["capacity_req_s"] == pytest.approx(CAPACITY, rel=0.05)
    assert found["load"] == pytest.approx(50, rel=0.05)
    assert found["suggested_rate_scale"] == pytest.approx(4.0 * load_check.TARGET_LOAD / 50, rel=0.05)
    assert found["message"].startswith("warning: load too heavy")
