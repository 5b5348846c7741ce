"""Bad plugin answers and raising plugins: each is a `PluginError` naming the plugin that gave the
answer and the hook, the step's requests end as failed with their blocks freed, and the engine
serves on (issue 7, findings 5, 7 and 11)."""

from __future__ import annotations

import inspect
import math

import pytest
from conftest import RecordingExecutor, assert_pool_drained, make_engine, request, run_to_end

from metroline.core.errors import PluginError, PluginLoadError, RequestRefused
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.preemption import Preempt
from metroline.core.requests.sequence import FinishReason
from metroline.policies.fcfs import FCFS
from metroline.policies.priority import Priority
from metroline.policies.srpt import SRPT
from metroline.policies.token_rr import TokenRoundRobin
from metroline.policies.weighted_fair import WeightedFair

VOCAB = 32000


class VocabExecutor(RecordingExecutor):
    vocab_size = VOCAB


def _prompt(i: int, n: int = 8) -> list[int]:
    return [100 * i + k + 1 for k in range(n)]


def _pressured(plugins, policy="fcfs", n=4, max_new=12):
    """`n` requests of 8 prompt tokens and `max_new` outputs in a 10-block pool of 4-token blocks:
    each needs 5 blocks at the end, so victims are chosen."""
    engine = make_engine(plugins=plugins, num_blocks=10, enable_prefix_caching=False, policy=policy,
                         executor=VocabExecutor())
    for i in range(n):
        engine.add_request(request(f"r{i}", _prompt(i), max_new=max_new))
    return engine


def _serve_on(engine, max_steps=2000):
    """Step to the end with the pool invariants checked at every step; every request ended."""
    run_to_end(engine, max_steps=max_steps)
    assert_pool_drained(engine)
    seqs = [s for rid in list(engine.intake.requests) for s in engine.sequences(rid)]
    assert all(s.is_finished for s in seqs)
    return seqs


class OnceBad:
    """Answers `hook` with `value` at its first call, then lets the next plugin answer."""

    name = "bad"

    def __init__(self, hook: str, value):
        self.calls = 0
        self.value = value

        def impl(**kwargs):
            self.calls += 1
            return self.value if self.calls == 1 else None

        impl.__name__ = hook
        params = {"admission": "ctx", "order_running": "running", "split_budget": "budget", "sample": "seqs",
                  "select_victim": "requester", "estimate_output_tokens": "seq"}[hook]
        fn = eval(f"lambda {params}: impl({params}={params})", {"impl": impl})  # pluggy reads the arg names
        fn.__name__ = hook
        setattr(self, hook, hookimpl(fn))


BAD_ANSWERS = [
    ("admission", 5, "expected an iterable"),
    ("admission", "abc", "expected an iterable"),
    ("admission", [5], "yielded 5, not a Sequence"),
    ("admission", [None], "yielded None, not a Sequence"),
    ("order_running", 5, "expected an iterable"),
    ("order_running", "abc", "expected an iterable"),
    ("split_budget", Split(1.0, 2.0, 3.0), "Split.decode must be an int, got 1.0"),
    ("split_budget", Split(0, math.nan, 8), "Split.prefill must be an int, got nan"),
    ("split_budget", (1, 2), "expected Split"),
    ("split_budget", Split(0, 8, 8, 1.5), "Split.max_prefills must be an int"),
    ("select_victim", 5, "expected a running Sequence or Preempt"),
    ("select_victim", Preempt(5, "swap"), "expected a running Sequence or Preempt"),
    ("sample", [None], "token ids must be ints, got None"),
    ("sample", ["a"], "token ids must be ints, got 'a'"),
    ("sample", [1.0], "token ids must be ints, got 1.0"),
    ("sample", [True], "token ids must be ints, got True"),
    ("sample", [-1], "token id -1 is outside [0, 32000)"),
    ("sample", [VOCAB], "token id 32000 is outside [0, 32000)"),
    ("sample", (5,), "expected a list of 1 token ids"),
    ("estimate_output_tokens", -5, "expected an int >= 0, got -5"),
    ("estimate_output_tokens", 2.5, "expected an int >= 0, got 2.5"),
    ("estimate_output_tokens", "x", "expected an int >= 0, got 'x'"),
]


@pytest.mark.parametrize("hook, value, problem", BAD_ANSWERS, ids=[f"{h}-{v!r}" for h, v, _ in BAD_ANSWERS])
def test_a_bad_answer_names_the_plugin_and_the_engine_serves_on(hook, value, problem):
    bad = OnceBad(hook, value)
    # one request makes `sample` answer for one sequence; srpt asks for estimates
    engine = _pressured([bad], policy="srpt" if hook == "estimate_output_tokens" else "fcfs",
                        n=1 if hook == "sample" else 4)
    with pytest.raises(PluginError) as info:
        run_to_end(engine, max_steps=500)
    assert (info.value.plugin, info.value.hook) == ("bad", hook)
    assert problem in info.value.problem
    assert bad.calls >= 1
    seqs = _serve_on(engine)
    reasons = {s.finish_reason for s in seqs}
    assert reasons <= {FinishReason.LENGTH, FinishReason.FAILED}
    failed = [s for s in seqs if s.finish_reason is FinishReason.FAILED]
    assert all("PluginError" in s.error and "'bad'" in s.error for s in failed)
    if hook != "estimate_output_tokens":  # srpt asks before the step: nothing was in flight yet
        assert failed, "the interrupted step's requests are failed"


@pytest.mark.parametrize("hook", ["admission", "order_running", "split_budget", "select_victim", "sample"])
def test_a_wrapper_that_raises_is_named(hook):
    class BadWrap:
        name = "badwrap"
        raised = False

    def impl(self):
        answer = yield
        if not BadWrap.raised:
            BadWrap.raised = True
            raise ValueError("oops")
        return answer

    impl.__name__ = hook
    setattr(BadWrap, hook, hookimpl(wrapper=True)(impl))
    engine = _pressured([BadWrap()])
    with pytest.raises(PluginError) as info:
        run_to_end(engine, max_steps=500)
    assert (info.value.plugin, info.value.hook) == ("badwrap", hook)
    assert info.value.problem == "wrapper raised ValueError: oops"
    _serve_on(engine)


def test_a_wrapper_answer_of_the_wrong_type_is_its_own():
    class Five:
        name = "five"

        @hookimpl(wrapper=True)
        def order_running(self):
            yield
            return 5

    engine = _pressured([Five()])
    engine.step()  # admits: order_running is asked from the second step on
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("five", "order_running")


def test_an_estimate_error_is_not_blamed_on_srpt():
    engine = _pressured([OnceBad("estimate_output_tokens", -5)], policy="srpt")
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("bad", "estimate_output_tokens")


# --- observers: a policy that misses an event leaves no request behind ---------------------------


def _flaky(cls, hook):
    """A subclass of policy `cls` whose `hook` raises at its first call before the policy sees the
    event (so the policy misses it), then delegates to the policy."""
    parent = getattr(cls, hook, None)

    class Flaky(cls):
        name = "flaky"
        raised = False

    def forward(self, **kwargs):
        if not Flaky.raised:
            Flaky.raised = True
            raise RuntimeError("missed")
        if parent is not None:
            names = inspect.signature(parent).parameters
            parent(self, **{k: v for k, v in kwargs.items() if k in names})

    if hook == "on_step_end":
        def impl(self, ctx, plan):
            forward(self, ctx=ctx, plan=plan)
    else:
        def impl(self, ctx, seqs):
            forward(self, ctx=ctx, seqs=seqs)
    impl.__name__ = hook
    setattr(Flaky, hook, hookimpl(impl))
    return Flaky


OBSERVERS = ["on_arrival", "on_admitted", "on_preempted", "on_tokens", "on_finished", "on_step_end"]


@pytest.mark.parametrize("policy", [FCFS, Priority, SRPT, WeightedFair, TokenRoundRobin], ids=lambda c: c.__name__)
@pytest.mark.parametrize("hook", OBSERVERS)
def test_a_policy_that_missed_an_event_orphans_no_request(policy, hook):
    flaky = _flaky(policy, hook)()
    engine = _pressured([flaky], n=5)
    errors = 0
    while engine.has_unfinished():
        try:
            engine.step()
        except PluginError as err:
            assert (err.plugin, err.hook) == ("flaky", hook)
            assert "raised RuntimeError: missed" in err.problem
            errors += 1
        assert engine.executor.now() < 50, "the engine does not finish"
    assert errors == 1
    seqs = _serve_on(engine)
    failed = [s for s in seqs if s.finish_reason is FinishReason.FAILED]
    assert {s.finish_reason for s in seqs} <= {FinishReason.LENGTH, FinishReason.FAILED}
    if hook == "on_finished":
        assert not failed  # the reap had freed them already: no step was interrupted
    else:
        assert failed
    assert len(engine.metrics.requests) == 5  # every request recorded once


def test_an_observer_error_still_reaches_the_other_plugins():
    heard = []

    class Raises:
        name = "raises"

        @hookimpl
        def on_arrival(self, seqs):
            raise KeyError("x")

    class Listens:
        name = "listens"

        @hookimpl
        def on_arrival(self, seqs):
            heard.extend(s.request_id for s in seqs)

    # pluggy calls later registrations first: Raises runs before Listens
    engine = make_engine(plugins=[Listens(), Raises()])
    engine.add_request(request("a", 4))
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("raises", "on_arrival")
    assert heard == ["a"]


def test_a_sample_error_fails_the_request_and_frees_its_block():
    class SampleOnce:
        name = "sampler"
        calls = 0

        @hookimpl
        def sample(self, seqs):
            SampleOnce.calls += 1
            if SampleOnce.calls == 1:
                raise ZeroDivisionError("bad row")

    engine = make_engine(plugins=[SampleOnce()])
    engine.add_request(request("a", 4, max_new=3))
    engine.add_request(request("b", 4, max_new=3, arrival_time=1.0))
    with pytest.raises(PluginError):
        engine.step()
    (a,) = engine.sequences("a")
    assert a.finish_reason is FinishReason.FAILED and a.block_table == []
    assert engine.pool.num_used_blocks() == 0
    engine.executor.idle_until(1.0)
    run_to_end(engine)
    (b,) = engine.sequences("b")
    assert b.finish_reason is FinishReason.LENGTH and b.num_output_tokens == 3


# --- requests that could never run ----------------------------------------------------------------


def test_tenant_quota_refuses_n_above_the_tenant_cap():
    engine = make_engine(specs=["tenant_quota"], plugin_options={"tenant_quota": {"max_running": {"a": 1}}})
    with pytest.raises(RequestRefused) as info:
        engine.add_request(request("x", 4, n=2, tenant="a"))
    assert str(info.value) == (
        "request 'x' can never run: tenant_quota: sampling.n (2) exceeds the running cap of tenant 'a' (1)"
    )
    assert not engine.has_unfinished()
    engine.add_request(request("y", 4, n=2, tenant="b"))  # no cap for b
    engine.add_request(request("z", 4, n=1, tenant="a"))
    run_to_end(engine)
    assert [s.num_output_tokens for s in engine.sequences("y")] == [4, 4]


def test_a_check_request_answer_that_is_not_a_reason_is_a_plugin_error():
    class Five:
        name = "five"

        @hookimpl
        def check_request(self, seq):
            return 5

    engine = make_engine(plugins=[Five()])
    with pytest.raises(PluginError) as info:
        engine.add_request(request("x", 4))
    assert (info.value.plugin, info.value.hook) == ("five", "check_request")


class RefuseEverything:
    """A `check_request` wrapper that refuses every request, whatever the plugins below say."""

    name = "refuse_everything"

    def __init__(self) -> None:
        self.below = []

    @hookimpl(wrapper=True)
    def check_request(self, seq):
        reason = yield
        self.below.append((seq.request_id, reason))
        return f"closed to {seq.request_id}"


class LetAnyoneIn:
    """A `check_request` wrapper that overrules every refusal below it."""

    name = "let_anyone_in"

    @hookimpl(wrapper=True)
    def check_request(self, seq):
        yield
        return None


def test_a_refusing_check_request_wrapper_refuses_and_is_named():
    wrapper = RefuseEverything()
    engine = make_engine(plugins=[wrapper])
    with pytest.raises(RequestRefused) as info:
        engine.add_request(request("x", 4))
    assert str(info.value) == "request 'x' can never run: refuse_everything: closed to x"
    assert wrapper.below == [("x", None)]  # the plugins below accepted it
    assert not engine.has_unfinished()


def test_a_check_request_wrapper_sees_the_reason_below_and_passes_it_on_named_by_its_plugin():
    class PassOn:
        name = "pass_on"

        def __init__(self) -> None:
            self.seen = []

        @hookimpl(wrapper=True)
        def check_request(self, seq):
            reason = yield
            self.seen.append(reason)
            return reason

    passer = PassOn()
    engine = make_engine(
        specs=["tenant_quota"], plugin_options={"tenant_quota": {"max_running": {"a": 1}}}, plugins=[passer]
    )
    with pytest.raises(RequestRefused) as info:
        engine.add_request(request("x", 4, n=2, tenant="a"))
    assert passer.seen == ["sampling.n (2) exceeds the running cap of tenant 'a' (1)"]
    assert str(info.value).endswith("x' can never run: tenant_quota: sampling.n (2) exceeds the running cap of tenant 'a' (1)")


def test_a_check_request_wrapper_may_let_a_refused_request_in():
    class NoTenantB:
        name = "no_tenant_b"

        @hookimpl
        def check_request(self, seq):
            return "tenant b is not served" if seq.tenant == "b" else None

    refused = make_engine(plugins=[NoTenantB()])
    with pytest.raises(RequestRefused, match="no_tenant_b: tenant b is not served"):
        refused.add_request(request("x", 4, tenant="b"))
    engine = make_engine(plugins=[NoTenantB(), LetAnyoneIn()])
    engine.add_request(request("x", 4, tenant="b"))
    run_to_end(engine)
    assert [s.num_output_tokens for s in engine.sequences("x")] == [4]


def test_a_check_request_wrapper_answering_nonsense_is_a_plugin_error_naming_it():
    class Nonsense:
        name = "nonsense"

        @hookimpl(wrapper=True)
        def check_request(self, seq):
            yield
            return 7

    engine = make_engine(plugins=[Nonsense()])
    with pytest.raises(PluginError) as info:
        engine.add_request(request("x", 4))
    assert (info.value.plugin, info.value.hook) == ("nonsense", "check_request")


def test_the_replay_records_a_refused_request_as_rejected():
    from metroline.core.config import EngineConfig
    from metroline.core.experiments.runner import run_workload
    from metroline.core.workloads.build import SyntheticSpec, Workload, generate

    items = generate(SyntheticSpec(num_requests=3, prompt_len=8, output_len=4, tenants={"a": 1}))
    config = EngineConfig(plugins=["tenant_quota"], plugin_options={"tenant_quota": {"max_running": {"a": 2}}})
    doc, _ = run_workload(Workload("w", items), config, RecordingExecutor())
    assert doc["summary"]["completed"] == 3


# --- what is not a plugin -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["os.path", "json:loads", "json:decoder.JSONDecoder", "math:pi", "collections:OrderedDict"])
def test_an_object_with_no_hook_is_not_a_plugin(spec):
    from metroline.core.config import EngineConfig
    from metroline.core.plugins.manager import PluginManager

    with pytest.raises(PluginLoadError, match=f"plugin '{spec}': .* has no metroline hook"):
        PluginManager(EngineConfig(policy=spec))


@pytest.mark.parametrize("spec", [".", "..", "a..b", ":x", "1:2"])
def test_a_malformed_spec_is_unknown(spec):
    from metroline.core.config import EngineConfig
    from metroline.core.plugins.manager import PluginManager

    with pytest.raises(PluginLoadError, match=f"unknown plugin {spec!r}"):
        PluginManager(EngineConfig(policy=spec))


def test_a_plugin_whose_import_or_init_raises_is_a_load_error(tmp_path, monkeypatch):
    import sys

    from metroline.core.config import EngineConfig
    from metroline.core.plugins.manager import PluginManager

    (tmp_path / "mtl_syntax_err.py").write_text("def (:\n")
    (tmp_path / "mtl_raises_at_import.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "mtl_init_raises.py").write_text(
        "from metroline.core.plugins.hookspecs import hookimpl\n"
        "class P:\n"
        "    def __init__(self):\n        raise KeyError('k')\n"
        "    @hookimpl\n    def on_tokens(self, seqs):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(PluginLoadError, match="importing 'mtl_syntax_err' raised SyntaxError"):
            PluginManager(EngineConfig(policy="mtl_syntax_err:P"))
        with pytest.raises(PluginLoadError, match="importing 'mtl_raises_at_import' raised RuntimeError: boom"):
            PluginManager(EngineConfig(policy="mtl_raises_at_import:P"))
        with pytest.raises(PluginLoadError, match=r"plugin 'mtl_init_raises:P': __init__ raised KeyError: 'k'"):
            PluginManager(EngineConfig(policy="mtl_init_raises:P"))
    finally:
        for m in ("mtl_syntax_err", "mtl_raises_at_import", "mtl_init_raises"):
            sys.modules.pop(m, None)


def test_options_for_a_plugin_that_is_not_loaded_are_an_error():
    from metroline.core.config import EngineConfig
    from metroline.core.plugins.manager import PluginManager

    with pytest.raises(PluginLoadError, match=r"plugin_options.tenant_quta: no plugin 'tenant_quta' is loaded \(loaded: fcfs\)"):
        PluginManager(EngineConfig(plugin_options={"tenant_quta": {"max_running": {"a": 1}}}))


# --- arrival times ----------------------------------------------------------------------------------


def test_a_future_arrival_waits_for_the_clock():
    engine = make_engine()
    engine.add_request(request("now", 4, max_new=2))
    engine.add_request(request("later", 4, max_new=2, arrival_time=5.0))
    outs = list(engine.stream())
    assert [o.request_id for o in outs if o.finished] == ["now", "later"]
    (later,) = engine.sequences("later")
    assert later.first_scheduled_time >= 5.0
    assert later.first_token_time - later.arrival_time >= 0


@pytest.mark.parametrize("t", [math.inf, math.nan, -1.0])
def test_an_arrival_time_that_is_not_a_finite_time_is_refused(t):
    from pydantic import ValidationError

    engine = make_engine()
    with pytest.raises(ValidationError, match="arrival_time"):
        engine.add_request(request("x", 4, arrival_time=t))


@pytest.mark.parametrize("field, value", [
    ("priority", "1"), ("priority", True), ("tenant", 5), ("arrival_time", "0"),
    ("sampling.max_new_tokens", True), ("sampling.ignore_eos", "false"), ("sampling.n", 2.0),
    ("sampling.temperature", math.inf),
])
def test_request_types_are_strict(field, value):
    from pydantic import ValidationError

    data = request("x", 4)
    top, _, sub = field.partition(".")
    if sub:
        data[top] = {**data[top], sub: value}
    else:
        data[top] = value
    engine = make_engine()
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        engine.add_request(data)
    assert not engine.has_unfinished()


def test_an_on_tokens_error_fails_the_steps_requests_but_not_one_that_just_finished():
    class RaisesAtTheEnd:
        name = "raises_at_the_end"

        @hookimpl
        def on_tokens(self, seqs):
            if any(s.is_finished for s in seqs):
                raise KeyError("x")

    engine = make_engine(plugins=[RaisesAtTheEnd()])
    engine.add_request(request("short", 4, max_new=1))  # its first token ends it
    engine.add_request(request("long", 4, max_new=4))
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("raises_at_the_end", "on_tokens")
    short, long = engine.sequences("short")[0], engine.sequences("long")[0]
    assert short.finish_reason is FinishReason.LENGTH and short.error is None
    assert long.finish_reason is FinishReason.FAILED and "raises_at_the_end" in long.error
    assert_pool_drained(engine)
    assert [(o.request_id, len(o.new_token_ids), o.finished) for o in info.value.outputs] == [
        ("short", 1, True), ("long", 1, False), ("long", 0, True),  # no second end for `short`
    ]


def test_recovery_frees_now_only_the_blocks_no_queue_will_reap():
    """`recovery.fail` ends each live sequence once: the device blocks of one outside `running` (a
    half-done admission) and the host blocks of one outside `swapped` (a swap-in cut short) go
    back at once, with its computed tokens reset; a running or swapped sequence keeps its blocks
    for the reap. A sequence that had ended is left as it was."""
    from metroline.core.step import recovery

    engine = make_engine(num_blocks=8, preemption_mode="swap", swap_space_blocks=8,
                         enable_prefix_caching=False)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    for _ in range(10):
        engine.step()
    sched, pool, swap = engine.scheduler, engine.pool, engine.scheduler.swap
    (a,), (b,) = engine.sequences("A"), engine.sequences("B")
    assert a in sched.running and b in sched.swapped and len(b.host_table) == 4
    engine.add_request(request("w", 4, max_new=2))
    (w,) = engine.sequences("w")
    assert w in sched.waiting and w.block_table == []
    # a half-done admission and swap-in: `w` holds a device block and two host blocks
    assert pool.allocate_slots(w.block_table, 0, 4, [])
    w.num_computed_tokens = 4
    w.host_table = swap.allocate(2)
    a_blocks = list(a.block_table)
    assert pool.num_used_blocks() == len(a_blocks) + 1 and swap.num_free_blocks() == 2

    failed = recovery.fail(sched, [a, b, w], 1.5, "PluginError: x")
    assert failed == [a, b, w]
    assert all(s.finish_reason is FinishReason.FAILED and s.error == "PluginError: x" for s in failed)
    assert (w.block_table, w.host_table, w.num_computed_tokens) == ([], [], 0)
    assert a.block_table == a_blocks and len(b.host_table) == 4  # the reap frees these
    assert pool.num_used_blocks() == len(a_blocks) and swap.num_free_blocks() == 4

    assert recovery.fail(sched, [a, w], 2.0, "PluginError: y") == []  # they had ended
    assert a.error == w.error == "PluginError: x" and a.finish_time == 1.5
    sched.reap()
    assert_pool_drained(engine)


def test_a_bad_row_of_a_sample_answer_fails_its_request_only():
    """A `sample` answer of the right length with one row that is no token id: that row's request
    fails (its error names the plugin, the hook and the bad value), the others get their tokens in
    the same step, and the engine raises the request's error once the step is done."""
    class OneBadRow:
        name = "one_bad_row"

        @hookimpl
        def sample(self, seqs):
            return [VOCAB if s.request_id == "bad" else 5 for s in seqs]

    engine = make_engine(plugins=[OneBadRow()], executor=VocabExecutor())
    engine.add_request(request("good", _prompt(1, 4), max_new=3))
    engine.add_request(request("bad", _prompt(2, 4), max_new=3))
    engine.add_request(request("fine", _prompt(3, 4), max_new=2))
    with pytest.raises(PluginError) as info:
        engine.step()
    err = info.value
    assert (err.plugin, err.hook, err.request_id) == ("one_bad_row", "sample", "bad")
    assert "token id 32000 is outside [0, 32000)" in err.problem
    assert sorted((o.request_id, o.new_token_ids, o.finished) for o in err.outputs) == [
        ("bad", [], True), ("fine", [5], False), ("good", [5], False)]
    (good,), (bad,), (fine,) = (engine.sequences(r) for r in ("good", "bad", "fine"))
    assert bad.finish_reason is FinishReason.FAILED and bad.output_token_ids == []
    assert bad.error == f"PluginError: {err}" and bad.block_table == []
    assert engine.pool.num_used_blocks() == len(good.block_table) + len(fine.block_table) == 2  # 4 tokens each
    run_to_end(engine)  # no bad row any more: the others end by length
    assert (good.output_token_ids, fine.output_token_ids) == ([5, 5, 5], [5, 5])
    assert good.finish_reason is fine.finish_reason is FinishReason.LENGTH
    assert {r.id: r.finish_reason for r in engine.metrics.requests} == {
        "good": "length", "bad": "failed", "fine": "length"}
    assert_pool_drained(engine)


def test_a_bad_row_fails_its_request_in_a_step_that_makes_no_outputs():
    """`Engine.advance` (a replay's step, no outputs made) meets the bad row as `step` does: the
    row's request fails, its error is raised once the step is done, the other request goes on."""
    class OneBadRow:
        name = "one_bad_row"

        @hookimpl
        def sample(self, seqs):
            return [-1 if s.request_id == "bad" else 5 for s in seqs]

    engine = make_engine(plugins=[OneBadRow()], executor=VocabExecutor())
    engine.add_request(request("good", _prompt(1, 4), max_new=2))
    engine.add_request(request("bad", _prompt(2, 4), max_new=2))
    with pytest.raises(PluginError) as info:
        engine.advance()
    assert (info.value.request_id, info.value.outputs) == ("bad", None)
    (good,), (bad,) = engine.sequences("good"), engine.sequences("bad")
    assert (bad.finish_reason, bad.output_token_ids) == (FinishReason.FAILED, [])
    assert good.output_token_ids == [5]
    engine.advance()
    assert good.output_token_ids == [5, 5] and good.finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


def test_a_bad_row_beside_a_batched_logits_bias_fails_its_request_only():
    """On the torch executor, with a wrapper's `add_logits_bias` in the step (the mask check then
    gathers each row's token from the adjusted logits): a `sample` row that is no token id fails
    its request (no logprob is recorded for the dropped row), the mask check reads the other rows
    only, and the good request gets its token."""
    torch = pytest.importorskip("torch")
    from torch_helpers import VOCAB as TINY_VOCAB
    from torch_helpers import tiny_llama

    from metroline.executors.torch import TorchExecutor

    class Bias:
        name = "bias"

        @hookimpl(wrapper=True)
        def sample(self, ctx, seqs, logits):
            ctx.add_logits_bias(list(range(len(seqs))), torch.zeros(len(seqs), logits.shape[-1]))
            return (yield)

    class OneBadRow:
        name = "one_bad_row"

        @hookimpl
        def sample(self, seqs):
            return [TINY_VOCAB if s.request_id == "bad" else 7 for s in seqs]

    engine = make_engine(plugins=[OneBadRow(), Bias()], executor=TorchExecutor(tiny_llama()), block_size=16,
                         num_blocks=8)
    engine.add_request(request("good", [3, 1, 4, 1, 5], max_new=3, logprobs=1))
    engine.add_request(request("bad", [2, 7, 1, 8], max_new=3, logprobs=1))
    with pytest.raises(PluginError) as info:
        engine.step()
    err = info.value
    assert err.plugin.startswith("one_bad_row (through wrapper ") and "bias" in err.plugin
    assert (err.hook, err.request_id) == ("sample", "bad")
    assert f"token id {TINY_VOCAB} is outside [0, {TINY_VOCAB})" in err.problem
    assert sorted((o.request_id, o.new_token_ids, o.finished) for o in err.outputs) == [
        ("bad", [], True), ("good", [7], False)]
    run_to_end(engine)
    (good,), (bad,) = engine.sequences("good"), engine.sequences("bad")
    assert good.output_token_ids == [7, 7, 7] and good.finish_reason is FinishReason.LENGTH
    assert bad.finish_reason is FinishReason.FAILED and bad.output_token_ids == []
    # a logprob for each token a request got, none for the dropped row
    assert len(good.logprobs) == 3 and bad.logprobs == []
    assert_pool_drained(engine)
