"""decode_first, prefill_first and weighted_budget: the split each answers, the order in which the
scheduler spends it, and the long-prompt burst demonstration (see bench/long_burst.py)."""

from __future__ import annotations

import pytest

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import replay, run_workload
from metroline.core.plugins.budget import Split
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.results.metrics import DECODE_TOKENS, DECODING, FREE_BLOCKS, PREFILL_TOKENS
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import (
    SyntheticSpec,
    Workload,
    WorkloadItem,
    build_workload,
    generate,
    segment_tokens,
)
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.budget_split import DecodeFirst, PrefillFirst, WeightedBudget, weights_from_cost_model


class StepLog:
    """Records each step's scheduled sequences and token counts."""

    name = "step_log"

    def __init__(self) -> None:
        self.steps: list[list[tuple[str, int]]] = []
        self.splits: list[tuple[int, int]] = []

    @hookimpl
    def on_step_end(self, plan):
        self.steps.append([(s.request_id, n) for s, n in plan.scheduled.items()])
        self.splits.append((plan.num_decode_tokens, plan.num_prefill_tokens))


def request(rid: str, prompt_len: int, out: int, arrival: float = 0.0) -> Request:
    prompt = segment_tokens(rid, prompt_len)
    return Request(request_id=rid, prompt_token_ids=prompt, arrival_time=arrival,
                   sampling=SamplingParams(max_new_tokens=out, ignore_eos=True, temperature=0.0))


def ctx_of(requests: int = 2, **config) -> object:
    """The context of an engine with `requests` waiting (two by default: the engine's chunk cap
    applies only to a step that starts with more than one request)."""
    engine = Engine(EngineConfig(**config))
    for i in range(requests):
        engine.add_request({"request_id": f"w{i}", "prompt_token_ids": [1, 2, 3], "sampling": {"max_new_tokens": 1}})
    return engine.scheduler.ctx


# --- the split each plugin answers ---------------------------------------------------------------


def test_decode_first_split():
    ctx = ctx_of()
    df = DecodeFirst()
    assert df.split_budget(ctx=ctx, budget=2048, num_decoding=50) == Split(50, 1998, 512, None)
    assert df.split_budget(ctx=ctx, budget=2048, num_decoding=0) == Split(0, 2048, 512, None)
    # more decodes than budget: all of it to decodes, nothing to prefill
    assert df.split_budget(ctx=ctx, budget=2048, num_decoding=3000) == Split(2048, 0, 512, None)
    df = DecodeFirst(max_chunk=64, max_partial_prefills=2)
    assert df.split_budget(ctx=ctx, budget=256, num_decoding=10) == Split(10, 246, 64, 2)
    # the engine's max_prefill_chunk is a ceiling on the option
    ctx = ctx_of(max_num_batched_tokens=1024, max_prefill_chunk=128)
    assert DecodeFirst().split_budget(ctx=ctx, budget=1024, num_decoding=1) == Split(1, 1023, 128, None)
    # ... when more than one request is eligible (vLLM's long_prefill_token_threshold)
    ctx = ctx_of(requests=1, max_num_batched_tokens=1024, max_prefill_chunk=128)
    assert DecodeFirst().split_budget(ctx=ctx, budget=1024, num_decoding=0) == Split(0, 1024, 512, None)


def test_weighted_budget_shares_satisfy_the_weighted_constraint():
    wb = WeightedBudget(w_prefill=2.0, w_decode=1.0, capacity=100.0)
    assert wb.shares(64, 10) == (10, 45)  # 1*10 + 2*45 = 100
    assert wb.shares(64, 0) == (0, 50)
    assert wb.shares(64, 200) == (64, 0)  # the token budget binds first
    assert wb.shares(1000, 150) == (100, 0)  # the capacity binds: no more than 100 decodes
    assert wb.shares(1000, 99) == (99, 0)  # 1 unit left, a prefill token costs 2
    assert wb.shares(1000, 97) == (97, 1)
    # rounding: 0.3 / 0.1 must give 3 tokens, not 2
    wb = WeightedBudget(w_prefill=0.1, w_decode=0.1, capacity=0.3)
    assert wb.shares(10, 0) == (0, 3) and wb.shares(10, 1) == (1, 2)
    ctx = ctx_of(max_num_batched_tokens=64, max_prefill_chunk=32)
    assert WeightedBudget(2.0, 1.0, 100.0, max_partial_prefills=3).split_budget(
        ctx=ctx, budget=64, num_decoding=10) == Split(10, 45, 32, 3)


def test_weights_from_a_cost_model():
    cm = make_cost_model("linear", per_step=0.01, per_prefill_token=1e-4, per_decode_token=2e-5, per_kv_token=1e-7)
    opts = weights_from_cost_model(cm, 0.05, context_tokens=100_000)
    assert opts == pytest.approx({"w_prefill": 1e-4, "w_decode": 2e-5, "capacity": 0.03})
    with pytest.raises(ValueError, match="no capacity"):
        weights_from_cost_model(cm, 0.01)


@pytest.mark.parametrize("cls, kwargs, option", [
    (DecodeFirst, {"max_chunk": 0}, "max_chunk"),
    (DecodeFirst, {"max_chunk": 1.5}, "max_chunk"),
    (DecodeFirst, {"max_chunk": True}, "max_chunk"),
    (DecodeFirst, {"max_partial_prefills": 0}, "max_partial_prefills"),
    (PrefillFirst, {"max_partial_prefills": -1}, "max_partial_prefills"),
    (WeightedBudget, {"w_prefill": 0}, "w_prefill"),
    (WeightedBudget, {"w_decode": float("nan")}, "w_decode"),
    (WeightedBudget, {"capacity": -1.0}, "capacity"),
    (WeightedBudget, {"capacity": float("inf")}, "capacity"),
    (WeightedBudget, {"w_prefill": float("inf")}, "w_prefill"),
    (WeightedBudget, {"w_prefill": 2.0, "w_decode": 1.0, "capacity": 1.5}, "capacity"),
    (WeightedBudget, {"max_partial_prefills": 0}, "max_partial_prefills"),
])
def test_bad_options_name_the_option(cls, kwargs, option):
    with pytest.raises(ValueError, match=f"plugin '{cls.name}': option '{option}': "):
        cls(**kwargs)


def test_bad_options_from_the_config_stop_the_engine_at_load():
    config = EngineConfig(plugins=["decode_first"], plugin_options={"decode_first": {"max_chunk": 0}})
    with pytest.raises(PluginLoadError, match=r"plugin 'decode_first': option 'max_chunk': Input should be greater than or equal to 1 \(got 0\)"):
        Engine(config)
    config = EngineConfig(plugins=["decode_first"], plugin_options={"decode_first": {"chunk": 8}})
    with pytest.raises(PluginLoadError, match="decode_first.*chunk"):
        Engine(config)


# --- how the scheduler spends the split ----------------------------------------------------------


class NewestFirst:
    """Admission in reverse arrival order (head-of-line), to tell admission order from serving order."""

    name = "newest_first"

    @hookimpl
    def admission(self, ctx):
        return Candidates(reversed(list(ctx.waiting)), head_of_line=True)


def run_engine(config: EngineConfig, requests: list[Request], extra: list) -> Engine:
    engine = Engine(config, plugins=extra)
    for r in requests:
        engine.add_request(r)
    engine.run()
    return engine


def test_running_partial_prefills_are_served_before_new_admissions():
    # Budget 100, chunks of at most 64. A, B, C arrive together; admission prefers the newest.
    log = StepLog()
    config = EngineConfig(max_num_batched_tokens=100, plugins=["decode_first"],
                          plugin_options={"decode_first": {"max_chunk": 64}})
    run_engine(config, [request("A", 150, 2), request("B", 150, 2), request("C", 150, 2)],
               [NewestFirst(), log])
    assert log.steps[:6] == [
        [("C", 64), ("B", 36)],  # admission order: C then B; the budget is spent
        [("C", 64), ("B", 36)],  # both are running partial prefills: served first, A (waiting) gets nothing
        [("C", 22), ("B", 64), ("A", 14)],  # C's last chunk; only now is A admitted, with what is left
        [("C", 1), ("B", 14), ("A", 64)],  # C decodes first, then the running prefills
        [("B", 1), ("A", 64)],  # C is done (2 output tokens)
        [("A", 8)],
    ]


def test_max_partial_prefills_caps_the_prompts_in_flight():
    log = StepLog()
    config = EngineConfig(max_num_batched_tokens=100, plugins=["decode_first"],
                          plugin_options={"decode_first": {"max_chunk": 64, "max_partial_prefills": 1}})
    run_engine(config, [request("A", 150, 2), request("B", 150, 2)], [log])
    assert log.steps[:5] == [
        [("A", 64)],
        [("A", 64)],
        [("A", 22)],  # one prefill per step: B waits although 78 tokens of budget are left
        [("A", 1), ("B", 64)],
        [("B", 64)],  # A finished (2 tokens)
    ]


def decoders_then_long_prompt(split_plugin: str | None, **config) -> tuple[Engine, StepLog]:
    """Two requests decoding (16-token prompts, 40 outputs), then a 256-token prompt (4 outputs)
    at t = 0.05 s (step 6); budget 64 tokens a step."""
    log = StepLog()
    fields = dict(max_num_batched_tokens=64, plugins=[split_plugin] if split_plugin else [])
    fields.update(config)
    engine = Engine(EngineConfig(**fields), plugins=[log])
    replay(engine, Workload("w", [
        WorkloadItem(0.0, ((("a",), 16),), 40), WorkloadItem(0.0, ((("b",), 16),), 40),
        WorkloadItem(0.05, ((("long",), 256),), 4),
    ]))
    return engine, log


def zero_decode_steps(engine: Engine) -> int:
    return sum(1 for s in engine.metrics.steps if s[DECODING] > 0 and s[DECODE_TOKENS] == 0)


def test_prefill_first_stalls_decodes_while_a_long_prompt_is_prefilled():
    engine, log = decoders_then_long_prompt("prefill_first")
    # 256 prompt tokens at 64 a step: 4 steps with the whole budget to prefill and no decode
    assert zero_decode_steps(engine) == 4
    assert log.splits[5:10] == [(0, 64), (0, 64), (0, 64), (0, 64), (3, 0)]
    a = next(r for r in engine.metrics.requests if r.id == "0")
    gaps = [round(b - x, 6) for x, b in zip(a.token_times, a.token_times[1:])]
    assert max(gaps) == 0.05 and gaps.count(0.05) == 1  # one gap of 5 steps


def test_decode_first_never_stalls_decodes_for_the_same_prompt():
    engine, log = decoders_then_long_prompt("decode_first")
    assert zero_decode_steps(engine) == 0
    # the 256-token prompt is spread over 5 steps of 62 prefill tokens next to the 2 decodes
    assert log.splits[5:10] == [(2, 62), (2, 62), (2, 62), (2, 62), (2, 8)]
    for r in engine.metrics.requests:
        assert all(round(b - x, 6) == 0.01 for x, b in zip(r.token_times, r.token_times[1:]))


def test_prefill_first_counts_only_prompts_whose_blocks_fit():
    # When the long prompt arrives the two decoders hold 2 blocks each; its 256 tokens need 16.
    # 22 blocks: 18 free, it fits, prefill takes the budget (4 stalled steps, no preemption).
    engine, _ = decoders_then_long_prompt("prefill_first", num_blocks=22)
    assert engine.metrics.steps[4][FREE_BLOCKS] == 18
    assert zero_decode_steps(engine) == 4 and engine.scheduler.total_preemptions == 0
    # 18 blocks: 14 free, it does not fit, so it is no demand: the decodes keep their share
    # (with the first-chunk admission gate fcfs still admits its first chunks into the rest of the
    # budget, and preempts it later).
    engine, log = decoders_then_long_prompt("prefill_first", num_blocks=18, admission_gate="first_chunk")
    assert engine.metrics.steps[4][FREE_BLOCKS] == 14
    assert zero_decode_steps(engine) == 0
    assert log.splits[5:8] == [(2, 62), (2, 62), (2, 62)]
    assert sorted((r.id, r.finish_reason, r.preemptions) for r in engine.metrics.requests) == [
        ("0", "length", 0), ("1", "length", 0), ("2", "length", 1)
    ]


# --- the long-prompt burst (what it must show) ---------------------------------------------------


def burst_runs(rate_scale: float) -> dict[str, dict]:
    burst = build_workload("long-burst", seed=0, rate_scale=rate_scale)
    chats = Workload("chats", [it for it in burst.items if it.tenant == "chat"])
    out = {}
    for label, workload, plugins in (
        ("no burst", chats, ["decode_first"]),
        ("decode_first", burst, ["decode_first"]),
        ("prefill_first", burst, ["prefill_first"]),
    ):
        doc, _ = run_workload(workload, EngineConfig(plugins=plugins), SimulatedExecutor(make_cost_model("steps")))
        out[label] = doc
    out["requests"] = len(burst.items)
    return out


@pytest.fixture(scope="module")
def burst_1x():
    return burst_runs(1.0)


def test_decode_first_keeps_chat_itl_through_a_long_prompt_burst(burst_1x):
    base = burst_1x["no burst"]["tenants"]["chat"]["itl_s"]
    with_burst = burst_1x["decode_first"]["tenants"]["chat"]["itl_s"]
    assert with_burst["p99"] <= 2 * base["p99"]
    # the stronger form: no chat gap at all is longer than 2x the longest without the burst
    assert with_burst["max"] <= 2 * base["max"]
    assert burst_1x["decode_first"]["summary"]["zero_decode_steps"] == 0
    assert burst_1x["decode_first"]["summary"]["completed"] == burst_1x["requests"]  # every request ends


def test_prefill_first_shows_the_stall(burst_1x):
    doc = burst_1x["prefill_first"]
    base_max = burst_1x["no burst"]["tenants"]["chat"]["itl_s"]["max"]
    # the burst is 131072 prompt tokens = 64 budgets of 2048: decodes stop for most of them
    assert doc["summary"]["zero_decode_steps"] >= 32
    assert doc["tenants"]["chat"]["itl_s"]["max"] >= 32 * base_max
    assert doc["summary"]["completed"] == burst_1x["requests"]


def test_decode_first_at_1_1x_chat_capacity():
    # 256 slots / (256 output tokens x 0.01 s) = 100 chats/s; rate_scale 5.5 offers 110/s
    runs = burst_runs(5.5)
    base = runs["no burst"]["tenants"]["chat"]["itl_s"]
    assert runs["decode_first"]["tenants"]["chat"]["itl_s"]["p99"] <= 2 * base["p99"]
    assert runs["decode_first"]["summary"]["zero_decode_steps"] == 0
    assert runs["prefill_first"]["summary"]["zero_decode_steps"] >= 32


def test_decode_first_never_serves_zero_decodes_under_kv_pressure():
    # A small pool that forces preemption, both preemption modes: whenever a sequence is decoding,
    # the step serves at least one decode token.
    spec = SyntheticSpec(num_requests=150, rate=300.0, prompt_len={"dist": "uniform", "low": 16, "high": 600},
                         output_len={"dist": "uniform", "low": 1, "high": 120}, seed=3)
    workload = Workload("pressure", generate(spec, namespace="pressure"))
    for mode in ("recompute", "swap"):
        config = EngineConfig(num_blocks=96, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024,
                              preemption_mode=mode, swap_space_blocks=48, plugins=["decode_first"],
                              plugin_options={"decode_first": {"max_chunk": 64}})
        doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps")))
        assert doc["summary"]["preemptions"] > 0
        assert doc["summary"]["zero_decode_steps"] == 0
        assert doc["summary"]["completed"] == 150


def test_weighted_budget_bounds_every_step_of_a_linear_cost_model():
    cm = make_cost_model("linear")
    opts = weights_from_cost_model(cm, 0.02)
    spec = SyntheticSpec(num_requests=80, rate=200.0, prompt_len={"dist": "uniform", "low": 16, "high": 800},
                         output_len={"dist": "uniform", "low": 1, "high": 64}, seed=1)
    config = EngineConfig(plugins=["weighted_budget"], plugin_options={"weighted_budget": opts})
    doc, engine = run_workload(Workload("w", generate(spec)), config, SimulatedExecutor(cm))
    steps = engine.metrics.steps
    assert doc["summary"]["completed"] == 80
    for s in steps:
        assert opts["w_prefill"] * s[PREFILL_TOKENS] + opts["w_decode"] * s[DECODE_TOKENS] <= opts["capacity"] * (1 + 1e-9)
    # the constraint binds (a plain 2048-token budget would take far bigger prefill steps)
    assert max(s[PREFILL_TOKENS] for s in steps) == 127  # floor(0.011 / 8.6e-5) = floor(127.9)
