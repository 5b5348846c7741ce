"""The `priority` policy: its admission order, its victims, preemption for urgent waiting requests,
its options, and the two demonstrations (urgent TTFT under overload; the aging bound)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from conftest import make_engine, request, run_to_end

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import SeqState, Sequence
from metroline.core.results.metrics import distribution
from metroline.core.workloads.build import Workload, WorkloadItem, build_workload
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.priority import Priority

STEP = 0.01


def admitted(engine) -> list[str]:
    return [sid for p in engine.executor.plans for sid in p.admitted]


def preempted(engine) -> list[tuple[int, str]]:
    return [(p.step, sid) for p in engine.executor.plans for sid, _ in p.preempted]


def priority_engine(**options):
    config = {k: options.pop(k) for k in list(options) if k not in ("aging_rate", "preempt_threshold")}
    return make_engine(policy="priority", plugin_options={"priority": options}, **config)


# --- admission order -------------------------------------------------------------------------------

# (id, priority, arrival_time), all waiting when the first step runs at t = 10
HAND_MADE = [("a", 2, 0.0), ("b", 0, 3.0), ("c", 1, 2.0), ("d", 1, 1.0), ("e", 0, 4.0)]


def run_hand_made(**options) -> list[str]:
    engine = priority_engine(max_num_seqs=1, preempt_threshold=None, **options)
    for rid, prio, t in HAND_MADE:
        engine.add_request(request(rid, 4, max_new=1, priority=prio, arrival_time=t))
    engine.executor.idle_until(10.0)
    run_to_end(engine)
    return admitted(engine)


def test_admits_by_priority_then_arrival():
    assert run_hand_made() == ["b", "e", "d", "c", "a"]


def test_aging_orders_by_priority_plus_rate_times_arrival():
    # keys priority + 0.5 * arrival: a 2.0, b 1.5, c 2.0, d 1.5, e 2.0; ties by arrival
    assert run_hand_made(aging_rate=0.5) == ["d", "b", "a", "c", "e"]


@pytest.mark.parametrize("start", [10.0, 20.0])
@pytest.mark.parametrize(("b_arrival", "expected"), [(3.5, ["b", "a"]), (4.5, ["a", "b"])])
def test_aging_makes_a_request_more_urgent_by_the_rate_per_second_waited(start, b_arrival, expected):
    # Effective priority = priority - 0.5 x seconds waited, computed by hand at the first step
    # (t = start), one slot: a (priority 2, arrived at 0) and b (priority 0, arrived at b_arrival).
    # At t = 10: a 2 - 0.5 x 10 = -3; b arrived at 3.5: 0 - 0.5 x 6.5 = -3.25 < -3, b first;
    # arrived at 4.5: 0 - 0.5 x 5.5 = -2.75 > -3, a first (b is first iff it waited more than
    # 2 / 0.5 = 4 s less than a). At t = 20 both have aged 5 more: -8 against -8.25 or -7.75, the
    # same order (aging never reorders two waiting requests).
    engine = priority_engine(max_num_seqs=1, preempt_threshold=None, aging_rate=0.5)
    engine.add_request(request("a", 4, max_new=1, priority=2, arrival_time=0.0))
    engine.add_request(request("b", 4, max_new=1, priority=0, arrival_time=b_arrival))
    engine.executor.idle_until(start)
    run_to_end(engine)
    assert admitted(engine) == expected


def test_head_of_line_a_blocked_urgent_request_stops_less_urgent_ones():
    # 8 blocks of 4 tokens; r0 holds 6 of them until it ends (step 8); big needs 4, small 1
    engine = priority_engine(num_blocks=8, preempt_threshold=None)
    engine.add_request(request("r0", 20, max_new=8, priority=1))
    engine.step()
    engine.add_request(request("big", 16, max_new=1, priority=0))
    engine.add_request(request("small", 3, max_new=1, priority=1))
    run_to_end(engine)
    plans = engine.executor.plans
    assert [(p.step, p.admitted) for p in plans if p.admitted] == [(1, ["r0"]), (9, ["big", "small"])]
    assert preempted(engine) == []


# --- victims -------------------------------------------------------------------------------------


def test_victim_for_a_running_request_is_the_worst_priority_latest_arrival_on_ties():
    # 6 blocks: x, y, z each fill 2 blocks by token 8; at token 9 x needs a third block
    engine = priority_engine(num_blocks=6, max_num_seqs=3, preempt_threshold=None)
    engine.add_request(request("x", 4, max_new=12, priority=1, arrival_time=0.0))
    engine.add_request(request("y", 4, max_new=12, priority=2, arrival_time=0.0))
    engine.add_request(request("z", 4, max_new=12, priority=2, arrival_time=0.0))
    run_to_end(engine)
    # step 6 computes position 8: x needs a third block -> z (priority 2, arrived after y);
    # step 10 (position 12): x needs a fourth -> y
    assert preempted(engine)[:2] == [(6, "z"), (10, "y")]


def test_victim_with_aging_is_the_worst_effective_priority():
    # y (priority 2, arrived at 0) has aged past z (priority 2, arrived at 0.5) and x (priority 1
    # at 3.0): keys with rate 1: x 4.0, y 2.0, z 2.5 -> the worst is x
    engine = priority_engine(num_blocks=6, max_num_seqs=3, preempt_threshold=None, aging_rate=1.0)
    engine.add_request(request("y", 4, max_new=12, priority=2, arrival_time=0.0))
    engine.add_request(request("z", 4, max_new=12, priority=2, arrival_time=0.5))
    engine.add_request(request("x", 4, max_new=12, priority=1, arrival_time=3.0))
    engine.executor.idle_until(3.0)
    run_to_end(engine)
    # at step 6 y, served first, needs a block: the victim is x (the requester's key does not matter)
    assert preempted(engine)[0] == (6, "x")


def running_seq(rid: str, priority: int, arrival: float, arrival_no: int, index: int = 0) -> Sequence:
    s = Sequence(rid, [1, 2, 3], SamplingParams(max_new_tokens=4), arrival, priority=priority,
                 arrival_no=arrival_no, index=index, seq_id=f"{rid}-{index}")
    s.state = SeqState.RUNNING
    return s


@pytest.mark.parametrize("reverse", [False, True])
def test_victim_ties_go_to_the_latest_arrival_then_the_later_arrival_number_then_the_last_sample(reverse):
    """Among running requests of equal effective priority the victim is the latest arrival
    (`Priority`'s docstring): the later `arrival_time` even when its `arrival_no` is the smaller
    (requests may be added out of time order), the later `arrival_no` at equal times, and among the
    samples of one request the highest `index`. The order they were admitted in does not matter."""
    cases = [
        # (expected victim, the others); all priority 3 but the urgent one
        (running_seq("late", 3, 2.0, 4), [running_seq("early", 3, 1.0, 5), running_seq("urgent", 1, 9.0, 9)]),
        (running_seq("second", 3, 1.0, 6), [running_seq("first", 3, 1.0, 5), running_seq("urgent", 1, 9.0, 9)]),
        (running_seq("n", 3, 1.0, 5, index=2), [running_seq("n", 3, 1.0, 5, index=0), running_seq("n", 3, 1.0, 5, index=1)]),
    ]
    for victim, others in cases:
        pol = Priority(preempt_threshold=None)
        running = [victim, *others]
        pol.on_admitted(ctx=SimpleNamespace(running=running), seqs=running[::-1] if reverse else running)
        assert pol.select_victim(requester=others[0]) is victim


def test_victim_with_aging_ties_on_the_key_go_to_the_latest_arrival():
    """With aging rate 0.5, priority 3 arriving at 0 and priority 2 arriving at 2 have the same key
    (3.0) and so the same effective priority at every instant: the later arrival is the victim,
    ahead of priority 1 arriving at 2 (key 2.0)."""
    old, new, urgent = running_seq("old", 3, 0.0, 1), running_seq("new", 2, 2.0, 2), running_seq("urgent", 1, 2.0, 3)
    for order in ([old, new, urgent], [urgent, new, old]):
        pol = Priority(aging_rate=0.5, preempt_threshold=None)
        pol.on_admitted(ctx=SimpleNamespace(running=order), seqs=order)
        assert pol.key(old) == pol.key(new) == 3.0
        assert pol.select_victim(requester=urgent) is new


def test_select_victim_unit():
    pol = Priority(aging_rate=0.0, preempt_threshold=1.0)
    engine = priority_engine(max_num_seqs=3)
    for rid, prio in (("p1", 1), ("p3a", 3), ("p3b", 3)):
        engine.add_request(request(rid, 4, max_new=50, priority=prio, arrival_time=0.0))
    engine.step()
    seqs = {rid: engine.sequences(rid)[0] for rid in ("p1", "p3a", "p3b")}
    pol.on_admitted(ctx=engine.scheduler.ctx, seqs=list(seqs.values()))
    assert pol.select_victim(requester=seqs["p1"]) is seqs["p3b"]  # worst, latest arrival on ties
    engine.add_request(request("w2", 4, priority=2, arrival_time=0.0))
    engine.add_request(request("w1", 4, priority=1, arrival_time=0.0))
    w2, w1 = engine.sequences("w2")[0], engine.sequences("w1")[0]
    assert pol.select_victim(requester=w2) is seqs["p3b"]  # 2 <= 3 - 1
    assert pol.select_victim(requester=w1) is seqs["p3b"]
    strict = Priority(preempt_threshold=1.5)
    strict.on_admitted(ctx=engine.scheduler.ctx, seqs=list(seqs.values()))
    assert strict.select_victim(requester=w2) is None  # 2 > 3 - 1.5
    assert strict.select_victim(requester=w1) is seqs["p3b"]
    off = Priority(preempt_threshold=None)
    off.on_admitted(ctx=engine.scheduler.ctx, seqs=list(seqs.values()))
    assert off.select_victim(requester=w1) is None
    assert off.select_victim(requester=seqs["p1"]) is seqs["p3b"]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, [(3, "b")]),  # 0 <= 2 - 1: the urgent request takes b's slot at once
        ({"preempt_threshold": 3.0}, []),  # not urgent enough: it waits for a slot
        ({"preempt_threshold": None}, []),
        # with aging 1/s, b (priority 2, arrived at 0) has key 2 and u (arrives at 0.02) 0.02:
        # 0.02 <= 2 - 1, preempted; a threshold of 2 needs 0.02 <= 0: no preemption
        ({"aging_rate": 1.0}, [(3, "b")]),
        ({"aging_rate": 1.0, "preempt_threshold": 2.0}, []),
    ],
)
def test_an_urgent_waiting_request_preempts_when_slots_are_the_limit(options, expected):
    engine = priority_engine(max_num_seqs=2, **options)
    engine.add_request(request("a", 4, max_new=20, priority=1, arrival_time=0.0))
    engine.add_request(request("b", 4, max_new=20, priority=2, arrival_time=0.0))
    engine.step()
    engine.step()
    engine.add_request(request("u", 4, max_new=2, priority=0))
    run_to_end(engine)
    assert preempted(engine) == expected
    u = engine.sequences("u")[0]
    if expected:
        assert admitted(engine)[:3] == ["a", "b", "u"] and u.first_scheduled_time == pytest.approx(2 * STEP)
    else:
        # u waits for the first slot to free (a and b end at step 20, at t = 0.2)
        assert admitted(engine)[:3] == ["a", "b", "u"] and u.first_scheduled_time == pytest.approx(20 * STEP)


def test_an_urgent_waiting_request_preempts_when_blocks_are_the_limit():
    # 8 blocks; lo1 and lo2 hold 3 each after 8 tokens; u needs 4 blocks for its 16-token prompt
    engine = priority_engine(num_blocks=8, max_num_seqs=4)
    engine.add_request(request("lo1", 8, max_new=20, priority=1, arrival_time=0.0))
    engine.add_request(request("lo2", 8, max_new=20, priority=2, arrival_time=0.0))
    for _ in range(2):
        engine.step()
    engine.add_request(request("u", 16, max_new=1, priority=0))
    engine.step()
    plan = engine.executor.plans[-1]
    assert plan.preempted == [("lo2", "WAITING")] and plan.admitted == ["u"]
    run_to_end(engine)


def test_a_preempted_request_never_preempts_its_preemptor_back():
    # aging keeps the gap constant: with rate 1 the victim b (key 2) stays behind u (key 0.02)
    engine = priority_engine(max_num_seqs=2, aging_rate=1.0, preempt_threshold=0.5)
    engine.add_request(request("a", 4, max_new=60, priority=1, arrival_time=0.0))
    engine.add_request(request("b", 4, max_new=60, priority=2, arrival_time=0.0))
    engine.step()
    engine.step()
    engine.add_request(request("u", 4, max_new=100, priority=0))
    run_to_end(engine)
    assert preempted(engine) == [(3, "b")]
    assert admitted(engine) == ["a", "b", "u", "b"]


# --- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"aging_rate": -1.0}, "aging_rate"),
        ({"aging_rate": math.inf}, "aging_rate"),
        ({"aging_rate": "fast"}, "aging_rate"),
        ({"preempt_threshold": 0.0}, "preempt_threshold"),
        ({"preempt_threshold": -2}, "preempt_threshold"),
        ({"preempt_threshold": math.nan}, "preempt_threshold"),
        ({"preempt_threshold": math.inf}, "preempt_threshold"),  # never preempting is None
        ({"speed": 1}, "speed"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, needle):
    with pytest.raises(PluginLoadError, match=needle):
        make_engine(policy="priority", plugin_options={"priority": options})


def test_options_from_the_config():
    engine = make_engine(policy="priority", plugin_options={"priority": {"aging_rate": 0.5, "preempt_threshold": None}})
    pol = engine.plugins.get("priority")
    assert isinstance(pol, Priority) and pol.aging_rate == 0.5 and pol.preempt_threshold is None
    assert Priority().aging_rate == 0.0 and Priority().preempt_threshold == 1.0


# --- demonstration: two classes at 1.1x capacity ----------------------------------------------------


def two_class_run(policy: str, options: dict | None = None):
    """The first 1000 requests of the `chat` workload (seed 0; priorities 0 and 1) at 1.1 x the
    capacity of 32 slots under the steps cost model; returns the result document, the request
    records and the workload."""
    base = build_workload("chat", seed=0, max_requests=1000)
    items = base.items
    mean_out = sum(it.output_len for it in items) / len(items)
    native_rate = (len(items) - 1) / items[-1].arrival_s
    capacity = 32 / (mean_out * STEP)
    workload = build_workload("chat", seed=0, max_requests=1000, rate_scale=1.1 * capacity / native_rate)
    config = EngineConfig(policy=policy, max_num_seqs=32, plugin_options={policy: options or {}})
    doc, engine = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps", step_time=STEP)))
    return doc, engine.metrics.requests, workload


def ttft(records, priority):
    return distribution(r.first_token_s - r.arrival_s for r in records if r.priority == priority)


def test_urgent_p99_ttft_is_at_most_half_of_fcfs_at_1_1x_capacity():
    fcfs_doc, fcfs, workload = two_class_run("fcfs")
    prio_doc, prio, _ = two_class_run("priority")
    assert fcfs_doc["summary"]["completed"] == prio_doc["summary"]["completed"] == len(workload.items) == 1000
    # the records keep each request's class: as many urgent ones as the workload has
    urgent = sum(it.priority == 0 for it in workload.items)
    assert 0 < urgent < 1000
    assert sum(r.priority == 0 for r in prio) == sum(r.priority == 0 for r in fcfs) == urgent
    fcfs_p99, prio_p99 = ttft(fcfs, 0)["p99"], ttft(prio, 0)["p99"]
    assert fcfs_p99 > 1.0  # the queue builds up: FCFS makes urgent requests wait seconds
    assert prio_p99 <= 0.5 * fcfs_p99
    # and without preemption for waiting requests, order alone still halves it
    _, noprempt, _ = two_class_run("priority", {"preempt_threshold": None})
    assert ttft(noprempt, 0)["p99"] <= 0.5 * fcfs_p99


# --- demonstration: the aging bound ------------------------------------------------------------------

SLOTS, OUT, PERIOD = 4, 10, 10 * STEP  # each request holds its slot OUT steps: H = PERIOD
LOWS = (0.523, 2.047, 4.061)


def starving_workload() -> Workload:
    """4 urgent requests (priority 0) every 0.1 s, half a step before the 4 slots free up, for
    10 s: they alone keep every slot busy, so without aging a priority-1 request waits until the
    stream ends. Three priority-1 requests arrive in between. Every prompt is 16 tokens (one
    chunk), every output 10 tokens."""
    items = []
    for k in range(100):
        t = max(0.0, k * PERIOD - STEP / 2)
        items += [WorkloadItem(t, ((("u", k, j), 16),), OUT, priority=0) for j in range(SLOTS)]
    items += [WorkloadItem(t, ((("low", i), 16),), OUT, priority=1) for i, t in enumerate(LOWS)]
    return Workload("starving", items)


def run_starving(aging_rate: float):
    config = EngineConfig(policy="priority", max_num_seqs=SLOTS, plugin_options={"priority": {"aging_rate": aging_rate}})
    doc, engine = run_workload(starving_workload(), config, SimulatedExecutor(make_cost_model("steps", step_time=STEP)))
    assert doc["summary"]["completed"] == 403 and doc["summary"]["preemptions"] == 0
    return engine.metrics.requests


def aging_bounds(records, rate: float) -> dict[str, float]:
    """For each request R: D = (p - p_min) / rate, t0 = arrival + D, Q = requests ordered ahead of
    R (by priority + rate x arrival, then arrival) that arrived by t0 and were not yet admitted at
    t0; the bound is D + ceil((Q + 1) / S) x H + one step."""
    p_min = min(r.priority for r in records)

    def rank(r):
        return (r.priority + rate * r.arrival_s, r.arrival_s, int(r.id))

    bounds = {}
    for r in records:
        d = (r.priority - p_min) / rate
        t0 = r.arrival_s + d
        q = sum(
            1 for x in records
            if rank(x) < rank(r) and x.arrival_s <= t0 and x.first_scheduled_s >= t0
        )
        bounds[r.id] = d + math.ceil((q + 1) / SLOTS) * PERIOD + STEP
    return bounds


def test_with_aging_no_request_waits_longer_than_the_aging_bound():
    """What this proves, on a workload where urgent requests alone fill every slot (so priority-1
    requests starve without aging):

    1. strict order: a request first scheduled before R that arrived after R is ordered ahead of it
       (its priority + rate x arrival is lower), so nothing that arrives at or after
       arrival(R) + (p - p_min) / rate overtakes R;
    2. every request's queue time (first scheduled - arrival) is at most
       D + ceil((Q + 1) / S) x H + one step (see `aging_bounds` and the `Priority` docstring), and
       here that is at most D + 2 H + one step for every request;
    3. without aging the same workload keeps each priority-1 request waiting over 5 s, more than
       its bound with aging (1.21 s): the bound comes from the aging.
    """
    rate = 1.0
    records = run_starving(rate)
    by_id = {r.id: r for r in records}
    # 1. strict order
    for r in records:
        for x in records:
            if x.first_scheduled_s < r.first_scheduled_s and x.arrival_s > r.arrival_s:
                assert x.priority + rate * x.arrival_s < r.priority + rate * r.arrival_s
                assert x.arrival_s < r.arrival_s + (r.priority - 0) / rate
    # 2. the bound
    bounds = aging_bounds(records, rate)
    for r in records:
        wait = r.first_scheduled_s - r.arrival_s
        assert wait <= bounds[r.id] + 1e-9, (r.id, r.priority, wait, bounds[r.id])
        assert wait <= (r.priority / rate) + 2 * PERIOD + STEP + 1e-9
    low_waits = sorted(r.first_scheduled_s - r.arrival_s for r in records if r.priority == 1)
    assert all(1.0 <= w <= 1.0 + 2 * PERIOD + STEP for w in low_waits)
    # 3. without aging they starve
    starved = run_starving(0.0)
    starved_waits = [r.first_scheduled_s - r.arrival_s for r in starved if r.priority == 1]
    assert min(starved_waits) > 5.0
    assert len(by_id) == 403


# --- conformance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"aging_rate": 2.0, "preempt_threshold": 0.5}])
def test_conforms_to_the_plugin_contract(options):
    from metroline.testing import check_plugin

    report = check_plugin("priority", options=options)
    assert len(report.runs) == 6 and sum(r["preemptions"] for r in report.runs) > 0


# --- vLLM's priority scheduler (`vllm = true`, set by `--preset vllm --policy priority`) -------------


def vllm_priority_engine(**config):
    return make_engine(preset="vllm", policy="priority", **config)


def test_the_vllm_preset_makes_priority_vllms_priority_scheduler():
    assert EngineConfig(preset="vllm", policy="priority").plugin_options == {"priority": {"vllm": True}}
    assert EngineConfig(preset="vllm").plugin_options == {}  # fcfs: nothing for a plugin not loaded
    pol = vllm_priority_engine().plugins.get("priority")
    assert pol.vllm and pol.preempt_threshold is None and pol.aging_rate == 0.0
    # the policy's own options stay reachable: vllm = false gives aging and the threshold back
    own = vllm_priority_engine(plugin_options={"priority": {"vllm": False, "aging_rate": 0.5}}).plugins.get("priority")
    assert not own.vllm and own.aging_rate == 0.5 and own.preempt_threshold == 1.0


@pytest.mark.parametrize(("options", "needle"), [({"aging_rate": 0.5}, "aging_rate must be 0 with vllm"),
                                                  ({"preempt_threshold": 1.0}, "preempt_threshold must be None")])
def test_vllm_priority_refuses_aging_and_a_threshold(options, needle):
    with pytest.raises(PluginLoadError, match=needle):
        vllm_priority_engine(plugin_options={"priority": options})


def test_vllm_priority_breaks_ties_by_arrival_then_request_id_as_a_string():
    # vLLM's Request.__lt__: (priority, arrival_time, request_id); "10" < "2" < "9" as strings
    engine = vllm_priority_engine(max_num_seqs=1)
    for rid, prio in [("9", 0), ("1", 1), ("10", 0), ("2", 0)]:
        engine.add_request(request(rid, 4, max_new=1, priority=prio, arrival_time=0.0))
    run_to_end(engine)
    assert admitted(engine) == ["10", "2", "9", "1"]


def test_vllm_priority_victim_is_the_first_of_the_worst_in_running_order():
    # the case of test_victim_for_a_running_request_is_the_worst_priority_latest_arrival_on_ties:
    # y and z tie at (2, 0.0); vLLM's max(running, key=(priority, arrival_time)) is the first of
    # them in the running list, y (admitted before z), not the latest arrival
    engine = vllm_priority_engine(num_blocks=6, max_num_seqs=3)
    engine.add_request(request("x", 4, max_new=12, priority=1, arrival_time=0.0))
    engine.add_request(request("y", 4, max_new=12, priority=2, arrival_time=0.0))
    engine.add_request(request("z", 4, max_new=12, priority=2, arrival_time=0.0))
    run_to_end(engine)
    assert preempted(engine)[0] == (6, "y")


def test_vllm_priority_never_preempts_for_a_waiting_request():
    # one slot, a less urgent request running: the urgent one waits for it (the policy's own
    # default, preempt_threshold 1.0, would preempt it)
    for engine, victims in [(vllm_priority_engine(max_num_seqs=1), []), (priority_engine(max_num_seqs=1), ["low"])]:
        engine.add_request(request("low", 4, max_new=5, priority=2, arrival_time=0.0))
        engine.step()
        engine.add_request(request("urgent", 4, max_new=1, priority=0, arrival_time=0.0))
        run_to_end(engine)
        assert [sid for _, sid in preempted(engine)] == victims
