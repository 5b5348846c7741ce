"""`tenant_quota`: running caps and token buckets per tenant, wrapped around any base policy."""

from __future__ import annotations

from collections import Counter

import pytest

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.manager import PluginManager
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import SyntheticSpec, Workload, WorkloadItem, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.plugins_contrib.tenant_quota import TenantQuota


class Census:
    """Records, at every step, how many sequences of each tenant run (the running set of the step,
    including those that finish in it) and how many wait."""

    name = "census"

    def __init__(self) -> None:
        self.rows: list[tuple[Counter, Counter]] = []

    @hookimpl
    def on_step_end(self, ctx, plan) -> None:
        self.rows.append((Counter(s.tenant for s in ctx.running), Counter(s.tenant for s in ctx.waiting)))


class Ledger:
    """An independent account of what `tenant_quota` charges: (time, kind, tokens) in event order,
    for one tenant: the prompt at the first admission, one token per generated token."""

    name = "ledger"

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.events: list[tuple[float, str, int]] = []
        self._seen: set = set()

    @hookimpl
    def on_admitted(self, ctx, seqs) -> None:
        for s in seqs:
            if s.tenant == self.tenant and s not in self._seen:
                self._seen.add(s)
                self.events.append((ctx.now, "prompt", s.num_prompt_tokens))

    @hookimpl
    def on_tokens(self, ctx, seqs) -> None:
        n = sum(1 for s in seqs if s.tenant == self.tenant)
        if n:
            self.events.append((ctx.now, "tokens", n))


def run(workload, observers, *, policy="fcfs", plugins=("tenant_quota",), options=None, **config):
    cfg = EngineConfig(policy=policy, plugins=list(plugins), plugin_options=options or {}, **config)
    return run_workload(workload, cfg, SimulatedExecutor(make_cost_model("steps")), plugins=observers)


def two_tenants(num_requests=60, rate=None, seed=1, prompt_len=32):
    spec = SyntheticSpec(
        num_requests=num_requests, rate=rate, prompt_len=prompt_len,
        output_len={"dist": "uniform", "low": 4, "high": 40}, tenants={"a": 0.5, "b": 0.5}, seed=seed,
    )
    return Workload("two-tenants", generate(spec, namespace="tq"))


# --- running cap ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["fcfs", "static"])
def test_cap_holds_at_every_step_and_the_other_tenant_takes_the_rest(policy):
    census = Census()
    doc, engine = run(two_tenants(), [census], policy=policy, max_num_seqs=8,
                      options={"tenant_quota": {"max_running": {"a": 2}}})
    assert doc["summary"]["completed"] == 60
    assert max(running["a"] for running, _ in census.rows) == 2  # the cap, reached and never passed
    if policy == "fcfs":
        # while b still has requests waiting, every slot a does not use is b's
        busy = [(r["a"], r["b"]) for r, w in census.rows if w["b"] > 0]
        assert busy and all(a + b == 8 for a, b in busy)
        # and while a has requests waiting, it runs exactly its cap (the cap limits, never idles a)
        a_waits = [r["a"] for r, w in census.rows if w["a"] > 0]
        assert a_waits and set(a_waits) == {2}
    quota = engine.plugins.get("tenant_quota")
    assert quota.running == {"a": 0, "b": 0} and not quota._slots


def test_without_the_quota_a_takes_more_slots():
    census = Census()
    doc, _ = run(two_tenants(), [census], plugins=(), max_num_seqs=8)
    assert doc["summary"]["completed"] == 60
    assert max(r["a"] for r, _ in census.rows) > 2  # above the cap the other tests set


def test_default_cap_applies_to_unnamed_tenants():
    spec = SyntheticSpec(num_requests=90, prompt_len=16, output_len=12,
                         tenants={"a": 1, "b": 1, "c": 1}, seed=3)
    census = Census()
    doc, _ = run(Workload("three", generate(spec, namespace="tq3")), [census], max_num_seqs=16,
                 options={"tenant_quota": {"max_running": {"a": 5}, "default_max_running": 3}})
    assert doc["summary"]["completed"] == 90
    assert max(r["a"] for r, _ in census.rows) == 5
    assert max(r["b"] for r, _ in census.rows) == 3
    assert max(r["c"] for r, _ in census.rows) == 3


def test_parallel_samples_count_against_the_cap():
    census = Census()
    cfg = EngineConfig(policy="fcfs", plugins=["tenant_quota"], max_num_seqs=16,
                       plugin_options={"tenant_quota": {"max_running": {"a": 4}}})
    engine = Engine(cfg, plugins=[census])
    for i in range(6):
        engine.add_request(Request(
            request_id=f"r{i}", tenant="a", prompt_token_ids=[i + 1] * 20, arrival_time=0.0,
            sampling=SamplingParams(max_new_tokens=5, n=3, ignore_eos=True),
        ))
    engine.run()
    assert max(r["a"] for r, _ in census.rows) == 3  # one 3-sample request at a time: 3 + 3 > 4
    assert engine.plugins.get("tenant_quota").running == {"a": 0}


# --- token rate ----------------------------------------------------------------------------------


def worst_window_excess(events, rate):
    """max over admissions k and windows [t_j, t_k] of (tokens charged in the window) - rate*(t_k -
    t_j): the bucket guarantees it is at most `burst`. Events are in charge order."""
    worst = float("-inf")
    prefix = [0]
    for _, _, n in events:
        prefix.append(prefix[-1] + n)
    for k, (tk, kind, _) in enumerate(events):
        if kind != "prompt":
            continue
        for j in range(k + 1):
            tj = events[j][0]
            worst = max(worst, prefix[k + 1] - prefix[j] - rate * (tk - tj))
    return worst


def test_token_rate_holds_over_every_window_up_to_one_burst():
    rate, burst = 300.0, 400
    ledger = Ledger("a")
    workload = two_tenants(num_requests=80, rate=40.0, seed=2)
    doc, engine = run(workload, [ledger], max_num_seqs=16,
                      options={"tenant_quota": {"token_rate": {"a": rate}, "burst": burst}})
    s = doc["summary"]
    assert s["completed"] == 80 and s["preemptions"] == 0
    excess = worst_window_excess(ledger.events, rate)
    assert excess <= burst + 1e-6
    assert excess > burst - 32  # the limit binds: within one prompt of a full burst
    # the ledger charged each of a's requests once, its prompt and every output token (no
    # preemption): the workload's own account of a's requests
    a_items = [it for it in workload.items if it.tenant == "a"]
    prompts = sum(1 for _, kind, _ in ledger.events if kind == "prompt")
    assert prompts == len(a_items)
    assert sum(n for _, _, n in ledger.events) == sum(it.prompt_len + it.output_len for it in a_items)
    # a's token rate over its whole span stays near the limit, b is not slowed
    a, b = doc["tenants"]["a"], doc["tenants"]["b"]
    assert a["queue_s"]["max"] > 1.0 and b["queue_s"]["max"] < 0.05


def test_without_the_rate_the_same_workload_exceeds_it():
    ledger = Ledger("a")
    run(two_tenants(num_requests=80, rate=40.0, seed=2), [ledger], plugins=(), max_num_seqs=16)
    assert worst_window_excess(ledger.events, 300.0) > 2 * 400


def test_rated_tenant_waits_for_the_bucket_to_refill():
    """burst 100 at 100 tokens/s, prompts of 64 and 2 output tokens, all at t=0 (steps of 0.01 s).
    r0 is admitted at 0 (100 - 64 = 36 left) and its 2 tokens leave 35 (+1 refilled at 0.01);
    r1 needs 64: the bucket reaches it at 0.30, r1's 2 tokens leave it at -1 (+1 at 0.31), so r2
    is admitted at 0.96. Nothing runs in between: the replay idles to `ctx.wake_at`."""
    items = [WorkloadItem(0.0, ((("tq-refill", i), 64),), 2, tenant="a") for i in range(3)]
    doc, engine = run(Workload("refill", items), [],
                      options={"tenant_quota": {"token_rate": {"a": 100}, "burst": 100}})
    first = {r.id: r.first_scheduled_s for r in engine.metrics.requests}
    assert first["0"] == 0.0
    assert first["1"] == pytest.approx(0.30)
    assert first["2"] == pytest.approx(0.96)
    assert doc["summary"]["steps"] == 3 * 2  # each request: its prompt and first token, one decode


# --- wrapping any base answer --------------------------------------------------------------------


class ListPolicy:
    """A base policy that answers a plain list (head-of-line by the hook's contract)."""

    name = "list_policy"

    @hookimpl
    def admission(self, ctx):
        return list(ctx.waiting)


def test_wraps_a_plain_iterable_and_keeps_head_of_line():
    census = Census()
    cfg = EngineConfig(policy="tenant_quota", max_num_seqs=8,
                       plugin_options={"tenant_quota": {"max_running": {"a": 2}}})
    wl = two_tenants()
    doc, _ = run_workload(wl, cfg, SimulatedExecutor(make_cost_model("steps")), plugins=[ListPolicy(), census])
    assert doc["summary"]["completed"] == 60
    assert max(r["a"] for r, _ in census.rows) == 2


def test_keeps_the_base_head_of_line_flag_and_closes_the_base_iterator():
    closed = []

    def base():
        try:
            yield from []
        finally:
            closed.append(True)

    quota = TenantQuota(max_running={"a": 1})

    class Ctx:
        now = 0.0

    gen = quota.admission(Ctx())
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send(Candidates(base(), head_of_line=False))
    answer = stop.value.value
    assert isinstance(answer, Candidates) and answer.head_of_line is False
    it = iter(answer)
    assert list(it) == [] and closed == [True]


@pytest.mark.parametrize("options, message", [
    ({"max_running": {"a": 0}}, "plugin 'tenant_quota': option 'max_running.a': Input should be greater than or equal to 1 (got 0)"),
    ({"max_running": [1]}, "option 'max_running': Input should be a valid dictionary (got [1])"),
    ({"default_max_running": 1.5}, "option 'default_max_running': Input should be a valid integer (got 1.5)"),
    ({"token_rate": {"a": -1}}, "option 'token_rate.a': Input should be greater than 0 (got -1)"),
    ({"burst": 0}, "option 'burst': Input should be greater than 0 (got 0)"),
])
def test_bad_options_name_the_option_and_the_limit(options, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        TenantQuota(**options)
    with pytest.raises(PluginLoadError, match="tenant_quota"):
        PluginManager(EngineConfig(plugins=["tenant_quota"], plugin_options={"tenant_quota": options}))


def test_conforms_with_caps_and_rates_on_the_priority_policy():
    from metroline.testing import check_plugin

    report = check_plugin("tenant_quota", base="priority", options={
        "max_running": {"alpha": 3}, "default_max_running": 6, "token_rate": {"beta": 2000}, "burst": 800,
    })
    assert len(report.runs) == 6
