"""`token_rr`: the rotation over running requests, the prefill quantum, admission, the victim, its
options, and the demonstration (with a decode share smaller than the running set, no request falls
more than one decode token behind another, on every step of the run)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import make_engine, request, run_to_end

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.manager import PluginManager
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import SeqState, Sequence
from metroline.core.results.metrics import DECODE_TOKENS, DECODING
from metroline.core.step.plan import StepPlan
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.token_rr import TokenRoundRobin
from metroline.testing import check_plugin


def seq(rid: str, arrival: float = 0.0, prompt: int = 4) -> Sequence:
    return Sequence(rid, list(range(1, prompt + 1)), SamplingParams(max_new_tokens=8), arrival,
                    arrival_no=int(arrival * 100))


def decoding(s: Sequence) -> Sequence:
    """Make `s` a running sequence that wants a decode token."""
    s.state = SeqState.RUNNING
    s.token_ids.append(99)
    s.num_computed_tokens = len(s.token_ids) - 1
    return s


def ctx_of(**config) -> SimpleNamespace:
    return SimpleNamespace(config=EngineConfig(**config))


def plan_of(scheduled: dict[Sequence, int]) -> StepPlan:
    plan = StepPlan(1, 16)
    plan.scheduled = dict(scheduled)
    return plan


def ids(seqs) -> list[str]:
    return [s.request_id for s in seqs]


def test_served_requests_move_to_the_back_in_turn():
    rr = TokenRoundRobin()
    s1, s2, s3, s4, s5 = (decoding(seq(f"s{i}", i)) for i in range(1, 6))
    rr.on_admitted(seqs=[s1, s2, s3, s4, s5])
    ctx = ctx_of()
    running = [s1, s2, s3, s4, s5]
    assert ids(rr.order_running(running=running)) == ["s1", "s2", "s3", "s4", "s5"]
    rr.on_step_end(ctx=ctx, plan=plan_of({s1: 1, s2: 1}))  # a decode share of 2
    assert ids(rr.order_running(running=running)) == ["s3", "s4", "s5", "s1", "s2"]
    rr.on_step_end(ctx=ctx, plan=plan_of({s3: 1, s4: 1}))
    assert ids(rr.order_running(running=running)) == ["s5", "s1", "s2", "s3", "s4"]
    # s2 is preempted, s5 finishes, s6 is admitted: it joins at the back
    s2.state = SeqState.WAITING
    rr.on_preempted(seqs=[s2])
    rr.on_finished(seqs=[s5])
    s6 = decoding(seq("s6", 6))
    rr.on_admitted(seqs=[s6])
    running = [s1, s3, s4, s6]
    assert ids(rr.order_running(running=running)) == ["s1", "s3", "s4", "s6"]
    rr.on_step_end(ctx=ctx, plan=plan_of({s1: 1, s3: 1}))
    assert ids(rr.order_running(running=running)) == ["s4", "s6", "s1", "s3"]


def test_order_resynchronises_with_requests_it_was_not_told_about():
    rr = TokenRoundRobin()
    s1, s2, s3 = (decoding(seq(f"s{i}", i)) for i in range(1, 4))
    rr.on_admitted(seqs=[s2])
    assert ids(rr.order_running(running=[s1, s2, s3])) == ["s2", "s1", "s3"]


def test_prefill_cut_short_by_the_budget_keeps_its_turn():
    rr = TokenRoundRobin(prefill_quantum=8)
    p1, p2, p3 = (seq(f"p{i}", i, prompt=40) for i in range(1, 4))
    for p in (p1, p2, p3):
        p.state = SeqState.RUNNING
    rr.on_admitted(seqs=[p1, p2, p3])
    ctx = ctx_of()
    # a budget of 20: p1 and p2 got a full quantum, p3 only 4 tokens
    p1.num_computed_tokens, p2.num_computed_tokens, p3.num_computed_tokens = 8, 8, 4
    rr.on_step_end(ctx=ctx, plan=plan_of({p1: 8, p2: 8, p3: 4}))
    assert ids(rr.order_running(running=[p1, p2, p3])) == ["p3", "p1", "p2"]
    # the last chunk of a prompt (shorter than the quantum) ends the turn
    p3.num_computed_tokens = 40
    p3.token_ids.append(7)
    rr.on_step_end(ctx=ctx, plan=plan_of({p3: 4}))
    assert ids(rr.order_running(running=[p1, p2, p3])) == ["p1", "p2", "p3"]


def test_split_caps_chunks_at_the_quantum():
    rr = TokenRoundRobin(prefill_quantum=100)
    assert rr.split_budget(ctx=ctx_of(max_num_batched_tokens=512), budget=512, num_decoding=30) == Split(30, 482, 100)
    assert rr.split_budget(ctx=ctx_of(max_num_batched_tokens=512), budget=512, num_decoding=600) == Split(512, 0, 100)
    small_chunk = ctx_of(max_num_batched_tokens=512, max_prefill_chunk=64)
    assert rr.split_budget(ctx=small_chunk, budget=512, num_decoding=0) == Split(0, 512, 64)


def test_admission_in_arrival_order_and_a_preempted_request_keeps_its_place():
    rr = TokenRoundRobin()
    w1, w2, w3 = seq("w1", 1.0), seq("w2", 2.0), seq("w3", 3.0)
    rr.on_arrival(seqs=[w2, w1, w3])
    answer = rr.admission()
    assert answer.head_of_line
    candidates = iter(answer)
    assert next(candidates) is w1
    w1.state = SeqState.RUNNING  # admitted; the scheduler then closes the candidates
    candidates.close()
    assert ids(rr.admission()) == ["w2", "w3"]
    w1.state = SeqState.WAITING
    rr.on_preempted(seqs=[w1])
    assert ids(rr.admission()) == ["w1", "w2", "w3"]


def test_victim_is_the_back_of_the_rotation():
    rr = TokenRoundRobin()
    s1, s2, s3 = (decoding(seq(f"s{i}", i)) for i in range(1, 4))
    rr.on_admitted(seqs=[s1, s2, s3])
    rr.on_step_end(ctx=ctx_of(), plan=plan_of({s2: 1, s1: 1}))  # rotation: s3, s2, s1
    assert rr.select_victim(ctx=None, requester=s3) is s1
    s1.state = SeqState.WAITING  # preempted earlier in the step (on_preempted comes at its end)
    assert rr.select_victim(ctx=None, requester=s3) is s2
    assert rr.select_victim(ctx=None, requester=seq("w", 9)) is None  # a waiting requester


@pytest.mark.parametrize("value", [0, -4, 2.5, True, "256"])
def test_bad_quantum_is_named(value):
    config = EngineConfig(policy="token_rr", plugin_options={"token_rr": {"prefill_quantum": value}})
    with pytest.raises(PluginLoadError, match=r"plugin 'token_rr': option 'prefill_quantum': Input should be (greater than or equal to 1|a valid integer) \(got "):
        PluginManager(config)


def test_conformance():
    report = check_plugin("token_rr", options={"prefill_quantum": 64})
    assert len(report.runs) == 6 and sum(r["preemptions"] for r in report.runs) > 0


def test_prefill_chunks_rotate_by_quantum_in_the_engine():
    engine = make_engine(policy="token_rr", max_num_batched_tokens=20, num_blocks=256,
                         plugin_options={"token_rr": {"prefill_quantum": 8}})
    for rid in ("a", "b", "c"):
        engine.add_request(request(rid, 24, max_new=2))
    for _ in range(5):
        engine.step()
    plans = [p.scheduled for p in engine.executor.plans]
    assert plans == [
        {"a": 8, "b": 8, "c": 4},  # admitted in arrival order; c's turn is cut short by the budget
        {"c": 8, "a": 8, "b": 4},  # c keeps the front; then b's turn is cut short
        {"b": 8, "c": 8, "a": 4},
        {"a": 4, "b": 4, "c": 4},  # the last chunk of each prompt: first tokens
        {"a": 1, "b": 1, "c": 1},
    ]
    run_to_end(engine)


# ---------------------------------------------------------------------------------------------
# demonstration: decode tokens stay within one of each other


class DecodeShare:
    """Caps the decode share at `cap` tokens a step (below the running set), prefill gets the rest."""

    name = "decode_share"

    def __init__(self, cap: int, chunk: int) -> None:
        self.cap, self.chunk = cap, chunk

    @hookimpl
    def split_budget(self, budget: int, num_decoding: int) -> Split:
        decode = min(self.cap, num_decoding)
        return Split(decode, budget - decode, self.chunk)


class DecodeLag:
    """Counts each sequence's decode tokens and, at the end of every step, the largest difference
    between two decoding sequences over the steps both have been decoding."""

    name = "decode_lag"

    def __init__(self) -> None:
        self.count: dict[Sequence, int] = {}
        self.base: dict[Sequence, dict[Sequence, int]] = {}  # at X's first decode: others' counts
        self.worst = 0
        self.pairs_checked = 0

    @hookimpl
    def on_tokens(self, seqs: list[Sequence]) -> None:
        count = self.count
        joined = []
        for s in seqs:
            if s.num_output_tokens == 1:
                joined.append(s)  # first token: a decoder from the next step on
            else:
                count[s] += 1
        decoders = list(count)
        for x in decoders:
            for y, y0 in self.base[x].items():
                if y in count:
                    self.worst = max(self.worst, abs(count[x] - (count[y] - y0)))
                    self.pairs_checked += 1
        for s in seqs:
            if s.state is SeqState.FINISHED:
                count.pop(s, None)
                self.base.pop(s, None)
        for s in joined:
            if s.state is not SeqState.FINISHED:
                self.base[s] = dict(count)
                count[s] = 0

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        raise AssertionError("the demonstration must run without preemption")


def decode_lag_run(policy: str, seed: int) -> tuple[DecodeLag, object]:
    spec = SyntheticSpec(num_requests=150, rate=150.0, prompt_len={"dist": "uniform", "low": 8, "high": 48},
                         output_len={"dist": "uniform", "low": 4, "high": 60}, seed=seed)
    config = EngineConfig(block_size=16, num_blocks=1024, max_num_seqs=12, max_num_batched_tokens=64, policy=policy)
    lag = DecodeLag()
    _, engine = run_workload(Workload("w", generate(spec, namespace="rr")), config,
                             SimulatedExecutor(make_cost_model("steps")), plugins=[DecodeShare(4, 16), lag])
    return lag, engine


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_request_falls_more_than_one_decode_token_behind(seed):
    """12 running slots, a decode share of 4 tokens: on every step of the run, any two requests
    that have both been decoding since some step got decode tokens within one of each other since
    then. FCFS's admission order, on the same run, lets the first four take every decode token."""
    lag, engine = decode_lag_run("token_rr", seed)
    steps = engine.metrics.steps
    short = sum(1 for s in steps if s[DECODING] > s[DECODE_TOKENS])
    assert short > len(steps) // 2  # the decode share was below the decoding set on most steps
    assert lag.pairs_checked > 10_000
    assert lag.worst == 1
    assert engine.metrics.requests and all(r.finish_reason == "length" for r in engine.metrics.requests)

    fcfs_lag, _ = decode_lag_run("fcfs", seed)
    assert fcfs_lag.worst > 10
