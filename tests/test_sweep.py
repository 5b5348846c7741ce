"""Load sweeps: SLO attainment, goodput and the capacity at SLO, checked against a workload whose
capacity follows from its shape.

Under the `steps` cost model every step takes `STEP` seconds. With fixed lengths (a prompt that
fits one step's budget, `OUT` output tokens) a request holds one of the `SLOTS` batch slots for
exactly `OUT` steps (the prefill step gives its first token, `OUT - 1` decode steps the rest), so
the engine serves at most C = SLOTS / (OUT * STEP) requests per second. Arrivals are near-regular
(gamma gaps with CV 5%): below C nobody waits for a slot and TTFT is about two steps (the wait
for the next step, the prefill step). Above C every slot is busy: slot j is taken by requests
j, j + SLOTS, j + 2 SLOTS, ..., each OUT steps after the one before, while they arrive SLOTS / r
apart, so the m-th request of a slot waits m SLOTS (1/C - 1/r) and, with a TTFT bound of B, the
requests within it are SLOTS (floor((B - 2 STEP) / (SLOTS (1/C - 1/r))) + 1) of the N.
"""

from __future__ import annotations

import math

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.slo import evaluate, meets, parse_slo
from metroline.core.experiments.sweep import Sweep, at_rate, native_rate
from metroline.core.results.metrics import RequestRecord
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.registry import make_executor

STEP, SLOTS, OUT, N = 0.01, 8, 20, 300
CAPACITY = SLOTS / (OUT * STEP)  # 40 req/s
TTFT_BOUND = 0.06


def workload(rate: float = CAPACITY / 2) -> Workload:
    spec = SyntheticSpec(num_requests=N, rate=rate, arrival="gamma", burstiness=400.0, prompt_len=16, output_len=OUT)
    return Workload("regular", generate(spec), "near-regular arrivals, fixed lengths", {"source": "test"})


def sim():
    return make_executor("sim", cost_model="steps", cost_params={"step_time": STEP})


def config(policy: str = "fcfs") -> EngineConfig:
    return EngineConfig(policy=policy, max_num_seqs=SLOTS, num_blocks=512)


SLACK = TTFT_BOUND - 2 * STEP


def attainment_above_capacity(rate: float) -> float:
    """The predicted share of requests within the TTFT bound at `rate` > C (module docstring)."""
    return SLOTS * (math.floor(SLACK / (SLOTS * (1 / CAPACITY - 1 / rate))) + 1) / N


def crossing_rate(target: float) -> float:
    """The highest rate at which the predicted share within the TTFT bound is still `target`:
    each slot must serve m = ceil(target N / SLOTS) - 1 queued requests within the slack."""
    m = math.ceil(target * N / SLOTS) - 1
    return 1 / (1 / CAPACITY - SLACK / (SLOTS * m))


def test_capacity_at_slo_by_bisection_is_the_derived_capacity():
    sweep = Sweep(workload(), ["fcfs", "srpt"], [config("fcfs"), config("srpt")], sim, {"ttft": TTFT_BOUND}, jobs=1)
    capacity = sweep.bisect(tolerance=0.02)
    predicted = crossing_rate(0.9)
    assert CAPACITY < predicted < 1.02 * CAPACITY  # the bound lets the crossing sit just above C
    for label in ("fcfs", "srpt"):  # same lengths: the order of service cannot change the capacity
        found = capacity[label]
        lo, hi = found["bracket"]
        assert lo < hi <= lo * 1.02 + 1e-9
        assert found["rate_req_s"] == lo and found["attainment"] >= 0.9
        assert lo <= predicted * 1.005 and hi >= predicted * 0.995  # (TTFT is two steps within a step)
        assert sweep.docs[label, hi]["slo"]["attainment"] < 0.9
    doc = sweep.document(capacity, "auto", 0.02)
    rates = [p["offered"]["rate_req_s"] for p in doc["points"] if p["policy"] == "fcfs"]
    assert rates == sorted(rates) and len(rates) >= 5  # the bisection's steps, in order


def test_goodput_and_attainment_over_explicit_rates():
    sweep = Sweep(workload(), ["fcfs"], [config()], sim, {"ttft": TTFT_BOUND, "tpot": 1.5 * STEP}, jobs=1)
    rates = [0.5 * CAPACITY, 0.9 * CAPACITY, 1.5 * CAPACITY]
    capacity = sweep.over_rates(rates)
    low, mid, high = (sweep.docs["fcfs", r] for r in rates)
    for doc in (low, mid):  # below capacity every request is within both bounds
        assert doc["slo"]["attainment"] == 1.0
        # goodput: as the request throughput, requests over the run's duration, counting those
        # within SLO: here all of them
        assert doc["slo"]["goodput_req_s"] == pytest.approx(doc["summary"]["request_throughput_req_s"])
        assert doc["slo"]["goodput_req_s"] == pytest.approx(N / doc["summary"]["duration_s"])
    # at 1.5 C the queue grows by 0.5 C a second: the share within the TTFT bound is the predicted one
    assert high["slo"]["attainment"] == pytest.approx(attainment_above_capacity(rates[2]))
    # goodput counts the requests within SLO over the time it took to serve them all (C a second)
    assert high["slo"]["goodput_req_s"] == pytest.approx(high["slo"]["met"] / high["summary"]["duration_s"])
    assert high["summary"]["request_throughput_req_s"] == pytest.approx(CAPACITY, rel=0.05)
    assert capacity["fcfs"] == {"rate_req_s": rates[1], "bracket": [rates[1], rates[2]], "attainment": 1.0}
    assert high["offered"]["rate_scale"] == pytest.approx(rates[2] / native_rate(workload()))


def test_a_workload_at_a_rate_keeps_its_requests_and_only_moves_arrivals():
    base = workload()
    faster = at_rate(base, 3 * native_rate(base))
    assert native_rate(faster) == pytest.approx(3 * native_rate(base))
    assert [(i.segments, i.output_len) for i in faster.items] == [(i.segments, i.output_len) for i in base.items]


def test_a_workload_arriving_all_at_once_has_no_rate():
    spec = SyntheticSpec(num_requests=5, prompt_len=4, output_len=4)
    with pytest.raises(ValueError, match="all its requests arrive at once"):
        native_rate(Workload("burst", generate(spec)))


def record(**kw) -> RequestRecord:
    base = dict(id="0", tenant="t", priority=0, arrival_s=0.0, first_scheduled_s=0.0, prefill_done_s=0.1,
                first_token_s=0.1, finish_s=1.1, prompt_tokens=4, cached_prompt_tokens=0, output_tokens=11,
                preemptions=0, recomputed_tokens=0, finish_reason="length", token_times=(), error=None)
    return RequestRecord(**{**base, **kw})


def test_a_request_meets_the_slos_when_it_completed_within_every_bound():
    r = record()  # TTFT 0.1, TPOT (1.1 - 0.1) / 10 = 0.1, E2E 1.1
    assert meets(r, {"ttft": 0.1, "tpot": 0.1, "e2e": 1.1})
    assert not meets(r, {"ttft": 0.09})
    assert not meets(r, {"tpot": 0.099})
    assert not meets(record(finish_reason="rejected", first_token_s=None, finish_s=None), {"e2e": 10})
    assert meets(record(output_tokens=1, finish_s=0.1), {"tpot": 0.001})  # one token: no TPOT to bound
    figures = evaluate([r, record(first_token_s=0.5)], {"ttft": 0.2}, duration_s=4.0)
    assert (figures["met"], figures["attainment"], figures["goodput_req_s"]) == (1, 0.5, 0.25)


@pytest.mark.parametrize("text, problem", [
    ("ttft", "expected METRIC=SECONDS"), ("itl=1", "expected METRIC=SECONDS"), ("ttft=x", "not a number"),
    ("ttft=0", "> 0"), ("ttft=1,ttft=2", "given twice"), ("", "at least one bound"),
])
def test_bad_slos_are_refused_naming_the_flag(text, problem):
    with pytest.raises(ValueError, match=f"--slo: .*{problem}") as err:
        parse_slo(text)
    assert problem in str(err.value)


def test_slos_parse_to_seconds():
    assert parse_slo("ttft=0.5, tpot=0.05,E2E=30") == {"ttft": 0.5, "tpot": 0.05, "e2e": 30.0}
    assert math.isfinite(crossing_rate(0.9))
