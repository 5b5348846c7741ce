"""`slo_classes`: interactive decodes every step within a reserved share, batch gets the rest."""

from __future__ import annotations

from collections import Counter

import pytest

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.manager import PluginManager
from metroline.core.plugins.preemption import Preempt
from metroline.core.requests.sequence import SeqState
from metroline.core.workloads.build import SyntheticSpec, Workload, WorkloadItem, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.plugins_contrib.slo_classes import SLOClasses

CLASSES = {"classes": {"chat": "interactive", "batch": "batch"}}


class DecodeCap:
    """A base split that gives decodes at most `cap` tokens a step (the rest to prefill)."""

    name = "decode_cap"

    def __init__(self, cap: int) -> None:
        self.cap = cap

    @hookimpl
    def split_budget(self, ctx, budget, num_decoding):
        decode = min(num_decoding, self.cap, budget)
        return Split(decode, budget - decode, ctx.config.prefill_chunk)


class PrefillGreedy:
    """A base split that gives the whole budget to prefill while any request waits."""

    name = "prefill_greedy"

    @hookimpl
    def split_budget(self, ctx, budget, num_decoding, num_waiting):
        decode = 0 if num_waiting else min(num_decoding, budget)
        return Split(decode, budget - decode, ctx.config.prefill_chunk)


class DecodeLog:
    """Per step: decode tokens per tenant, and which sequences of each tenant were decoding."""

    name = "decode_log"

    def __init__(self) -> None:
        self.served: list[Counter] = []
        self.wanting: list[Counter] = []

    @hookimpl
    def split_budget(self, ctx):
        self.wanting.append(Counter(s.tenant for s in ctx.running if s.is_decoding))

    @hookimpl
    def on_step_end(self, plan) -> None:
        self.served.append(Counter(s.tenant for s in plan.decodes))


def run(workload, plugins=("slo_classes",), options=CLASSES, observers=(), **config):
    loaded = "slo_classes" in plugins  # options for a plugin that is not loaded are an error
    cfg = EngineConfig(plugins=list(plugins), plugin_options={"slo_classes": dict(options)} if loaded else {}, **config)
    return run_workload(workload, cfg, SimulatedExecutor(make_cost_model("steps")), plugins=list(observers))


def twelve_at_once():
    """8 batch requests, then 4 interactive ones, all at t=0: 8-token prompts, 40 output tokens."""
    items = [WorkloadItem(0.0, ((("b", i), 8),), 40, tenant="batch") for i in range(8)]
    items += [WorkloadItem(0.0, ((("i", i), 8),), 40, tenant="chat") for i in range(4)]
    return Workload("twelve", items)


# --- decode share smaller than the running set ---------------------------------------------------


def test_interactive_decodes_every_step_while_batch_waits():
    """Base split: at most 4 decode tokens a step; 4 interactive and 8 batch requests decode. The
    interactive ones (which arrived last) are admitted first and get a token at every step; the
    batch ones get the share only when fewer than 4 interactive ones decode."""
    log = DecodeLog()
    doc, engine = run(twelve_at_once(), observers=[DecodeCap(4), log], max_num_seqs=16, max_num_batched_tokens=16)
    assert doc["summary"]["completed"] == 12
    rows = [(w["chat"], w["batch"], s["chat"], s["batch"]) for w, s in zip(log.wanting, log.served)]
    with_chat = [r for r in rows if r[0]]
    assert all(served == wanting for wanting, _, served, _ in with_chat)  # every step, all of them
    assert Counter(with_chat) == Counter({
        (2, 0, 2, 0): 1, (3, 0, 3, 0): 1,  # the interactive prompts are prefilled first
        (4, 1, 4, 0): 1, (4, 2, 4, 0): 1, (4, 4, 4, 0): 1, (4, 5, 4, 0): 1, (4, 7, 4, 0): 1,
        (4, 8, 4, 0): 32,  # 4 interactive decode, 8 batch wait
        (2, 8, 2, 2): 1, (1, 8, 1, 3): 1,  # the last interactive tokens: batch gets the rest
    })
    # then the batch requests take the whole share
    assert all(b_served == min(4, b_wanting) for c, b_wanting, _, b_served in rows if not c)
    chat = [r for r in engine.metrics.requests if r.tenant == "chat"]
    assert [round(r.token_times[-1] - r.token_times[0], 6) for r in chat] == [0.39] * 4  # 40 tokens, 39 steps
    t = doc["tenants"]
    assert t["chat"]["itl_s"]["max"] == pytest.approx(0.01)
    assert t["batch"]["itl_s"]["max"] == pytest.approx(0.74)


def test_without_slo_classes_the_batch_requests_take_the_share():
    log = DecodeLog()
    doc, _ = run(twelve_at_once(), plugins=(), observers=[DecodeCap(4), log], max_num_seqs=16,
                 max_num_batched_tokens=16)
    with_chat = [(w, s) for w, s in zip(log.wanting, log.served) if w["chat"]]
    assert sum(s["chat"] < w["chat"] for w, s in with_chat) == 75
    assert doc["tenants"]["chat"]["itl_s"]["max"] == pytest.approx(0.74)


def test_reserved_share_keeps_interactive_decodes_going_during_a_prefill_burst():
    """The base split gives the whole budget to prefill while requests wait; the reserve
    (ceil(0.25 * 32) = 8 tokens) keeps the 4 interactive decodes going at every step."""
    items = [WorkloadItem(0.0, ((("i", i), 8),), 60, tenant="chat") for i in range(4)]
    items += [WorkloadItem(0.05 + 0.01 * i, ((("b", i), 256),), 4, tenant="batch") for i in range(20)]
    log = DecodeLog()
    doc, _ = run(Workload("burst", items), observers=[PrefillGreedy(), log], max_num_seqs=32,
                 max_num_batched_tokens=32)
    assert doc["summary"]["completed"] == 24
    with_chat = [(w, s) for w, s in zip(log.wanting, log.served) if w["chat"]]
    assert len(with_chat) == 59 and all(s["chat"] == w["chat"] for w, s in with_chat)
    assert doc["tenants"]["chat"]["itl_s"]["max"] == pytest.approx(0.01)

    log = DecodeLog()
    doc, _ = run(Workload("burst", items), plugins=(), observers=[PrefillGreedy(), log], max_num_seqs=32,
                 max_num_batched_tokens=32)
    stalled = sum(1 for w, s in zip(log.wanting, log.served) if w["chat"] and not s["chat"])
    assert stalled > 100 and doc["tenants"]["chat"]["itl_s"]["max"] > 1.0


# --- a mixed workload ----------------------------------------------------------------------------


def mixed(seed=0):
    """600 requests at 1.1x the capacity of 32 slots (mean output 64 tokens): 30 % chat
    (interactive), 70 % batch; lognormal prompts (mean 256) and outputs (mean 64)."""
    spec = SyntheticSpec(
        num_requests=600, rate=1.1 * 32 / (64 * 0.01),
        prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.8, "min": 16, "max": 2048},
        output_len={"dist": "lognormal", "mean": 64, "sigma": 0.8, "min": 4, "max": 512},
        tenants={"chat": 0.3, "batch": 0.7}, seed=seed,
    )
    return Workload("mixed", generate(spec, namespace="slo-mixed"))


def test_interactive_tail_latency_is_lower_on_a_mixed_workload():
    doc, _ = run(mixed(), observers=[DecodeCap(16)], max_num_seqs=32, max_num_batched_tokens=256)
    chat, batch = doc["tenants"]["chat"], doc["tenants"]["batch"]
    assert doc["summary"]["completed"] == 600
    figures = {k: (round(chat[k]["p99"], 4), round(batch[k]["p99"], 4)) for k in ("tpot_s", "itl_s", "ttft_s")}
    # (interactive p99, batch p99) in seconds; without slo_classes: tpot (0.112, 0.1), itl (0.53,
    # 0.56), ttft (12.50, 12.53)
    assert figures == {"tpot_s": (0.01, 0.2257), "itl_s": (0.01, 0.6), "ttft_s": (0.4095, 12.1137)}
    assert chat["tpot_s"]["p99"] < batch["tpot_s"]["p99"]
    assert chat["itl_s"]["p99"] < batch["itl_s"]["p99"]


# --- victims -------------------------------------------------------------------------------------


class Ctx:
    def __init__(self, running):
        self.running = running


def seq(rid, tenant, state=SeqState.RUNNING):
    from metroline.core.requests.request import SamplingParams
    from metroline.core.requests.sequence import Sequence

    s = Sequence(rid, [1, 2, 3], SamplingParams(), 0.0, tenant=tenant)
    s.state = state
    return s


def victim_of(plugin, ctx, requester, base_answer):
    gen = plugin.select_victim(ctx=ctx, requester=requester)
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send(base_answer)
    return stop.value.value


def test_victim_is_the_last_admitted_batch_request_not_an_interactive_one():
    plugin = SLOClasses(**CLASSES)
    b1, b2, i1, i2 = seq("b1", "batch"), seq("b2", "batch"), seq("i1", "chat"), seq("i2", "chat")
    plugin.on_admitted(seqs=[b1, i1, b2, i2])
    ctx = Ctx({b1: None, i1: None, b2: None, i2: None}.keys())
    assert victim_of(plugin, ctx, i1, i2) is b2  # base picked an interactive: the last batch instead
    assert victim_of(plugin, ctx, i1, Preempt(i2, "swap")) == Preempt(b2, "swap")
    assert victim_of(plugin, ctx, i1, None) is b2  # None would preempt the interactive requester
    assert victim_of(plugin, ctx, b1, None) is None  # a batch requester may give way itself
    assert victim_of(plugin, ctx, i1, b1) is b1  # a batch victim stands
    waiting = seq("w", "chat", SeqState.WAITING)
    assert victim_of(plugin, ctx, waiting, None) is None  # the base leaves a waiting one waiting
    b2.state = SeqState.WAITING  # preempted earlier in this step (not reported yet)
    assert victim_of(plugin, ctx, i1, i2) is b1
    plugin.on_finished(seqs=[b1, b2])
    assert victim_of(plugin, ctx, i1, i2) is i2  # no batch request left: the base's answer


# --- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"classes": {"a": "gold"}}, r"plugin 'slo_classes': option 'classes.a': Input should be 'interactive' or 'batch'"),
    ({"classes": ["a"]}, r"option 'classes': Input should be a valid dictionary \(got \['a'\]\)"),
    ({"interactive_max_priority": "high"}, r"option 'interactive_max_priority': Input should be a valid integer"),
    ({"interactive_max_priority": 0, "interactive_decode_share": 1.5},
     r"option 'interactive_decode_share': Input should be less than or equal to 1 \(got 1.5\)"),
    ({"interactive_max_priority": 0, "default_class": "gold"}, r"option 'default_class': Input should be"),
])
def test_bad_options_name_the_option_and_the_limit(options, message):
    with pytest.raises(ValueError, match=message):
        SLOClasses(**options)
    with pytest.raises(PluginLoadError, match="slo_classes"):
        PluginManager(EngineConfig(plugins=["slo_classes"], plugin_options={"slo_classes": options}))


def test_class_from_tenant_then_priority_then_default():
    default = SLOClasses()
    high, low = seq("h", "x"), seq("l", "x")
    low.priority = 1
    assert default.is_interactive(high) and not default.is_interactive(low)
    assert not SLOClasses(interactive_max_priority=None).is_interactive(high)
    p = SLOClasses(classes={"a": "batch"}, interactive_max_priority=0)
    assert [p.is_interactive(seq(r, t)) for r, t in (("1", "a"), ("2", "b"))] == [False, True]
    s = seq("3", "b")
    s.priority = 1
    assert not p.is_interactive(s)
    assert SLOClasses(classes={"a": "batch"}, default_class="interactive").is_interactive(s)


def test_conforms_with_tenant_classes_on_the_priority_policy():
    from metroline.testing import check_plugin

    report = check_plugin("slo_classes", base="priority", options={
        "classes": {"alpha": "interactive"}, "interactive_max_priority": None, "interactive_decode_share": 0.5,
    })
    assert len(report.runs) == 6
