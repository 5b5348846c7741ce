"""The `srpt` policy: its admission order (hints, learned estimates, another plugin's estimates), the
starvation guard, its victims, its options, and the two demonstrations (mean E2E against FCFS on
the Azure conversation trace; the guard's bound)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
from conftest import make_engine, request, run_to_end

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError, PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import SeqState, Sequence
from metroline.core.workloads.build import Workload, WorkloadError, WorkloadItem, build_workload, find_traces_dir
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.srpt import SRPT, tokens_to_prefill

STEP = 0.01


def admitted(engine) -> list[str]:
    return [sid for p in engine.executor.plans for sid in p.admitted]


def preempted(engine) -> list[tuple[int, str]]:
    return [(p.step, sid) for p in engine.executor.plans for sid, _ in p.preempted]


def srpt_engine(options: dict | None = None, **config):
    return make_engine(policy="srpt", plugin_options={"srpt": options or {}}, **config)


def hinted(rid: str, prompt: int, hint: int | None, max_new: int | None = None, **kw) -> dict:
    """A request whose `expected_output_tokens` is `hint`; it generates `max_new` tokens (default:
    the hint, at least 1; an estimate above `max_new_tokens` counts as `max_new_tokens`)."""
    r = request(rid, prompt, max_new=max_new or max(1, hint or 1), **kw)
    r["expected_output_tokens"] = hint
    return r


# --- admission order -------------------------------------------------------------------------------

# (id, prompt tokens, expected output tokens); budget 64 tokens a step
HAND_MADE = [("a", 4, 10), ("b", 4, 3), ("c", 64, 3), ("d", 4, 0), ("e", 32, 3)]


def run_hand_made(options: dict | None = None) -> list[str]:
    engine = srpt_engine(options, max_num_seqs=1, max_num_batched_tokens=64)
    for i, (rid, prompt, hint) in enumerate(HAND_MADE):
        engine.add_request(hinted(rid, prompt, hint, arrival_time=float(i)))
    engine.executor.idle_until(10.0)
    run_to_end(engine)
    return admitted(engine)


def test_admits_fewest_remaining_steps_first():
    # default prefill weight 1/64 (a step prefills up to 64 tokens but decodes one per request):
    # a 10.06, b 3.06, c 4.0, d 0.06, e 3.5
    assert run_hand_made() == ["d", "b", "e", "c", "a"]


def test_prefill_weight_one_counts_prompt_and_output_tokens_alike():
    # a 14, b 7, c 67, d 4, e 35
    assert run_hand_made({"prefill_weight": 1.0}) == ["d", "b", "a", "e", "c"]


def test_ties_go_to_the_earlier_arrival():
    engine = srpt_engine(max_num_seqs=1)
    for rid, t in (("late", 2.0), ("early", 1.0), ("mid", 1.5)):
        engine.add_request(hinted(rid, 4, 5, arrival_time=t))
    engine.executor.idle_until(3.0)
    run_to_end(engine)
    assert admitted(engine) == ["early", "mid", "late"]


def test_without_a_hint_it_learns_a_mean_per_tenant():
    engine = srpt_engine({"prior_output_tokens": 20}, max_num_seqs=1)
    engine.add_request(hinted("a1", 4, None, max_new=30, tenant="A"))
    engine.add_request(hinted("a2", 4, None, max_new=10, tenant="A"))
    engine.add_request(hinted("b1", 4, None, max_new=2, tenant="B"))
    run_to_end(engine)
    pol = engine.plugins.get("srpt")
    assert pol.mean_lengths.tenant_stats == {"A": [40, 2], "B": [2, 1]}
    # A's mean is 20 tokens, B's 2, C has none (prior 20, and C arrived first: before A on the tie)
    t = engine.executor.now()
    engine.add_request(hinted("c", 4, None, max_new=30, tenant="C", arrival_time=t))
    engine.add_request(hinted("a3", 4, None, max_new=30, tenant="A", arrival_time=t))
    engine.add_request(hinted("b2", 4, None, max_new=30, tenant="B", arrival_time=t))
    run_to_end(engine)
    # first the prior (20, capped at each max_new_tokens: 20, 10, 2), then the learned means
    assert admitted(engine) == ["b1", "a2", "a1", "b2", "c", "a3"]


def test_srpt_alone_orders_as_srpt_with_the_length_mean_plugin():
    """srpt's own estimate (when no plugin answers) is `length_mean`'s, same prior."""
    orders = []
    for specs in ((), ("metroline.policies.length_estimators:LengthMean",)):
        engine = make_engine(policy="srpt", specs=specs, max_num_seqs=1)
        for i, (tenant, out) in enumerate((("A", 30), ("B", 3), ("A", 10), ("B", 5), ("C", 1))):
            engine.add_request(hinted(f"w{i}", 4, None, max_new=out, tenant=tenant))
        run_to_end(engine)
        t = engine.executor.now()
        for tenant in "ABC":
            engine.add_request(hinted(f"late-{tenant}", 4, None, max_new=40, tenant=tenant, arrival_time=t))
        run_to_end(engine)
        orders.append(admitted(engine))
    assert orders[0] == orders[1]
    # means A 20, B 4, C 1: the late requests go C, B, A (shortest first) although they came A, B, C
    assert orders[0][-3:] == ["late-C", "late-B", "late-A"]


class PromptLengthEstimator:
    """Another plugin's estimate: the output is as long as the prompt."""

    name = "prompt_length_estimator"

    @hookimpl
    def estimate_output_tokens(self, seq):
        return seq.num_prompt_tokens


def test_a_plugins_estimate_wins_over_srpts_own():
    engine = make_engine(policy="srpt", max_num_seqs=1, plugins=[PromptLengthEstimator()])
    for rid, prompt in (("p12", 12), ("p4", 4), ("p8", 8)):
        engine.add_request(hinted(rid, prompt, None, arrival_time=0.0))
    run_to_end(engine)
    assert admitted(engine) == ["p4", "p8", "p12"]


class FixedEstimator:
    """Another plugin's estimate: always `answer`."""

    name = "fixed_estimator"

    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def estimate_output_tokens(self, seq):
        return self.answer


@pytest.mark.parametrize(("answer", "shown"), [(-1, "-1"), (True, "True"), (2.5, "2.5"), ("7", "'7'")])
def test_an_estimate_that_is_not_an_int_of_at_least_zero_is_refused_naming_the_plugin(answer, shown):
    """The hook's contract: an int >= 0 or None. srpt orders by the answer, so -1 would put the
    request ahead of every true estimate; the engine refuses it at the hook, naming the plugin,
    the hook, the request and the limit, before srpt uses it."""
    engine = make_engine(policy="srpt", max_num_seqs=1, plugins=[FixedEstimator(answer)])
    engine.add_request(hinted("r", 4, None, arrival_time=0.0))
    with pytest.raises(PluginError, match=(r"plugin 'fixed_estimator', hook 'estimate_output_tokens', request 'r': "
                                           rf"expected an int >= 0, got {re.escape(shown)}")):
        run_to_end(engine)


def test_an_estimate_of_zero_is_used():
    """0 is the smallest valid estimate: a request expected to generate nothing more is shortest."""
    engine = make_engine(policy="srpt", max_num_seqs=1, plugins=[FixedEstimator(0)])
    engine.add_request(hinted("long-prompt", 40, None, arrival_time=0.0))
    engine.add_request(hinted("hinted", 4, 3, arrival_time=0.0))
    run_to_end(engine)
    assert admitted(engine) == ["long-prompt", "hinted"]


def test_a_hint_wins_over_any_estimate():
    engine = make_engine(policy="srpt", max_num_seqs=1, plugins=[PromptLengthEstimator()])
    engine.add_request(hinted("short-prompt", 4, 50, max_new=60, arrival_time=0.0))
    engine.add_request(hinted("long-prompt", 40, 1, max_new=60, arrival_time=0.0))
    run_to_end(engine)
    assert admitted(engine) == ["long-prompt", "short-prompt"]


def test_tokens_to_prefill():
    s = Sequence("s", [1] * 10, SamplingParams(max_new_tokens=20), 0.0)
    assert tokens_to_prefill(s) == 10
    s.num_computed_tokens = 6
    assert tokens_to_prefill(s) == 4  # in the middle of its prefill
    s.num_computed_tokens = 10
    s.token_ids += [7, 8, 9]
    s.num_computed_tokens = 12
    assert tokens_to_prefill(s) == 0  # decoding
    s.num_computed_tokens = 0
    assert tokens_to_prefill(s) == 12  # recompute preemption: all but the newest token again


# --- the guard ---------------------------------------------------------------------------------------

# (id, expected output tokens, arrival); the first step runs at t = 10
GUARD_CASE = [("A", 100, 0.0), ("C", 50, 2.0), ("B", 1, 9.9)]


@pytest.mark.parametrize(
    ("max_wait_s", "order"),
    [
        (None, ["B", "C", "A"]),  # shortest first
        (5.0, ["A", "C", "B"]),  # A and C waited over 5 s: first come first served, then B
        (9.5, ["A", "B", "C"]),  # only A waited over 9.5 s (C has waited 8 s, then 9 s when A ends)
        (0.0, ["A", "C", "B"]),  # everyone is overdue: FCFS
    ],
)
def test_the_guard_promotes_overdue_requests_first_come_first_served(max_wait_s, order):
    engine = srpt_engine({"max_wait_s": max_wait_s}, max_num_seqs=1)
    for rid, hint, t in GUARD_CASE:
        engine.add_request(hinted(rid, 4, hint, arrival_time=t))
    engine.executor.idle_until(10.0)
    run_to_end(engine)
    assert admitted(engine) == order


# --- victims -------------------------------------------------------------------------------------------


def test_victim_is_the_running_request_with_the_longest_remaining_time():
    # 6 blocks: x, y, z each fill 2 blocks by token 8; at step 6 (position 8) the first one served
    # needs a third block. Expected remaining then: x 12 - 5 = 7, y 20 - 5 = 15, z 0
    engine = srpt_engine(num_blocks=6, max_num_seqs=3)
    engine.add_request(hinted("x", 4, 12, max_new=20, arrival_time=0.0))
    engine.add_request(hinted("y", 4, 20, max_new=20, arrival_time=0.0))
    engine.add_request(hinted("z", 4, 5, max_new=20, arrival_time=0.0))
    run_to_end(engine)
    assert admitted(engine)[:3] == ["z", "x", "y"]
    assert preempted(engine)[0] == (6, "y")


def test_victim_ties_go_to_the_latest_arrival():
    engine = srpt_engine(num_blocks=6, max_num_seqs=3)
    for rid in ("x", "y", "z"):
        engine.add_request(hinted(rid, 4, 20, max_new=20, arrival_time=0.0))
    run_to_end(engine)
    assert preempted(engine)[0] == (6, "z")


def test_the_longest_remaining_time_wins_over_a_later_arrival():
    """The victim's key is the remaining time first, arrival only on ties: the request with 30
    output tokens to go is the victim although it arrived first, before ones with 10 and 5 to go."""
    def running(rid: str, arrival: float, expected: int) -> Sequence:
        s = Sequence(rid, [1] * 4, SamplingParams(max_new_tokens=40), arrival, expected_output_tokens=expected,
                     arrival_no=int(arrival))
        s.num_computed_tokens = 4  # prefilled: only output tokens remain
        s.state = SeqState.RUNNING
        return s

    seqs = [running("early-long", 0.0, 30), running("mid", 2.0, 10), running("late-short", 5.0, 5)]
    ctx = SimpleNamespace(running=seqs, config=SimpleNamespace(max_num_batched_tokens=64), hook=None)
    policy = SRPT()
    assert [policy.remaining(ctx, s) for s in seqs] == [30.0, 10.0, 5.0]
    assert policy.select_victim(ctx=ctx, requester=seqs[2]) is seqs[0]
    # equal remaining times: the later arrival_time (even with the smaller arrival number), then
    # the later arrival number, then the higher sample index
    late, early = running("late", 2.0, 10), running("early", 1.0, 10)
    late.arrival_no, early.arrival_no = 1, 2
    second, first = running("second", 1.0, 10), running("first", 1.0, 10)
    second.arrival_no, first.arrival_no, first.index = 2, 1, 1
    for pair, victim in (([late, early], late), ([second, first], second)):
        for order in (pair, pair[::-1]):
            ctx.running = order
            assert policy.select_victim(ctx=ctx, requester=order[0]) is victim


def test_a_waiting_request_never_preempts_a_running_one():
    engine = srpt_engine(max_num_seqs=1)
    engine.add_request(hinted("long", 4, 30, max_new=30))
    engine.step()
    engine.add_request(hinted("short", 4, 1, max_new=1))
    run_to_end(engine)
    assert preempted(engine) == []
    assert engine.sequences("short")[0].first_scheduled_time == pytest.approx(30 * STEP)


# --- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"prior_output_tokens": -1}, "prior_output_tokens"),
        ({"prior_output_tokens": 1.5}, "prior_output_tokens"),
        ({"max_wait_s": -0.1}, "max_wait_s"),
        ({"max_wait_s": math.inf}, "max_wait_s"),
        ({"prefill_weight": -1.0}, "prefill_weight"),
        ({"prefill_weight": "x"}, "prefill_weight"),
        ({"oracle": True}, "oracle"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, needle):
    with pytest.raises(PluginLoadError, match=needle):
        make_engine(policy="srpt", plugin_options={"srpt": options})


def test_options_from_the_config():
    engine = make_engine(policy="srpt", plugin_options={"srpt": {"prior_output_tokens": 7, "max_wait_s": 2}})
    pol = engine.plugins.get("srpt")
    assert isinstance(pol, SRPT) and pol.prior_output_tokens == 7 and pol.max_wait_s == 2.0
    assert pol.prefill_weight is None and SRPT().max_wait_s is None


# --- demonstration: SRPT with oracle lengths against FCFS on azure-conv ----------------------------------

AZURE_REQUESTS, AZURE_SLOTS = 3000, 32


def azure_at_1_1x():
    """The first 3000 requests of azure-conv, arrivals scaled to 1.1 x the capacity of 32 slots
    under the steps cost model (capacity = 32 / (mean output tokens x 0.01 s))."""
    items = build_workload("azure-conv", max_requests=AZURE_REQUESTS).items
    mean_out = sum(it.output_len for it in items) / len(items)
    native_rate = (len(items) - 1) / items[-1].arrival_s
    capacity = AZURE_SLOTS / (mean_out * STEP)
    return build_workload("azure-conv", max_requests=AZURE_REQUESTS, rate_scale=1.1 * capacity / native_rate)


def test_srpt_with_oracle_lengths_halves_fcfs_mean_e2e_on_azure_conv():
    try:
        find_traces_dir()
    except WorkloadError:
        pytest.skip("no traces directory (../shared/traces or $METROLINE_TRACES)")
    workload = azure_at_1_1x()
    results = {}
    for policy, oracle in (("fcfs", False), ("srpt", True)):
        config = EngineConfig(policy=policy, max_num_seqs=AZURE_SLOTS)
        doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps", step_time=STEP)),
                              oracle_lengths=oracle)
        assert doc["summary"]["completed"] == AZURE_REQUESTS
        results[policy] = doc
    assert results["srpt"]["workload"]["oracle_lengths"] is True
    fcfs_e2e = results["fcfs"]["summary"]["e2e_s"]["mean"]
    srpt_e2e = results["srpt"]["summary"]["e2e_s"]["mean"]
    assert fcfs_e2e > 10.0  # the queue builds up
    assert srpt_e2e <= 0.6 * fcfs_e2e


# --- demonstration: the guard's bound ----------------------------------------------------------------------

SLOTS, SHORT, LONG, PERIOD = 4, 10, 40, 10 * STEP
LONGS = (0.523, 2.047, 4.061)
GUARD_S = 1.0


def starving_workload() -> Workload:
    """4 short requests (10 output tokens) every 0.1 s, half a step before the 4 slots free up, for
    10 s: they alone keep every slot busy, so without the guard a long request (40 tokens) waits
    until the stream ends. Three long requests arrive in between. Every prompt is 16 tokens."""
    items = []
    for k in range(100):
        t = max(0.0, k * PERIOD - STEP / 2)
        items += [WorkloadItem(t, ((("short", k, j), 16),), SHORT) for j in range(SLOTS)]
    items += [WorkloadItem(t, ((("long", i), 16),), LONG) for i, t in enumerate(LONGS)]
    return Workload("starving", items)


def run_starving(max_wait_s):
    config = EngineConfig(policy="srpt", max_num_seqs=SLOTS, plugin_options={"srpt": {"max_wait_s": max_wait_s}})
    doc, engine = run_workload(starving_workload(), config, SimulatedExecutor(make_cost_model("steps", step_time=STEP)),
                               oracle_lengths=True)
    assert doc["summary"]["completed"] == 403 and doc["summary"]["preemptions"] == 0
    return engine.metrics.requests


def test_with_the_guard_no_request_waits_longer_than_the_guard_allows():
    """What this proves, on a workload where short requests alone fill every slot (so long ones
    starve under plain SRPT):

    every request R waits (first scheduled - arrival) at most
    max_wait_s + one step + ceil((Q + 1) / S) x H, where Q counts the requests that arrived before R
    and were still waiting when R became overdue, S = 4 slots and H = 0.4 s is the longest a
    request holds a slot (40 output tokens; prompts fit in one chunk): see the `SRPT` docstring.
    Here Q + 1 <= S for every long request, so each waits at most max_wait_s + one step + H.
    Without the guard the same long requests wait over 5 s.
    """
    hold = LONG * STEP
    records = run_starving(GUARD_S)
    for r in records:
        t0 = r.arrival_s + GUARD_S
        q = sum(
            1 for x in records
            if (x.arrival_s, int(x.id)) < (r.arrival_s, int(r.id)) and x.first_scheduled_s >= t0
        )
        wait = r.first_scheduled_s - r.arrival_s
        bound = GUARD_S + STEP + math.ceil((q + 1) / SLOTS) * hold
        assert wait <= bound + 1e-9, (r.id, wait, q, bound)
        assert wait <= GUARD_S + STEP + hold + 1e-9
    long_waits = [r.first_scheduled_s - r.arrival_s for r in records if r.output_tokens == LONG]
    assert len(long_waits) == 3 and all(GUARD_S < w <= GUARD_S + STEP + hold + 1e-9 for w in long_waits)
    starved = run_starving(None)
    starved_waits = [r.first_scheduled_s - r.arrival_s for r in starved if r.output_tokens == LONG]
    assert min(starved_waits) > 5.0


# --- conformance -------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"max_wait_s": 0.05, "prefill_weight": 1.0}])
def test_conforms_to_the_plugin_contract(options):
    from metroline.testing import check_plugin

    report = check_plugin("srpt", options=options)
    assert len(report.runs) == 6 and sum(r["preemptions"] for r in report.runs) > 0
