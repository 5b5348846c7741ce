"""`weighted_fair`: virtual token counters, admission order, the backlog rule, the victim, its
options, and the demonstrations (weights 1:2 in every window; a 10x tenant does not hurt a small
one's p99 TTFT, where FCFS does)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from metroline.cli import build_parser, resolve_options
from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.manager import PluginManager
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import SeqState, Sequence
from metroline.core.results.metrics import fairness
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.weighted_fair import WeightedFair
from metroline.testing import check_plugin

STEP = 0.01


def seq(rid: str, tenant: str, arrival: float, prompt: int = 10) -> Sequence:
    return Sequence(rid, list(range(1, prompt + 1)), SamplingParams(max_new_tokens=8), arrival,
                    tenant=tenant, arrival_no=int(arrival * 100))


def admit_all(policy: WeightedFair, hits: dict[str, int] | None = None, limit: int = 100) -> list[str]:
    """Play the scheduler: pull candidates and admit each (prefix hit from `hits`), then report the
    admissions to `on_admitted`; returns the admitted ids in order."""
    answer = policy.admission()
    assert isinstance(answer, Candidates) and answer.head_of_line
    admitted = []
    for s in answer:
        s.num_computed_tokens = (hits or {}).get(s.request_id, 0)
        s.state = SeqState.RUNNING
        admitted.append(s)
        if len(admitted) == limit:
            break
    policy.on_admitted(seqs=admitted)
    return [s.request_id for s in admitted]


def test_admission_interleaves_tenants_by_weighted_counter():
    policy = WeightedFair(weights={"B": 2}, w_in=1, w_out=2)
    seqs = [seq("a1", "A", 0), seq("b1", "B", 1), seq("a2", "A", 2), seq("b2", "B", 3),
            seq("a3", "A", 4), seq("b3", "B", 5)]
    policy.on_arrival(seqs=seqs)
    # 0/0 tie -> older head a1 (A=10); B=0 -> b1 (B=5); B=5 -> b2 (B=10); 10/10 tie -> a2 (older
    # than b3; A=20); B=10 -> b3 (B=15); only A is left -> a3 (A=30)
    assert admit_all(policy) == ["a1", "b1", "b2", "a2", "b3", "a3"]
    assert policy.counters == {"A": 30.0, "B": 15.0}


def test_counters_charge_computed_prompt_tokens_and_weighted_outputs():
    policy = WeightedFair(weights={"B": 4}, w_in=1, w_out=2)
    a, b = seq("a", "A", 0, prompt=10), seq("b", "B", 1, prompt=12)
    policy.on_arrival(seqs=[a, b])
    assert admit_all(policy, hits={"a": 4}) == ["a", "b"]  # a: 6 computed tokens; b: 12 / 4 = 3
    assert policy.counters == {"A": 6.0, "B": 3.0}
    policy.on_tokens(seqs=[a, b, b])
    assert policy.counters == {"A": 8.0, "B": 4.0}  # w_out 2 per token, B's divided by 4
    # preempted and readmitted: the recomputation is not charged again
    a.state, a.num_preemptions = SeqState.WAITING, 1
    policy.on_preempted(seqs=[a])
    assert admit_all(policy) == ["a"]
    assert policy.counters == {"A": 8.0, "B": 4.0}
    assert policy.service_weights == {"w_in": 1.0, "w_out": 2.0, "weights": {"B": 4.0}}


def test_a_tenant_that_becomes_backlogged_is_lifted_to_the_lowest_backlogged_counter():
    policy = WeightedFair(w_in=1, w_out=1)
    a1, a2, b1, b2 = seq("a1", "A", 0), seq("a2", "A", 1), seq("b1", "B", 2), seq("b2", "B", 3)
    policy.on_arrival(seqs=[a1, a2, b1, b2])
    assert admit_all(policy, limit=3) == ["a1", "b1", "a2"]
    assert policy.counters == {"A": 20.0, "B": 10.0}
    # C has been idle (counter 0); it is lifted to B's 10, the lowest backlogged counter (not to
    # A's 20: A has nothing waiting), so its idle time banks no credit
    c1 = seq("c1", "C", 4)
    policy.on_arrival(seqs=[c1])
    assert policy.counters["C"] == 10.0
    # C at 10 ties B at 10; b2 is the older head
    assert admit_all(policy) == ["b2", "c1"]
    # nobody is backlogged now: a returning tenant is lifted to the counter of the tenant whose
    # queue emptied last (C: 20), but a counter above it is kept
    policy.counters["A"] = 25.0
    d1, a3 = seq("d1", "D", 5), seq("a3", "A", 6)
    policy.on_arrival(seqs=[d1])
    assert policy.counters["D"] == 20.0
    policy.on_arrival(seqs=[a3])
    assert policy.counters["A"] == 25.0


@pytest.mark.parametrize("counters", [(10.0, 30.0), (30.0, 10.0)])
def test_a_returning_tenant_is_lifted_to_the_minimum_of_several_backlogged_counters(counters):
    """Two tenants backlogged at 10 and 30 (either first in the policy's order): an idle tenant
    that gets a request is lifted to 10, the lowest backlogged counter. Lifting it to 30 would
    charge it for service the tenant at 10 has not had either; it then takes the next pick's
    tie with the older head."""
    policy = WeightedFair(w_in=1, w_out=1)
    policy.on_arrival(seqs=[seq("a1", "A", 0), seq("b1", "B", 1)])
    policy.counters["A"], policy.counters["B"] = counters
    policy.on_arrival(seqs=[seq("c1", "C", 2)])
    assert policy.counters["C"] == 10.0
    low = "a1" if counters[0] < counters[1] else "b1"
    assert admit_all(policy, limit=2) == [low, "c1"]  # 10 vs 10: the older head, then C at 10 < 20


def test_a_candidate_filtered_out_by_a_wrapper_takes_its_tenant_out_of_the_step():
    policy = WeightedFair(w_in=1, w_out=1)
    seqs = [seq("a1", "A", 0), seq("a2", "A", 1), seq("b1", "B", 2), seq("b2", "B", 3)]
    policy.on_arrival(seqs=seqs)
    answer = policy.admission().filter(lambda s: s.tenant != "A")
    got = []
    for s in answer:
        s.state = SeqState.RUNNING
        got.append(s.request_id)
    assert got == ["b1", "b2"]
    assert [s.state for s in seqs[:2]] == [SeqState.WAITING, SeqState.WAITING]


def test_victim_is_the_latest_admitted_of_the_highest_counter_tenant():
    policy = WeightedFair()
    policy.counters.update({"A": 30.0, "B": 15.0, "C": 40.0})
    running = []
    for i, tenant in enumerate(["A", "C", "B", "C", "A", "B"]):
        s = seq(f"r{i}", tenant, i)
        s.state, s.admitted_seq_no = SeqState.RUNNING, i + 1
        running.append(s)
    ctx = SimpleNamespace(running=running)
    assert policy.select_victim(ctx=ctx, requester=running[0]).request_id == "r3"
    policy.counters["A"] = 50.0
    assert policy.select_victim(ctx=ctx, requester=running[0]).request_id == "r4"
    waiting = seq("w", "B", 9)
    assert policy.select_victim(ctx=ctx, requester=waiting) is None  # never preempts for a waiting one
    # B is backlogged (a request waits), A and C are not: B's latest admitted goes first although
    # A and C have higher counters
    policy.on_arrival(seqs=[waiting])
    assert policy.select_victim(ctx=ctx, requester=running[0]).request_id == "r5"


def test_with_preempt_a_waiting_request_preempts_a_tenant_served_more():
    policy = WeightedFair(preempt=True)
    policy.counters.update({"A": 30.0, "B": 15.0})
    running = []
    for i, tenant in enumerate(["A", "B", "A", "B"]):
        s = seq(f"r{i}", tenant, i)
        s.state, s.admitted_seq_no = SeqState.RUNNING, i + 1
        running.append(s)
    ctx = SimpleNamespace(running=running)
    assert policy.select_victim(ctx=ctx, requester=seq("b", "B", 9)).request_id == "r2"
    assert policy.select_victim(ctx=ctx, requester=seq("a", "A", 9)) is None  # A is the most served
    policy.on_arrival(seqs=[seq("a", "A", 8)])  # A backlogged too: no difference for a waiting requester
    assert policy.select_victim(ctx=ctx, requester=seq("b", "B", 9)).request_id == "r2"
    policy.counters["B"] = 30.0
    assert policy.select_victim(ctx=ctx, requester=seq("b", "B", 9)) is None  # equal: no preemption
    assert policy.select_victim(ctx=SimpleNamespace(running=[]), requester=seq("c", "C", 9)) is None


@pytest.mark.parametrize("options, message", [
    ({"weights": {"A": 0}}, r"plugin 'weighted_fair': option 'weights.A': Input should be greater than 0 \(got 0\)"),
    ({"weights": {"A": "two"}}, r"option 'weights.A': Input should be a valid number \(got 'two'\)"),
    ({"weights": [1, 2]}, r"option 'weights': Input should be a valid dictionary"),
    ({"w_in": -1}, r"option 'w_in': Input should be greater than or equal to 0 \(got -1\)"),
    ({"w_in": -0.5}, r"option 'w_in': Input should be greater than or equal to 0 \(got -0.5\)"),
    ({"w_in": float("nan")}, r"option 'w_in': Input should be a finite number \(got nan\)"),
    ({"w_out": float("inf")}, r"option 'w_out': Input should be a finite number \(got inf\)"),
    ({"w_in": 0, "w_out": 0}, r"option 'w_out': w_in and w_out are both 0"),
    ({"preempt": "yes"}, r"option 'preempt': Input should be a valid boolean \(got 'yes'\)"),
    ({"quantum": 3}, r"option 'quantum': unknown option \(valid options: weights, w_in, w_out, preempt\)"),
])
def test_bad_options_are_named(options, message):
    config = EngineConfig(policy="weighted_fair", plugin_options={"weighted_fair": options})
    with pytest.raises(PluginLoadError, match=message):
        PluginManager(config)


@pytest.mark.parametrize(("w_in", "w_out", "counters"), [(1.0, 0.0, {"A": 10.0}), (0.0, 1.0, {"A": 3.0})])
def test_one_weight_of_zero_is_allowed_and_counts_only_the_other_service(w_in, w_out, counters):
    """Only both weights 0 is refused: `w_out = 0` counts prompt tokens alone (10 here), `w_in = 0`
    the generated ones alone (3)."""
    policy = WeightedFair(w_in=w_in, w_out=w_out)
    a = seq("a", "A", 0)
    policy.on_arrival(seqs=[a])
    assert admit_all(policy) == ["a"]
    policy.on_tokens(seqs=[a, a, a])
    assert policy.counters == counters


def test_options_from_the_config_file(tmp_path):
    path = tmp_path / "wf.toml"
    path.write_text('policy = "weighted_fair"\n\n[plugin_options.weighted_fair]\n'
                    'weights = { gold = 3, silver = 1.5 }\nw_in = 0.5\nw_out = 4\npreempt = true\n')
    config, _ = resolve_options(build_parser().parse_args(["run", "--config", str(path)]))
    policy = PluginManager(config).get("weighted_fair")
    assert (policy.weights, policy.w_in, policy.w_out) == ({"gold": 3.0, "silver": 1.5}, 0.5, 4.0)
    assert policy.preempt is True
    assert policy.weight("bronze") == 1.0


@pytest.mark.parametrize("options", [{"weights": {"alpha": 2}}, {"weights": {"beta": 3}, "preempt": True}])
def test_conformance(options):
    report = check_plugin("weighted_fair", options=options)
    assert len(report.runs) == 6 and sum(r["preemptions"] for r in report.runs) > 0


# ---------------------------------------------------------------------------------------------
# demonstrations (simulation, steps cost model)

LENGTHS = dict(prompt_len={"dist": "uniform", "low": 16, "high": 112},
               output_len={"dist": "uniform", "low": 8, "high": 56})  # mean output 32 tokens


def run(items, policy: str, max_num_seqs: int, options: dict | None = None):
    config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, num_blocks=8192,
                          policy=policy, plugin_options={policy: options or {}})
    return run_workload(Workload("w", items), config, SimulatedExecutor(make_cost_model("steps", step_time=STEP)))


@pytest.mark.parametrize("seed", [0, 1])
def test_weights_one_to_two_hold_in_every_window_while_both_are_backlogged(seed):
    """2400 requests, half per tenant, all at t=0 (far above capacity); 32 slots; weights 1:2;
    1 s windows. In every window after the first that ends before a tenant's queue runs dry, the
    weighted service ratio is within 10% of 1:2."""
    spec = SyntheticSpec(num_requests=2400, rate=None, tenants={"a": 1, "b": 1}, seed=seed, **LENGTHS)
    options = {"weights": {"a": 1, "b": 2}, "w_in": 1, "w_out": 2}
    _, engine = run(generate(spec, namespace="wf-ratio"), "weighted_fair", 32, options)
    recs = engine.metrics.requests
    dry = min(max(r.first_scheduled_s for r in recs if r.tenant == t) for t in "ab")
    f = fairness(recs, window_s=1.0, w_in=1, w_out=2, weights={"a": 1, "b": 2})
    backlogged = [w for w in f["windows"][1:] if w["end_s"] <= dry]
    assert len(backlogged) >= 15
    ratios = [w["service"]["b"] / w["service"]["a"] for w in backlogged]
    assert all(1.8 <= r <= 2.2 for r in ratios), ratios
    assert all(w["jain"] > 0.999 for w in backlogged)


def ttft_p99(doc, tenant: str) -> float:
    return doc["tenants"][tenant]["ttft_s"]["p99"]


@pytest.mark.parametrize("slots, options", [(256, {}), (32, {"preempt": True})])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_tenant_sending_ten_times_the_load_does_not_hurt_the_other(seed, slots, options):
    """Mean output 32 tokens: capacity = slots / (32 x 0.01 s) req/s. `big` sends 1.0x capacity and
    `small` 0.1x for 3 s (1.1x together). `small`'s p99 TTFT stays under 2x what it gets alone
    with weighted_fair -- with 256 slots as VTC does it (a slot frees every step), with 32 slots
    when it may preempt the over-served tenant (`preempt`); under FCFS it grows with the backlog
    (> 5x)."""
    capacity = slots / (32 * STEP)
    small = generate(SyntheticSpec(num_requests=round(0.3 * capacity), rate=0.1 * capacity, tenants={"small": 1},
                                   seed=seed, **LENGTHS), namespace="wf-small")
    big = generate(SyntheticSpec(num_requests=round(3 * capacity), rate=capacity, tenants={"big": 1},
                                 seed=seed, **LENGTHS), namespace="wf-big")
    alone = ttft_p99(run(small, "weighted_fair", slots, options)[0], "small")
    shared = ttft_p99(run(small + big, "weighted_fair", slots, options)[0], "small")
    fcfs = ttft_p99(run(small + big, "fcfs", slots)[0], "small")
    assert alone <= 2 * STEP + 1e-9
    assert shared < 2 * alone
    assert fcfs > 5 * alone
