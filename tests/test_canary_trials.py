"""Can a canary's verdict be trusted? (issue 18: "a canary with a planted slower arm is called
worse; an A/A canary is not, over repeated trials, as the offline A/A test", tests/test_ab_trials.py)

Each trial is a simulated cluster of one pool of two replicas, one per arm, half the traffic each
(the exact interleave; the A/A trials compare the arms' own requests, `twin = false`, the planted
ones the canary against its twin), on its own draw of a small synthetic workload (600 requests, 16 s; 1,000, 28 s, for the split) under
the linear cost model at about 3/4 of capacity: queueing, so the arms' latencies differ from
request to request and window to window. The comparison is `results/canary.py`'s, the code
`metroline canary-report` and a serving front use.

- 30 A/A trials (both arms the same engine): the canary's verdict is `no difference` in at least
  27 (90%, the offline test's bar).
- 30 planted trials (the canary's every step 30% slower): `worse` in at least 27.
- Past capacity (the split's accumulating model), on queues built without the engine: 100 A/A
  draws called different in at most 5% overall and per metric; halved slots called worse in all.
  (The engine's figures past capacity: bench/canary_split_aa.py, docs/guide/replicas-and-routing.md.)
"""

from __future__ import annotations

import pytest
from test_ab_trials import SlowedCostModel  # every step `factor` times slower: the planted arm

from metroline.core.cluster.simulation import run_cluster
from metroline.core.cluster.spec import CANARY, ClusterSpec
from metroline.core.config import EngineConfig
from metroline.core.results.stats import NO_DIFFERENCE, WORSE
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

TRIALS = 30
SLOWDOWN = 1.30


SPLIT_REQUESTS = 1000
"""The split comparison's trials: 28 s of arrivals, at least 5 windows of 4 request lifetimes (with
fewer, the split gives no verdict); the twin's need no windows and take 600 (16 s)."""


def draw(seed: int, num_requests: int = 600) -> Workload:
    spec = SyntheticSpec(
        num_requests=num_requests, rate=36.0,
        prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.8, "max": 2048},
        output_len={"dist": "lognormal", "mean": 32, "sigma": 0.8, "max": 256},
        seed=seed,
    )
    return Workload("trial", generate(spec, namespace="canary-trials"))


def canary(seed: int, slowdown: float, twin: bool = True) -> dict:
    """The canary comparison of one trial: the canary arm `slowdown` times slower per step; against
    its twin (the baseline engine on the canary's own requests), or with `twin=False` against the
    baseline arm's requests (the split comparison, what a serving front computes)."""
    spec = ClusterSpec.model_validate({"pools": {"p": {"replicas": 2, "canary": {
        "replicas": 1, "percent": 50.0, "seed": seed * 37, "twin": twin}}}})

    def executor(plan):
        cost = make_cost_model("linear")
        return SimulatedExecutor(SlowedCostModel(cost, slowdown) if plan.arm == CANARY and slowdown != 1 else cost)

    n = 600 if twin else SPLIT_REQUESTS
    doc, _ = run_cluster(draw(seed, n), EngineConfig(max_num_seqs=16, num_blocks=1024), None, spec=spec,
                         executor_of=executor)
    comparison = doc["canary"]["p"]["comparison"]
    assert comparison["pairing"] == ("twin" if twin else "split")
    assert comparison["requests"] == {"baseline": n // 2, "canary": n // 2}
    return comparison


@pytest.mark.slow
def test_an_a_a_canary_is_not_called_different_in_at_least_27_of_30_trials():
    # the split comparison (against the baseline arm's requests; tests/test_canary_twins.py for the twin's)
    results = [canary(seed, 1.0, twin=False) for seed in range(TRIALS)]
    assert all(c["windows"] >= 5 for c in results)  # long enough for a verdict, which each one gives
    same = sum(c["verdict"] == NO_DIFFERENCE for c in results)
    print(f"A/A canary: no difference in {same} of {TRIALS} trials")
    assert same >= 27
    # the arms do differ, trial by trial: the verdicts are not trivially equal
    assert all(c["metrics"]["ttft_mean"]["difference"]["estimate"] != 0 for c in results)


@pytest.mark.slow
def test_a_planted_thirty_percent_slower_canary_is_called_worse_in_at_least_27_of_30_trials():
    results = [canary(seed, SLOWDOWN) for seed in range(TRIALS)]
    worse = sum(c["verdict"] == WORSE for c in results)
    print(f"slower canary: worse in {worse} of {TRIALS} trials")
    assert worse >= 27
    # every step is 30% slower, so is the canary's time per output token
    assert all(c["metrics"]["tpot_mean"]["canary"] > 1.2 * c["metrics"]["tpot_mean"]["baseline"] for c in results)


def test_an_arm_shifted_by_a_constant_is_worse_by_exactly_that_constant():
    import random

    from metroline.core.results.canary import ArmSamples, compare_arms

    rng = random.Random(1)
    rows = [(i * 0.1, rng.uniform(0.01, 0.5), rng.uniform(0.005, 0.05), rng.uniform(1, 3)) for i in range(400)]
    shifted = [(a, t + 0.05, p, e + 0.05) for a, t, p, e in rows]
    c = compare_arms(ArmSamples(rows), ArmSamples(shifted), split=False)  # paired: the same arrivals
    for key in ("ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99"):
        d = c["metrics"][key]["difference"]
        assert d["estimate"] == pytest.approx(0.05) and d["low"] == pytest.approx(0.05), key  # every resample: +0.05
        assert c["metrics"][key]["verdict"] == WORSE
    for key in ("tpot_mean", "tpot_p50", "tpot_p99"):
        assert c["metrics"][key]["difference"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
        assert c["metrics"][key]["verdict"] == NO_DIFFERENCE
    assert c["verdict"] == WORSE and c["requests"] == {"baseline": 400, "canary": 400}


def test_a_canary_that_trades_a_worse_ttft_for_a_better_tpot_is_never_called_better():
    import random

    from metroline.core.results.canary import ArmSamples, compare_arms

    traded = 0
    for seed in range(30):
        rng = random.Random(seed)
        rows = [(i * 0.1, rng.uniform(0.01, 0.5), rng.uniform(0.005, 0.05), rng.uniform(1, 3)) for i in range(400)]
        canary = [(a, t + rng.uniform(-0.04, 0.05), p * 0.5, e) for a, t, p, e in rows]  # TTFT +5 ms, TPOT halved
        c = compare_arms(ArmSamples(rows), ArmSamples(canary), split=False)  # paired: the same arrivals
        per_metric = {k: m["verdict"] for k, m in c["metrics"].items()}
        assert per_metric["tpot_mean"] == "better"
        if WORSE in per_metric.values():
            assert c["verdict"] in (WORSE, NO_DIFFERENCE), (seed, per_metric)
            traded += c["verdict"] == NO_DIFFERENCE
    assert traded >= 1  # the case arose: worse at 95% alone, better at the whole-canary level


def test_windows_are_several_request_lifetimes_long():
    import numpy as np

    from metroline.core.results.canary import window_count

    e2e = np.full(1000, 1.0)
    assert window_count(100.0, e2e, 1000) == 25  # 100 s in windows of 4 lifetimes of 1 s
    assert window_count(100.0, e2e, 200) == 10  # 20 requests a window on average
    assert window_count(10.0, e2e, 1000) == 2  # 10 s hold 2 windows of 4 s: too short (below)
    assert window_count(1000.0, e2e, 100_000) == 40  # never more than 40


def test_a_split_shorter_than_five_request_lifetimes_takes_the_difference_as_accumulating():
    """Arms 10 s long whose requests live about 1.1 s (1 s of it in service): 2 windows of 4
    lifetimes, too few independent windows, so the split uses the accumulating model over windows
    of one time in service (9 of them here); with fewer than 5 such windows (under 100 requests) no
    verdict at all, however different the arms look, with the reason. Against a twin (the same
    requests, paired) the window bootstrap over 5 windows."""
    import numpy as np

    from metroline.core.results.canary import ACCUMULATING, WINDOW_BOOTSTRAP, ArmSamples, compare_arms, format_canary

    rng = np.random.default_rng(7)

    def arms(n: int, behind: float = 0.0, scale: float = 1.0) -> tuple[ArmSamples, ArmSamples]:
        """The canary's TTFT `scale` times the baseline's plus `behind` x its arrival time (a
        queue growing on it alone)."""
        arrival = np.sort(rng.uniform(0, 10, n))
        base = rng.uniform(0.05, 0.15, n)
        return (ArmSamples((a, t, 0.01, t + 1.0) for a, t in zip(arrival, base)),
                ArmSamples((a, t * scale + behind * a, 0.01, t * scale + behind * a + 1.0) for a, t in zip(arrival, base)))

    split = compare_arms(*arms(400, behind=0.02))  # falls 0.2 s behind over the run
    assert split["interval_model"] == ACCUMULATING and split["windows"] == 9  # 9.9 s / 1 s: 9; 800 // 20: 40
    assert "windows of at least 4 x the p90 end-to-end latency" in split["window_reason"]
    assert "taken as accumulating: 9 windows of at least the p90 time in service (1.00 s)" in split["window_reason"]
    assert split["verdict"] == WORSE and split["metrics"]["ttft_mean"]["verdict"] == WORSE
    assert split["metrics"]["tpot_mean"]["verdict"] == NO_DIFFERENCE
    # a steady level (TTFT 1.5 times from the first window on) is the model's conservative side: the
    # first increment carries it all, and the increments' spread with it
    level = compare_arms(*arms(400, scale=1.5))
    assert level["metrics"]["ttft_mean"]["canary"] > 1.4 * level["metrics"]["ttft_mean"]["baseline"]
    assert level["verdict"] == NO_DIFFERENCE
    few = compare_arms(*arms(45, scale=1.5))  # 90 requests: 4 windows of 20
    assert few["interval_model"] == ACCUMULATING and few["windows"] == 4 and few["verdict"] is None
    assert all(m["verdict"] is None for m in few["metrics"].values())
    assert few["metrics"]["ttft_mean"]["canary"] > few["metrics"]["ttft_mean"]["baseline"]
    assert "4 windows of at least 20 requests on average: fewer than 5, too short to compare (no verdict)" in few["window_reason"]
    assert "too short to compare" in format_canary("c", few)
    twin = compare_arms(*arms(400, scale=1.5), split=False)
    assert twin["interval_model"] == WINDOW_BOOTSTRAP and twin["windows"] == 5 and twin["verdict"] == WORSE


def _queued(arrival, service, tokens, servers: int):
    """The requests of one arm served first come first served by `servers` slots (each request
    holds one for its whole service time, the first tenth of it prefill): what a continuous
    batcher with `max_num_seqs` = servers does to a queue, without the engine."""
    import numpy as np

    from metroline.core.results.canary import ArmSamples

    free = np.zeros(servers)
    rows = []
    for a, s, n in zip(arrival, service, tokens):
        slot = int(free.argmin())
        start = max(a, free[slot])
        free[slot] = start + s
        rows.append((a, start - a + 0.1 * s, 0.9 * s / (n - 1), start + s - a))
    return ArmSamples(rows)


def _queued_canary(seed: int, canary_servers: int) -> dict:
    """One split canary past capacity by construction: 400 requests at 17.6/s, every other one to
    each arm, each arm 8 slots (load 1.05: the queues grow and drift apart), the canary
    `canary_servers`."""
    import numpy as np

    from metroline.core.results.canary import compare_arms

    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / 17.6, 400))
    service = rng.lognormal(np.log(0.8), 0.6, 400)
    tokens = rng.integers(2, 200, 400)
    arm = (slice(0, None, 2), slice(1, None, 2))
    return compare_arms(_queued(arrival[arm[0]], service[arm[0]], tokens[arm[0]], 8),
                        _queued(arrival[arm[1]], service[arm[1]], tokens[arm[1]], canary_servers))


def test_past_capacity_an_a_a_split_holds_its_level_and_half_the_slots_is_called_worse():
    """The split comparison past capacity (where windows of 4 lifetimes never fit: the accumulating
    model), on queues built to be identical or not: 100 A/A draws (both arms 8 slots) are called
    different in at most 5% overall and for each metric; with the canary's slots halved (as
    `max_num_seqs` halved) every draw is called worse."""
    from metroline.core.results.canary import ACCUMULATING, CANARY_METRICS

    draws = 100
    same = [_queued_canary(seed, 8) for seed in range(draws)]
    assert {c["interval_model"] for c in same} == {ACCUMULATING} and min(c["windows"] for c in same) >= 5
    false = {key: sum(c["metrics"][key]["verdict"] != NO_DIFFERENCE for c in same) for key, _, _ in CANARY_METRICS}
    false["overall"] = sum(c["verdict"] != NO_DIFFERENCE for c in same)
    print(f"A/A past capacity, {draws} draws, false verdicts: {false}")
    assert max(false.values()) <= 0.05 * draws, false
    halved = [_queued_canary(seed, 4) for seed in range(draws)]
    worse = sum(c["verdict"] == WORSE for c in halved)
    print(f"half the slots: worse in {worse} of {draws}")
    assert worse == draws


def test_the_window_bootstrap_interval_uses_students_t_with_k_minus_one_degrees_of_freedom():
    """With the resamples fixed (one seed), the half-width of the interval is t(level, K - 1) x se,
    so the half-widths at two levels stand in the ratio of those t quantiles. For K = 5 windows, from
    a printed table of Student's t (4 degrees of freedom): t(0.975) = 2.7764, t(0.90) = 1.5332, a
    ratio of 1.8109 (with 6 degrees of freedom it would be 2.4469 / 1.4398 = 1.6995)."""
    import random

    from metroline.core.results.canary import ArmSamples, compare_arms

    rng = random.Random(3)
    rows = [(i * 0.1, rng.uniform(0.01, 0.5), rng.uniform(0.005, 0.05), rng.uniform(1, 3)) for i in range(400)]
    other = [(a, rng.uniform(0.01, 0.5), p, e) for a, _, p, e in rows]
    wide, narrow = (compare_arms(ArmSamples(rows), ArmSamples(other), split=False, windows=5, level=level)
                    for level in (0.95, 0.80))
    assert wide["windows"] == narrow["windows"] == 5
    d95, d80 = wide["metrics"]["ttft_mean"]["difference"], narrow["metrics"]["ttft_mean"]["difference"]
    assert d95["estimate"] == d80["estimate"]
    ratio = (d95["high"] - d95["estimate"]) / (d80["high"] - d80["estimate"])
    assert ratio == pytest.approx(2.7764 / 1.5332, rel=1e-3)


def test_the_window_bootstrap_gives_a_finite_interval_from_two_windows_on():
    """The fewest windows the comparison takes (2) still give a finite, non-empty interval (the
    bootstrap's spread scaled by K / (K - 1), defined from K = 2 on)."""
    import math
    import random

    from metroline.core.results.canary import ArmSamples, compare_arms

    rng = random.Random(4)
    rows = [(i * 0.1, rng.uniform(0.01, 0.5), rng.uniform(0.005, 0.05), rng.uniform(1, 3)) for i in range(200)]
    other = [(a, rng.uniform(0.01, 0.5), p, e) for a, _, p, e in rows]
    c = compare_arms(ArmSamples(rows), ArmSamples(other), split=False, windows=2)
    d = c["metrics"]["ttft_mean"]["difference"]
    assert c["windows"] == 2 and math.isfinite(d["low"]) and math.isfinite(d["high"]) and d["low"] < d["high"]
