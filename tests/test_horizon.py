"""`metroline.core.results.horizon` and the runner's measurement window: warm-up exclusion, a horizon that stops the
replay and counts unfinished requests (censored latencies: no survivor bias)."""

from __future__ import annotations

from bisect import bisect_left

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.results.horizon import UNFINISHED, MeasurementWindow, as_seen_at
from metroline.core.results.metrics import COMPLETED_REASONS, RequestRecord
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.registry import simulated

H = 3.0


def overloaded() -> Workload:
    """Arrivals at about twice what 4 slots serve (16 req/s): a queue that grows, so many requests are unfinished
    at the horizon."""
    spec = SyntheticSpec(num_requests=120, rate=30.0, prompt_len=64,
                         output_len={"dist": "uniform", "low": 8, "high": 40}, seed=4)
    return Workload("overloaded", generate(spec, namespace="horizon-test"))


def run(measure: MeasurementWindow | None):
    doc, engine = run_workload(overloaded(), EngineConfig(max_num_seqs=4, num_blocks=512), simulated("steps"),
                               measure=measure)
    return doc, engine.metrics.requests


@pytest.fixture(scope="module")
def full():
    return run(None)


@pytest.fixture(scope="module")
def horizon():
    return run(MeasurementWindow(horizon_s=H))


def test_no_window_leaves_the_document_as_it_was(full):
    doc, _ = full
    again, _ = run(MeasurementWindow())
    strip = lambda d: {k: v for k, v in d["summary"].items() if k != "wall_s"}  # noqa: E731
    assert strip(again) == strip(doc) and "measurement" not in again and "unfinished" not in doc["summary"]


def test_the_horizon_run_is_the_full_run_up_to_the_horizon(full, horizon):
    _, everything = full
    doc, records = horizon
    before = sorted(r for r in everything if r.finish_s is not None and r.finish_s <= H)
    assert sorted(r for r in records if r.finish_s is not None and r.finish_s <= H) == before
    arrived = [r for r in everything if r.arrival_s < H]
    summary = doc["summary"]
    assert summary["requests"] == len(arrived)
    assert summary["completed"] == len(before)
    assert summary["unfinished"] == len(arrived) - len(before) > 20
    assert summary["completed"] + summary["unfinished"] + summary["rejected"] == summary["requests"]
    assert doc["measurement"] == {"warmup_s": 0.0, "horizon_s": H}


def test_the_horizon_stops_the_replay(full, horizon):
    assert horizon[0]["summary"]["steps"] < full[0]["summary"]["steps"]
    assert all(r.arrival_s < H for r in horizon[1])


def test_unfinished_requests_enter_the_latencies_censored_at_the_horizon(full, horizon):
    """E2E over completed and unfinished requests, the unfinished at (horizon - arrival): a lower
    bound of the same requests' true mean (from the full run), and its maximum is the largest of
    those waits."""
    _, everything = full
    doc, _ = horizon
    arrived = [r for r in everything if r.arrival_s < H]
    done = [r.finish_s - r.arrival_s for r in arrived if r.finish_s <= H]
    censored = [H - r.arrival_s for r in arrived if r.finish_s > H]
    e2e = doc["summary"]["e2e_s"]
    assert e2e["mean"] == pytest.approx((sum(done) + sum(censored)) / (len(done) + len(censored)))
    true = [r.finish_s - r.arrival_s for r in arrived]
    assert e2e["mean"] < sum(true) / len(true)
    assert e2e["max"] == pytest.approx(max(done + censored))
    never_started = [r for r in arrived if r.first_scheduled_s > H]
    assert never_started  # some waited in the queue past the horizon
    assert doc["summary"]["queue_s"]["max"] >= max(H - r.arrival_s for r in never_started) - 1e-12


def test_throughput_counts_the_tokens_made_inside_the_window(full):
    _, everything = full
    window = MeasurementWindow(warmup_s=1.0, horizon_s=H)
    doc, _ = run(window)
    tokens = sum(bisect_left(r.token_times, H) - bisect_left(r.token_times, 1.0) for r in everything)
    summary = doc["summary"]
    assert summary["output_tokens"] == tokens
    assert summary["duration_s"] == pytest.approx(H - 1.0)
    assert summary["output_throughput_tok_s"] == pytest.approx(tokens / (H - 1.0))
    assert summary["requests"] == sum(1 for r in everything if 1.0 <= r.arrival_s < H)


def test_a_warmup_alone_leaves_out_the_first_arrivals(full):
    _, everything = full
    doc, _ = run(MeasurementWindow(warmup_s=1.0))
    assert doc["summary"]["requests"] == sum(1 for r in everything if r.arrival_s >= 1.0)
    assert doc["summary"]["unfinished"] == 0
    e2e = [r.finish_s - r.arrival_s for r in everything if r.arrival_s >= 1.0]
    assert doc["summary"]["e2e_s"]["mean"] == pytest.approx(sum(e2e) / len(e2e))


def test_tenant_summaries_follow_the_window(horizon):
    doc, _ = horizon
    assert sum(t["requests"] for t in doc["tenants"].values()) == doc["summary"]["requests"]
    assert sum(t["unfinished"] for t in doc["tenants"].values()) == doc["summary"]["unfinished"]


def test_a_record_as_seen_before_it_finished():
    r = RequestRecord("7", "a", 0, 1.0, 1.5, 2.0, 2.0, 4.0, 10, 0, 3, 0, 0, "length", (2.0, 3.0, 4.0), None)
    assert as_seen_at(r, 5.0) == r
    seen = as_seen_at(r, 3.5)
    assert seen.finish_reason == UNFINISHED and seen.finish_s is None
    assert seen.token_times == (2.0, 3.0) and seen.output_tokens == 2 and seen.first_token_s == 2.0
    early = as_seen_at(r, 1.2)
    assert early.first_scheduled_s is None and early.first_token_s is None and early.output_tokens == 0
    assert "length" in COMPLETED_REASONS


@pytest.mark.parametrize("kw", [{"warmup_s": -1.0}, {"horizon_s": 0.0}, {"warmup_s": 5.0, "horizon_s": 4.0},
                                {"horizon_s": float("inf")}])
def test_a_bad_window_is_refused(kw):
    with pytest.raises(ValueError):
        MeasurementWindow(**kw)
