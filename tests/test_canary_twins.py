"""A simulated canary is compared with its twin: the baseline engine replayed on exactly the
canary's requests (`metroline.core.cluster.twins`), not with the baseline arm's other requests
(issue 26: "the canary's verdict follows the request split, not the engine").

- identical engines: the twin's records are the canary's, request for request, so every
  difference is exactly 0, while the split comparison (the baseline arm's requests) is not;
- an A/A canary whose arms differ only in private randomness (random order of service, another
  `plugin_salt`): over DRAWS (30) draws the overall verdict is false at most as often as
  Binomial(DRAWS, 0.05)'s 99% quantile allows (bench/canary_aa.py measures it on a real trace).
"""

from __future__ import annotations

import math

from aa_plugins import RandomOrder  # admission in an order drawn from ctx.salt

from metroline.core.cluster.simulation import run_cluster
from metroline.core.cluster.spec import ClusterSpec
from metroline.core.config import EngineConfig
from metroline.core.results.stats import NO_DIFFERENCE
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

DRAWS = 30
NOMINAL = 0.05


def draw(seed: int, requests: int) -> Workload:
    """A small synthetic draw at about 3/4 of two 4-slot replicas' capacity: requests queue, so the
    order of service moves their latencies."""
    spec = SyntheticSpec(
        num_requests=requests, rate=36.0,
        prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.8, "max": 2048},
        output_len={"dist": "lognormal", "mean": 12, "sigma": 0.8, "max": 64},
        seed=seed,
    )
    return Workload("twins", generate(spec, namespace="canary-twins"))


def canary(seed: int, requests: int, *, random_order: bool = False, canary_config: dict | None = None) -> dict:
    """The canary section of one draw: a pool of 2 replicas, one per arm, half the traffic each;
    `random_order`: every replica (and twin) with a fresh `RandomOrder`, drawn from its salt."""
    spec = ClusterSpec.model_validate({"pools": {"p": {"replicas": 2, "canary": {
        "replicas": 1, "percent": 50.0, "seed": seed, "config": canary_config or {}}}}})
    config = EngineConfig(max_num_seqs=4, num_blocks=1024, plugin_salt=2 * seed + 1)
    doc, _ = run_cluster(draw(seed, requests), config, lambda: SimulatedExecutor(make_cost_model("linear")), spec=spec,
                         plugins=(lambda i: [RandomOrder()]) if random_order else None)
    return doc["canary"]["p"]


def upper_quantile(n: int, p: float, q: float = 0.99) -> int:
    """The smallest k with P(Binomial(n, p) <= k) >= q."""
    total = 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if total >= q:
            return k
    return n


def test_identical_engines_compare_exactly_equal_against_the_twin_but_not_the_split():
    section = canary(0, 120)
    twin, split = section["comparison"], section["split_comparison"]
    assert twin["pairing"] == "twin" and split["pairing"] == "split"
    assert twin["requests"] == {"baseline": 60, "canary": 60} == split["requests"]
    for key, metric in twin["metrics"].items():
        assert metric["difference"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}, key
        assert metric["verdict"] == NO_DIFFERENCE
    assert twin["verdict"] == NO_DIFFERENCE
    # the other half of the traffic met other requests: the split's arms differ
    assert split["metrics"]["ttft_mean"]["difference"]["estimate"] != 0.0


def test_the_twin_replays_the_canary_arm_with_the_baseline_engine():
    section = canary(1, 120, canary_config={"max_num_seqs": 1})
    twin = section["comparison"]
    assert section["changes"] == {"max_num_seqs": [4, 1]}
    assert twin["requests"] == {"baseline": 60, "canary": 60}
    # one sequence at a time on the same requests: every token waits for the others' turns
    assert twin["metrics"]["ttft_mean"]["canary"] > twin["metrics"]["ttft_mean"]["baseline"]
    assert twin["metrics"]["tpot_mean"]["canary"] < twin["metrics"]["tpot_mean"]["baseline"]  # alone in its batch
    # the twin's baseline figures are not the baseline arm's (other requests)
    assert twin["metrics"]["ttft_mean"]["baseline"] != section["split_comparison"]["metrics"]["ttft_mean"]["baseline"]


def test_upper_quantile_of_the_binomial():
    assert upper_quantile(40, 0.05) == 6  # P(X <= 5) = 0.986, P(X <= 6) = 0.995
    assert upper_quantile(30, 0.05) == 5
    assert upper_quantile(10, 0.5, 0.5) == 5


def test_an_a_a_canary_against_its_twin_holds_the_nominal_overall_rate():
    sections = [canary(seed, 40, random_order=True, canary_config={"plugin_salt": 2 * seed + 2})
                for seed in range(DRAWS)]
    false = sum(s["comparison"]["verdict"] != NO_DIFFERENCE for s in sections)
    print(f"A/A canary against its twin: {false} of {DRAWS} draws with a false overall verdict")
    assert false <= upper_quantile(DRAWS, NOMINAL)
    # the arms did differ (random order of service): the check is not of identical runs
    differing = sum(s["comparison"]["metrics"]["ttft_mean"]["difference"]["estimate"] != 0 for s in sections)
    assert differing >= DRAWS // 2
