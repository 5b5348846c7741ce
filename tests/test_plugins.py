"""The plugin surface: loading (shipped name, dotted path, entry point), options, `describe()` and
`metroline plugins`, invalid hook answers and raising hooks (PluginError naming plugin and hook),
a wrapper stacked on fcfs that filters admission, and precedence."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from conftest import assert_pool_drained, make_engine, request, run_to_end

from metroline import cli
from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError, PluginLoadError
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.manager import SHIPPED, PluginManager
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import FinishReason, Sequence
from metroline.policies.fcfs import FCFS
from metroline.policies.static import StaticBatching

FCFS_HOOKS = ["admission", "on_arrival", "on_preempted", "select_victim"]
DEFAULT_HOOKS = ["admission", "num_draft_tokens", "order_running", "sample", "select_victim", "split_budget"]


def stranger() -> Sequence:
    """A sequence that belongs to no engine."""
    return Sequence("stranger", [1, 2, 3], SamplingParams(), 0.0)


# --- loading -------------------------------------------------------------------------------------


def test_shipped_policies_load_by_name():
    pm = PluginManager(EngineConfig(policy="static"))
    assert pm.describe() == [("static", FCFS_HOOKS), ("defaults", DEFAULT_HOOKS)]
    assert isinstance(pm.get("static"), StaticBatching)
    assert isinstance(PluginManager(EngineConfig()).get("fcfs"), FCFS)
    assert {"fcfs", "static"} <= set(SHIPPED)


def test_each_engine_gets_its_own_policy_instance():
    a, b = make_engine(), make_engine()
    assert a.plugins.get("fcfs") is not b.plugins.get("fcfs")


PLUGIN_MODULE = '''
from metroline.core.plugins.hookspecs import hookimpl


class Counter:
    """Counts arrivals; `start` and `step` are options."""

    name = "counter"

    def __init__(self, start=0, step=1):
        self.count = start
        self.step = step

    @hookimpl
    def on_arrival(self, seqs):
        self.count += self.step * len(seqs)


@hookimpl
def on_finished(seqs):
    FINISHED.extend(s.seq_id for s in seqs)


FINISHED = []
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module `mtl_test_pkg.plugs` on sys.path holding a class plugin and module-level hooks;
    yields its dotted name."""
    pkg = tmp_path / "mtl_test_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugs.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mtl_test_pkg.plugs"
    for name in ("mtl_test_pkg.plugs", "mtl_test_pkg"):
        sys.modules.pop(name, None)


def test_a_class_loads_by_dotted_path_with_its_options(plugin_module):
    engine = make_engine(specs=[f"{plugin_module}:Counter"], plugin_options={"counter": {"start": 10, "step": 2}})
    counter = engine.plugins.get("counter")
    assert (counter.count, counter.step) == (10, 2)
    engine.add_request(request("a", 4, max_new=1))
    engine.add_request(request("b", 4, max_new=1))
    run_to_end(engine)
    assert counter.count == 14
    assert engine.plugins.describe()[0] == ("counter", ["on_arrival"])


def test_options_are_also_found_under_the_spec(plugin_module):
    spec = f"{plugin_module}:Counter"
    pm = PluginManager(EngineConfig(plugins=[spec], plugin_options={spec: {"start": 3}}))
    assert pm.get("counter").count == 3


def test_a_module_loads_by_dotted_path(plugin_module):
    pm = PluginManager(EngineConfig(plugins=[plugin_module]))
    assert pm.describe()[0] == (plugin_module, ["on_finished"])
    engine = make_engine(specs=[plugin_module])
    engine.add_request(request("m", 4, max_new=2))
    run_to_end(engine)
    assert sys.modules[plugin_module].FINISHED == ["m"]


def test_a_bad_option_names_the_plugin(plugin_module):
    with pytest.raises(PluginLoadError, match=r"plugin 'counter': bad options \{'speed': 3\}"):
        PluginManager(EngineConfig(plugins=[f"{plugin_module}:Counter"], plugin_options={"counter": {"speed": 3}}))


def test_options_for_a_module_plugin_are_an_error(plugin_module):
    with pytest.raises(PluginLoadError, match="is not a class and takes no options"):
        PluginManager(EngineConfig(plugins=[plugin_module], plugin_options={plugin_module: {"x": 1}}))


def test_a_missing_module_or_attribute_is_a_load_error(plugin_module):
    with pytest.raises(PluginLoadError, match="cannot import 'no_such_module_xyz'"):
        PluginManager(EngineConfig(plugins=["no_such_module_xyz:Thing"]))
    with pytest.raises(PluginLoadError, match=f"'{plugin_module}' has no attribute 'Nope'"):
        PluginManager(EngineConfig(plugins=[f"{plugin_module}:Nope"]))


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(PluginLoadError) as info:
        PluginManager(EngineConfig(policy="fifo"))
    message = str(info.value)
    assert "unknown plugin 'fifo'" in message
    known = message.split("known: ", 1)[1]
    for name in ("fcfs", "static"):
        assert name in known
    assert "pkg.mod:Obj" in message


def test_a_plugin_loaded_twice_is_an_error():
    with pytest.raises(PluginLoadError, match="'fcfs' is loaded twice"):
        PluginManager(EngineConfig(policy="fcfs", plugins=["fcfs"]))


def test_a_plugin_with_an_unknown_hook_is_a_load_error():
    class Typo:
        name = "typo"

        @hookimpl
        def admision(self, ctx):
            return None

    with pytest.raises(PluginLoadError, match="plugin 'typo'"):
        make_engine(plugins=[Typo()])


@pytest.fixture
def entry_point_dist(tmp_path, monkeypatch):
    """A distribution `fake_dist` on sys.path declaring the entry point `fake_ep` in the group
    `metroline.plugins` (and one, `broken_ep`, whose target does not import)."""
    (tmp_path / "mtl_fake_ep_plugin.py").write_text(textwrap.dedent('''
        from metroline.core.plugins.hookspecs import hookimpl


        class Plugin:
            def __init__(self, label="plain"):
                self.label = label

            @hookimpl
            def on_tokens(self, seqs):
                pass
    '''))
    info = tmp_path / "fake_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake_dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[metroline.plugins]\nfake_ep = mtl_fake_ep_plugin:Plugin\nbroken_ep = mtl_no_such_module:Plugin\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("mtl_fake_ep_plugin", None)


def test_a_plugin_loads_by_entry_point(entry_point_dist):
    pm = PluginManager(EngineConfig(plugins=["fake_ep"], plugin_options={"fake_ep": {"label": "x"}}))
    assert pm.describe()[0] == ("fake_ep", ["on_tokens"])
    assert pm.get("fake_ep").label == "x"
    with pytest.raises(PluginLoadError) as info:
        PluginManager(EngineConfig(policy="nope"))
    assert "fake_ep" in str(info.value).split("known: ", 1)[1]


def test_a_broken_entry_point_is_a_load_error(entry_point_dist):
    with pytest.raises(PluginLoadError, match="plugin 'broken_ep': entry point 'mtl_no_such_module:Plugin' failed"):
        PluginManager(EngineConfig(plugins=["broken_ep"]))


def test_a_distribution_installed_after_a_lookup_is_found_and_none_rescans_without_one(tmp_path, monkeypatch):
    """The entry points are scanned once and kept while `sys.path` and its folders stay as they
    are: a second lookup reads no metadata; a distribution installed after the first lookup (a
    `.dist-info` folder added to a folder of `sys.path`) is found by the next one."""
    from metroline.core.plugins import loader

    scans = []
    real = loader.entry_points
    monkeypatch.setattr(loader, "entry_points", lambda **kw: scans.append(kw) or real(**kw))
    monkeypatch.syspath_prepend(str(tmp_path))
    for _ in range(2):
        with pytest.raises(PluginLoadError, match="unknown plugin 'late_ep'"):
            loader.resolve("late_ep")
    assert len(scans) == 1
    (tmp_path / "mtl_late_ep_plugin.py").write_text("from metroline.policies.fcfs import FCFS as Plugin\n")
    info = tmp_path / "late_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: late_dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[metroline.plugins]\nlate_ep = mtl_late_ep_plugin:Plugin\n")
    # an install takes longer than the folder clock's tick (a few ms): make sure the time moved on
    stat = tmp_path.stat()
    os.utime(tmp_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    try:
        assert loader.resolve("late_ep") is FCFS
    finally:
        sys.modules.pop("mtl_late_ep_plugin", None)
    assert len(scans) == 2


def test_metroline_plugins_lists_loaded_plugins_hooks_and_entry_points(entry_point_dist, plugin_module, capsys):
    code = cli.main(["plugins", "--policy", "static", "--plugin", "fake_ep", "--plugin", f"{plugin_module}:Counter"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "loaded plugins (highest precedence first):"
    end = lines.index(next(line for line in lines if line.startswith("shipped:")))
    rows = [line.split(None, 1) for line in lines[1:end] if not line.startswith(" " * 3)]
    assert rows == [
        ["counter", "on_arrival"],
        ["fake_ep", "on_tokens"],
        ["static", ", ".join(FCFS_HOOKS)],
        ["defaults", ", ".join(DEFAULT_HOOKS)],
    ]
    shipped = [line for line in lines if line.startswith("shipped:")][0]
    assert "fcfs" in shipped and "static" in shipped
    entry = [line for line in lines if line.startswith("entry points:")][0]
    assert "fake_ep (mtl_fake_ep_plugin:Plugin)" in entry


def test_metroline_plugins_reports_a_load_error(capsys):
    assert cli.main(["plugins", "--policy", "fifo"]) == 2
    assert "unknown plugin 'fifo'" in capsys.readouterr().err


def test_describe_lists_stacked_plugins_by_precedence():
    class Late:
        name = "late"

        @hookimpl
        def select_victim(self, ctx, requester):
            return None

        @hookimpl
        def on_step_end(self, plan):
            pass

    engine = make_engine(plugins=[Late()])
    assert engine.plugins.describe() == [
        ("late", ["on_step_end", "select_victim"]),
        ("fcfs", FCFS_HOOKS),
        ("defaults", DEFAULT_HOOKS),
    ]
    assert engine.plugins.names() == ["late", "fcfs", "defaults"]


# --- invalid answers and raising hooks -----------------------------------------------------------


def _run_expecting_plugin_error(engine, plugin, hook, problem):
    with pytest.raises(PluginError) as info:
        run_to_end(engine, max_steps=200)
    err = info.value
    assert (err.plugin, err.hook) == (plugin, hook)
    assert problem in err.problem
    assert f"plugin {plugin!r}, hook {hook!r}" in str(err)
    return err


def _growing_pair(plugins):
    """Two requests that outgrow an 8-block pool: a victim is needed in step 10."""
    engine = make_engine(num_blocks=8, plugins=plugins)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    return engine


def test_a_victim_that_is_not_running_is_invalid():
    class BadVictim:
        name = "bad_victim"

        @hookimpl
        def select_victim(self, ctx, requester):
            return stranger()

    engine = _growing_pair([BadVictim()])
    _run_expecting_plugin_error(engine, "bad_victim", "select_victim", "is not a running sequence")


def test_a_waiting_victim_is_invalid():
    class WaitingVictim:
        name = "waiting_victim"

        @hookimpl
        def select_victim(self, ctx, requester):
            return next(iter(ctx.waiting))

    engine = _growing_pair([WaitingVictim()])
    engine.add_request(request("C", 30, max_new=1))  # stays waiting: the pool is full
    _run_expecting_plugin_error(engine, "waiting_victim", "select_victim", "is not a running sequence")


@pytest.mark.parametrize(
    ("split", "problem"),
    [
        (lambda budget: Split(budget, 1, 8), "outside the budget of 64 tokens"),
        (lambda budget: Split(-1, budget, 8), "outside the budget of 64 tokens"),
        (lambda budget: Split(0, -4, 8), "outside the budget of 64 tokens"),
        (lambda budget: Split(0, budget, 0), "max_chunk >= 1"),
        (lambda budget: (1, 2), "expected Split(decode, prefill, max_chunk)"),
    ],
    ids=["above-total", "negative-decode", "negative-prefill", "zero-chunk", "not-a-split"],
)
def test_an_invalid_budget_split_is_an_error(split, problem):
    class BadSplit:
        name = "bad_split"

        @hookimpl
        def split_budget(self, budget):
            return split(budget)

    engine = make_engine(plugins=[BadSplit()])
    engine.add_request(request("a", 4))
    _run_expecting_plugin_error(engine, "bad_split", "split_budget", problem)


@pytest.mark.parametrize("answer", [[], [1, 2], (5,), None], ids=["short", "long", "tuple", "none"])
def test_a_sample_answer_of_the_wrong_length_is_an_error(answer):
    class BadSample:
        name = "bad_sample"

        @hookimpl(tryfirst=True)
        def sample(self, seqs):
            return answer

    engine = make_engine(plugins=[BadSample()])
    engine.add_request(request("a", 4))
    if answer is None:  # None lets the default sampler answer: valid
        run_to_end(engine)
        return
    _run_expecting_plugin_error(engine, "bad_sample", "sample", "expected a list of 1 token ids")


def test_an_order_with_a_sequence_that_is_not_running_is_an_error():
    class BadOrder:
        name = "bad_order"

        @hookimpl
        def order_running(self, running):
            return [*running, stranger()]

    engine = make_engine(plugins=[BadOrder()])
    engine.add_request(request("a", 4))
    _run_expecting_plugin_error(engine, "bad_order", "order_running", "is not a running sequence")


def test_an_order_may_leave_sequences_out():
    class OnlyFirst:
        name = "only_first"

        @hookimpl
        def order_running(self, running):
            return running[:1]

    engine = make_engine(plugins=[OnlyFirst()])
    engine.add_request(request("a", 4, max_new=3))
    engine.add_request(request("b", 4, max_new=3))
    run_to_end(engine)
    # b is admitted with a's prompt, then waits for a to finish before it decodes
    assert [p.scheduled for p in engine.executor.plans] == [
        {"a": 4, "b": 4}, {"a": 1}, {"a": 1}, {"b": 1}, {"b": 1},
    ]


def test_admission_candidates_that_raise_are_an_error():
    class BadAdmission:
        name = "bad_admission"

        @hookimpl
        def admission(self, ctx):
            def candidates():
                yield from list(ctx.waiting)
                raise LookupError("quota table missing")

            return candidates()

    engine = make_engine(plugins=[BadAdmission()])
    engine.add_request(request("a", 4))
    err = _run_expecting_plugin_error(
        engine, "bad_admission", "admission", "its candidates raised LookupError: quota table missing"
    )
    assert isinstance(err.__cause__, LookupError)


def test_an_admission_candidate_that_is_not_waiting_is_an_error():
    class Stranger:
        name = "stranger"

        @hookimpl
        def admission(self):
            return [stranger()]

    engine = make_engine(plugins=[Stranger()])
    engine.add_request(request("a", 4))
    _run_expecting_plugin_error(engine, "stranger", "admission", "is not in this engine's waiting queue")


@pytest.mark.parametrize("hook", ["on_tokens", "select_victim", "split_budget", "on_finished"])
def test_a_hook_that_raises_names_the_plugin_and_hook_and_chains_the_error(hook):
    original = ZeroDivisionError("division by zero in my plugin")

    class Raising:
        name = "raising"

    def impl(self, **kwargs):
        raise original

    impl.__name__ = hook
    setattr(Raising, hook, hookimpl(impl))
    engine = _growing_pair([Raising()])  # step 10 needs a victim
    with pytest.raises(PluginError) as info:
        run_to_end(engine, max_steps=200)
    err = info.value
    assert (err.plugin, err.hook) == ("raising", hook)
    assert "raised ZeroDivisionError: division by zero in my plugin" in str(err)
    assert err.__cause__ is original


def test_an_invalid_answer_through_a_wrapper_names_both():
    class Truncate:
        name = "truncate"

        @hookimpl(wrapper=True)
        def sample(self):
            tokens = yield
            return tokens[:-1]

    engine = make_engine(plugins=[Truncate()])
    engine.add_request(request("a", 4))
    _run_expecting_plugin_error(engine, "defaults (through wrapper truncate)", "sample", "expected a list of 1")


class SlowWrapper:
    """A new-style wrapper of `sample` that sleeps `before` its yield and `after` it."""

    name = "slow_wrapper"

    def __init__(self, before: float = 0.0, after: float = 0.0) -> None:
        self.before, self.after = before, after

    @hookimpl(wrapper=True)
    def sample(self):
        import time

        time.sleep(self.before)
        tokens = yield
        time.sleep(self.after)
        return tokens


class SlowOldWrapper:
    """An old-style `hookwrapper` of `sample` that sleeps after its yield."""

    name = "slow_old_wrapper"

    @hookimpl(hookwrapper=True)
    def sample(self):
        import time

        yield
        time.sleep(1.0)


@pytest.mark.filterwarnings("ignore::pluggy.PluggyTeardownRaisedWarning")  # pluggy's note on the old style's error
@pytest.mark.parametrize("plugin", [SlowWrapper(before=1.0), SlowWrapper(after=1.0), SlowOldWrapper()],
                         ids=["before its yield", "after its yield", "old style"])
def test_a_wrapper_plugins_own_time_counts_against_the_hook_budget(plugin):
    """A wrapper's code before and after its `yield` is timed as the wrapper's call (a 1 s sleep
    against a 0.5 s budget, which every other call of the step stays far below: the error names
    the wrapper, not the implementation it wraps)."""
    engine = make_engine(plugins=[plugin])
    engine.plugins.watch.budget_s = 0.5
    engine.add_request(request("a", 4))
    err = _run_expecting_plugin_error(engine, plugin.name, "sample", "over the hook budget of 0.5 s (hook_budget_s)")
    assert float(err.problem.split("took ")[1].split(" s")[0]) >= 1.0
    assert engine.plugins.watch.overruns == {(plugin.name, "sample"): 1}


def test_a_quick_wrapper_under_the_budget_answers_as_without_one():
    """Timed in parts, a wrapper still gets the tokens sampled below it and its answer stands."""
    tokens = []
    for budget in (30.0, None):
        engine = make_engine(plugins=[SlowWrapper()])
        engine.plugins.watch.budget_s = budget
        engine.add_request(request("a", 4, max_new=5))
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        tokens.append([o.new_token_ids for o in outputs if o.seq.request_id == "a"])
        assert engine.plugins.watch.overruns == {}
    assert tokens[0] == tokens[1] and sum(len(t) for t in tokens[0]) == 5


# --- stacking: a wrapper that filters admission, and precedence -----------------------------------


class TenantGate:
    """Stacked on a policy: tenant "b" is not admitted while tenant "a" has running requests."""

    name = "tenant_gate"

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        candidates = yield

        def keep(seq):
            return seq.tenant != "b" or not any(s.tenant == "a" for s in ctx.running)

        return candidates.filter(keep)


def _tenants_engine(plugins):
    engine = make_engine(plugins=plugins)
    for rid, tenant, out in (("a1", "a", 3), ("b1", "b", 2), ("a2", "a", 4), ("b2", "b", 2)):
        engine.add_request(request(rid, 4, max_new=out, tenant=tenant))
    run_to_end(engine)
    return [(p.step, p.admitted) for p in engine.executor.plans if p.admitted], engine


def test_a_wrapper_stacked_on_fcfs_filters_admission():
    admitted, _ = _tenants_engine([])
    assert admitted == [(1, ["a1", "b1", "a2", "b2"])]
    admitted, engine = _tenants_engine([TenantGate()])
    # a1 runs, so b1 is held back; a2 is admitted behind it; b1 and b2 (in arrival order) board
    # once a2, the last "a", ended in step 4
    assert admitted == [(1, ["a1", "a2"]), (5, ["b1", "b2"])]
    assert engine.plugins.names() == ["tenant_gate", "fcfs", "defaults"]
    for rid in ("a1", "b1", "a2", "b2"):
        assert engine.sequences(rid)[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


class OldestOther:
    """select_victim: the running sequence admitted first, other than the requester."""

    name = "oldest_other"

    def __init__(self):
        self.calls = 0

    @hookimpl
    def select_victim(self, ctx, requester):
        self.calls += 1
        others = [s for s in ctx.running if s is not requester]
        return min(others, key=lambda s: s.admitted_seq_no) if others else None


def _three_growing(plugins):
    engine = make_engine(num_blocks=7, enable_prefix_caching=False, plugins=plugins)
    for rid in "ABC":
        engine.add_request(request(rid, 4, max_new=8))
    run_to_end(engine)
    return [(p.step, p.preempted) for p in engine.executor.plans if p.preempted], engine


def test_a_plugin_registered_after_fcfs_overrides_its_select_victim():
    preempted, _ = _three_growing([])
    assert preempted == [(6, [("C", "WAITING")])]  # fcfs: the last admitted
    override = OldestOther()
    preempted, engine = _three_growing([override])
    # B is the requester in step 6 (A took the last free block): the oldest other is A
    assert preempted[0] == (6, [("A", "WAITING")])
    assert override.calls >= 1
    for rid in "ABC":
        assert engine.sequences(rid)[0].num_output_tokens == 8
    assert_pool_drained(engine)


def test_a_plugin_added_after_the_engine_is_built_answers_first():
    """The relay calls implementations directly (no pluggy machinery) when no wrapper is
    involved; a plugin added later is still the newest, so it answers first, and a monitor sees
    every hook call while it is on."""

    class Budget:
        @hookimpl
        def split_budget(self, budget):
            return Split(0, budget, 3)  # prefill only, chunks of 3

    engine = make_engine()
    engine.add_request(request("a", prompt=list(range(10)), max_new_tokens=2))
    engine.plugins.add("budget", Budget())
    calls = []
    undo = engine.plugins.monitor(lambda name, impls, kwargs: calls.append(name), lambda *a: None)
    engine.step()
    undo()
    engine.step()
    assert engine.sequences("a")[0].num_computed_tokens == 6  # two chunks of 3
    assert calls.count("split_budget") == 1 and "admission" in calls


@pytest.mark.parametrize("typo, meant", [("srtp", "srpt"), ("decode_frist", "decode_first"), ("fcsf", "fcfs")])
def test_a_misspelt_name_gets_a_did_you_mean(typo, meant):
    with pytest.raises(PluginLoadError, match=f"unknown plugin '{typo}'; did you mean '{meant}'\\?"):
        PluginManager(EngineConfig(policy=typo))


def test_a_name_like_no_plugin_gets_no_guess():
    with pytest.raises(PluginLoadError) as info:
        PluginManager(EngineConfig(policy="zzzzzz"))
    assert "did you mean" not in str(info.value)


def test_a_dotted_path_finds_a_module_in_the_current_folder_last(tmp_path, monkeypatch):
    """A module on no `sys.path` entry is looked for in the current folder (what `python -m`
    gives and the `metroline` script does not); a module found nowhere leaves `sys.path` as it was
    and names itself; one that imports a missing module names that one."""
    from metroline.core.plugins.loader import resolve

    (tmp_path / "here_policy_xyz.py").write_text(textwrap.dedent("""
        from metroline.policies.fcfs import FCFS

        class Mine(FCFS):
            name = "mine"
    """))
    (tmp_path / "broken_here_xyz.py").write_text("import not_installed_anywhere_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    for name in ("here_policy_xyz", "broken_here_xyz"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    before = list(sys.path)
    with pytest.raises(PluginLoadError, match="cannot import 'nowhere_xyz': No module named 'nowhere_xyz'"):
        resolve("nowhere_xyz:P")
    assert sys.path == before
    assert resolve("here_policy_xyz:Mine").__name__ == "Mine"
    assert sys.path == before + [str(tmp_path)]
    with pytest.raises(PluginLoadError, match="No module named 'not_installed_anywhere_xyz'"):
        resolve("broken_here_xyz:P")
