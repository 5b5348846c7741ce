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


def test_a_split_too_short_for_five_independent_windows_gets_no_verdict_and_says_why():
    """Arms 10 s long whose requests live 1 s: 2 windows of 4 lifetimes. Against the baseline arm's
    requests (a split) no verdict at all, however different the arms look, with the reason;
    against a twin (the same requests, paired) 5 windows, and the 50% slower canary is worse."""
    import numpy as np

    from metroline.core.results.canary import ArmSamples, compare_arms, format_canary

    rng = np.random.default_rng(7)
    arrival = np.sort(rng.uniform(0, 10, 400))
    base = rng.uniform(0.05, 0.15, 400)

    def arm(scale: float) -> ArmSamples:
        return ArmSamples((a, t * scale, 0.01 * scale, 1.0) for a, t in zip(arrival, base))

    split = compare_arms(arm(1.0), arm(1.5))
    assert split["windows"] == 2 and split["verdict"] is None
    assert all(m["verdict"] is None for m in split["metrics"].values())
    assert split["metrics"]["ttft_mean"]["canary"] > split["metrics"]["ttft_mean"]["baseline"]
    assert "windows of at least 4 x the p90 end-to-end latency (1.00 s)" in split["window_reason"]
    assert "too short to compare (no verdict)" in split["window_reason"]
    assert "too short to compare" in format_canary("c", split)
    twin = compare_arms(arm(1.0), arm(1.5), split=False)
    assert twin["windows"] == 5 and twin["verdict"] == "worse"
