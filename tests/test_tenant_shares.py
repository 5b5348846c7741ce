"""Per-tenant budget shares (`Split.shares`, `metroline.core.step.reserves`) and the `tenant_shares` plugin: a
reserved tenant gets at least its share of every step's tokens while it has work, what it leaves
goes to the others, and an answer whose shares exceed the budget is a `PluginError` naming the
plugin and the hook."""

from __future__ import annotations

import math
import random

import pytest
from conftest import assert_pool_drained, live_tables, make_engine, request, run_to_end

from metroline.core.errors import PluginError
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.sequence import SeqState
from metroline.plugins_contrib.tenant_shares import TenantShares
from metroline.testing import ConformanceError, check_plugin

SHARE = 0.5
SPEC = "metroline.plugins_contrib.tenant_shares:TenantShares"


class StepSpy:
    """Registered last (the outermost wrapper): sees the final `Split` of each step and, at that
    moment (before anything is scheduled), each tenant's work; `on_step_end` gets the plan."""

    name = "step_spy"

    def __init__(self) -> None:
        self.steps: list[dict] = []

    @hookimpl(wrapper=True)
    def split_budget(self, ctx):
        split = Split(*(yield))
        chunk = min(split.max_chunk, ctx.config.prefill_chunk)
        demand = {}
        for seq in ctx.running:
            d = demand.setdefault(seq.tenant, [0, 0])
            if seq.is_decoding:
                d[0] += 1
            else:
                d[1] += min(seq.num_uncomputed_tokens, chunk)
        for seq in ctx.waiting:
            demand.setdefault(seq.tenant, [0, 0])[1] += min(seq.num_uncomputed_tokens, chunk)
        self.steps.append({"split": split, "demand": demand})
        return split

    @hookimpl
    def on_step_end(self, plan):
        got = {}
        for seq, n in plan.scheduled.items():
            g = got.setdefault(seq.tenant, [0, 0])
            g[0 if seq in plan.decodes else 1] += n
        self.steps[-1]["got"] = got
        self.steps[-1]["preempted"] = len(plan.preempted)


def overloaded(engine, seed: int = 0, n: int = 240) -> None:
    """Requests of three tenants arriving faster than they are served; enterprise is a minority."""
    rng = random.Random(seed)
    t = 0.0
    for i in range(n):
        t += rng.expovariate(400.0)
        tenant = rng.choices(["enterprise", "free", "batch"], [0.2, 0.5, 0.3])[0]
        engine.add_request(request(f"r{i}", rng.randint(8, 160), max_new=rng.randint(4, 80), tenant=tenant,
                                   arrival_time=t))


def run(engine) -> None:
    """Step to the end (the clock jumps to the next arrival over an empty step), checking the KV
    invariants after every step."""
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
        if engine.last_plan_empty:
            engine.idle()
    assert_pool_drained(engine)


def shares_engine(*plugins):
    # a pool and a slot count that never bind: only the token budget limits a step
    spy = StepSpy()
    engine = make_engine(
        plugins=[*plugins, spy], policy="fcfs", block_size=16, num_blocks=4096, max_num_seqs=512,
        max_num_batched_tokens=64, max_model_len=512,
    )
    return engine, spy


def test_the_reserved_tenant_gets_its_share_in_every_step_it_has_work_and_others_use_the_rest():
    engine, spy = shares_engine(TenantShares({"enterprise": SHARE}))
    overloaded(engine)
    run(engine)
    short_steps = 0
    for step in spy.steps:
        if "got" not in step:
            continue  # an empty step
        split, demand, got = step["split"], step["demand"], step["got"]
        assert step["preempted"] == 0  # the scenario's pool never binds
        want = demand.get("enterprise", [0, 0])
        mine = got.get("enterprise", [0, 0])
        # at least its share of each part of the budget, or all it could compute
        assert mine[0] >= min(math.floor(SHARE * split.decode), want[0]), step
        assert mine[1] >= min(math.floor(SHARE * split.prefill), want[1]), step
        # nothing is lost: the step computes all it can, whoever the reserve was for
        all_decode = sum(d[0] for d in demand.values())
        all_prefill = sum(d[1] for d in demand.values())
        assert sum(g[0] for g in got.values()) == min(split.decode, all_decode), step
        assert sum(g[1] for g in got.values()) == min(split.prefill, all_prefill), step
        if want[1] < math.floor(SHARE * split.prefill) and all_prefill > split.prefill:
            short_steps += 1  # enterprise left part of its reserve: the others took it
    assert short_steps > 0, "the workload never tested the release of an unused reserve"


def test_without_the_reserve_the_same_workload_starves_the_minority_tenant():
    """The guarantee above is the plugin's doing: under plain fcfs enterprise falls below its
    share in some step where it had work."""
    engine, spy = shares_engine()
    overloaded(engine)
    run(engine)
    below = [
        s for s in spy.steps if "got" in s
        and s["got"].get("enterprise", [0, 0])[1] < min(math.floor(SHARE * s["split"].prefill), s["demand"].get("enterprise", [0, 0])[1])
    ]
    assert below


class FixedShares:
    """A split_budget answer with the given shares (and the default split)."""

    name = "fixed_shares"

    def __init__(self, shares) -> None:
        self.shares = shares

    @hookimpl
    def split_budget(self, budget, num_decoding):
        decode = min(budget, num_decoding)
        return Split(decode, budget - decode, budget, None, self.shares)


class SharesWrapper:
    """A wrapper that adds the given shares to the answer below it."""

    name = "shares_wrapper"

    def __init__(self, shares) -> None:
        self.shares = shares

    @hookimpl(wrapper=True)
    def split_budget(self):
        return Split(*(yield))._replace(shares=self.shares)


BAD_SHARES = [
    pytest.param({"a": 0.7, "b": 0.6}, "sum to 1.3", id="over-one"),
    pytest.param({"a": -0.1}, "[0, 1]", id="negative"),
    pytest.param({"a": float("nan")}, "[0, 1]", id="nan"),
    pytest.param({"a": 2}, "[0, 1]", id="above-the-budget"),
    pytest.param([("a", 0.5)], "mapping", id="not-a-mapping"),
    pytest.param({1: 0.5}, "strings", id="tenant-not-a-string"),
]


@pytest.mark.parametrize("shares, problem", BAD_SHARES)
@pytest.mark.parametrize("kind", [FixedShares, SharesWrapper])
def test_an_answer_whose_shares_exceed_the_budget_names_the_plugin_and_the_hook(kind, shares, problem):
    engine = make_engine(plugins=[kind(shares)])
    engine.add_request(request("a", 8, tenant="a"))
    with pytest.raises(PluginError) as err:
        run_to_end(engine)
    assert err.value.plugin == kind.name and err.value.hook == "split_budget"
    assert problem in str(err.value)


def test_the_conformance_suite_fails_an_over_budget_share_and_passes_tenant_shares():
    with pytest.raises(ConformanceError, match=r"PluginError.*fixed_shares.*split_budget"):
        check_plugin(FixedShares({"alpha": 0.8, "beta": 0.8}), modes=("recompute",))
    # a pool that forces preemption, in both modes, shares summing to 1, on two base policies
    check_plugin(SPEC, options={"shares": {"alpha": 0.3, "beta": 0.3, "burst": 0.4}})
    check_plugin(SPEC, options={"shares": {"gamma": 1.0}}, base="priority")


def test_tenant_shares_refuses_bad_options():
    with pytest.raises(ValueError, match=r"plugin 'tenant_shares': option 'shares': Split.shares sum to 1.3"):
        TenantShares({"enterprise": 0.8, "free": 0.5})
    with pytest.raises(ValueError, match=r"plugin 'tenant_shares': option 'shares.enterprise': .*greater than or equal to 0"):
        TenantShares({"enterprise": -1})


class CountingArrivals:
    """Admission in arrival order, counting the candidates pulled at each step."""

    name = "counting_arrivals"

    def __init__(self) -> None:
        self.pulled: list[int] = []

    @hookimpl
    def admission(self, ctx):
        self.pulled.append(0)

        def gen():
            for s in list(ctx.waiting):
                self.pulled[-1] += 1
                yield s

        return gen()


def test_a_spent_budget_ends_admission_with_a_reserve_still_outstanding():
    """Budget 8, all prefill (nothing runs yet), shares 0.5 and 0.5: 4 prefill tokens reserved for
    each tenant. The first candidate (tenant `ent`, 8 prompt tokens) takes the whole budget, more
    than its reserve (a reserved tenant may); `big`'s reserve is still outstanding, but with no
    token left the step pulls no further candidate: `b` waits for the next step."""
    counter = CountingArrivals()
    engine = make_engine(plugins=[FixedShares({"ent": 0.5, "big": 0.5}), counter], policy="fcfs",
                         max_num_batched_tokens=8)
    engine.add_request(request("e", 8, max_new=2, tenant="ent"))
    engine.add_request(request("b", 4, max_new=2, tenant="big"))
    engine.step()
    (e,), (b,) = engine.sequences("e"), engine.sequences("b")
    assert counter.pulled == [1]
    assert engine.executor.plans[0].scheduled == {e.seq_id: 8}
    assert b.num_computed_tokens == 0 and b in engine.scheduler.waiting
    run_to_end(engine)
    assert e.num_output_tokens == b.num_output_tokens == 2
    assert_pool_drained(engine)


class WaitingThenSwapped:
    """Once `on`: admission offers the waiting requests, then the swapped ones; and the split is
    4 decode and 8 prefill tokens with all the prefill reserved for tenant `ent`."""

    name = "waiting_then_swapped"
    on = False

    @hookimpl
    def admission(self, ctx):
        if self.on:
            return [*ctx.waiting, *ctx.swapped]
        return None

    @hookimpl
    def split_budget(self, budget):
        if self.on:
            return Split(4, 8, 8, None, {"ent": 1.0})
        return None


def test_a_held_candidate_that_stops_admission_ends_it_before_later_candidates():
    """`o` (another tenant's) comes first but is held: all 8 prefill tokens are `ent`'s reserve.
    `e` (tenant `ent`, 8 tokens) uses the reserve, and the held `o` then finds no prefill token
    left: admission stops there, as it would on any candidate that stops it. `b`, a swapped
    decode offered after them, is not brought back in this step, though 4 decode tokens and the
    blocks for it are left."""
    plugin = WaitingThenSwapped()
    engine = make_engine(num_blocks=8, preemption_mode="swap", swap_space_blocks=8, plugins=[plugin])
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("b", 8, max_new=12, tenant="other"))
    for _ in range(10):
        engine.step()
    (b,) = engine.sequences("b")
    assert b.state is SeqState.SWAPPED and b.is_decoding
    assert engine.abort("A") is True  # the device blocks are all free again
    engine.add_request(request("o", 8, max_new=2, tenant="other"))
    engine.add_request(request("e", 8, max_new=2, tenant="ent"))
    plugin.on = True
    engine.step()
    plan = engine.executor.plans[-1]
    (e,), (o,) = engine.sequences("e"), engine.sequences("o")
    assert plan.admitted == [e.seq_id] and plan.scheduled == {e.seq_id: 8}
    assert b.state is SeqState.SWAPPED and o.state is SeqState.WAITING
    plugin.on = False
    run_to_end(engine)
    assert [engine.sequences(r)[0].num_output_tokens for r in ("b", "o", "e")] == [12, 2, 2]
    assert_pool_drained(engine)
