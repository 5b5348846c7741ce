"""`check_plugin` on the author's tenants and workload, and its hook coverage: a tenant plugin keyed
on "enterprise" does nothing on the suite's own tenants, and the report says so; with the author's
tenants or workload its code runs; the counts are the plugin's own; `strict=True` fails it; and
`metroline check-plugin`."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import make_engine, request, run_to_end

from metroline import __version__ as METROLINE_VERSION
from metroline.core.commands.check_plugin import add_check_plugin_parser, cmd_check_plugin
from metroline.core.conformance.hook_coverage import watch
from metroline.core.errors import PluginError
from metroline.core.plugins import deprecations
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.deprecations import Deprecation, MetrolineDeprecationWarning
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.victims import last_admitted_victim
from metroline.core.workloads.build import SyntheticSpec, Workload, WorkloadItem, generate
from metroline.testing import ConformanceError, check_plugin, conformance_workloads, with_tenants


class EnterpriseFirst:
    """A platform team's tenant plugin: at most `free_cap` requests of tenant "free" run at once
    (an admission filter), and a request of tenant "enterprise" that needs room preempts the most
    recently admitted "free" request."""

    name = "enterprise_first"

    def __init__(self, free_cap: int = 2) -> None:
        self.free_cap = free_cap

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        answer = yield
        if answer is None:
            return None
        free = [sum(1 for s in ctx.running if s.tenant == "free")]

        def keep(seq):
            return seq.tenant != "free" or free[0] < self.free_cap

        def admitted(seq):
            free[0] += seq.tenant == "free"

        return Candidates.of(answer).filter(keep, admitted)

    @hookimpl
    def select_victim(self, ctx, requester):
        if requester.tenant != "enterprise":
            return None
        free = [s for s in ctx.running if s.tenant == "free" and s is not requester]
        return free[-1] if free else None


def chat_only():
    return conformance_workloads()[:1]


def test_a_tenant_plugin_never_fires_on_the_suites_tenants_and_the_report_says_so():
    report = check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",))
    assert report.tenants == ["alpha", "beta", "gamma"]
    for hook in ("admission", "select_victim"):
        cov = report.coverage[hook]
        assert cov.calls > 0 and cov.changed == 0
        [warning] = [w for w in report.warnings if f"hook {hook} " in w]
        assert "never changed an answer" in warning and "tenants=" in warning
    assert "never changed an answer" in str(report)


def test_with_the_authors_tenants_the_tenant_plugin_fires():
    report = check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",),
                          tenants=["enterprise", "free"])
    assert report.tenants == ["enterprise", "free"]
    assert report.coverage["admission"].changed > 0  # free requests held back by the cap
    assert report.coverage["select_victim"].changed > 0  # free requests preempted for enterprise ones
    assert report.warnings == []


def test_strict_makes_a_hook_that_changed_nothing_a_failure():
    with pytest.raises(ConformanceError, match="hook select_victim called .* never changed an answer"):
        check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",), strict=True)
    check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",), tenants=["enterprise", "free"],
                 strict=True)


def test_the_authors_own_workload_runs_after_the_suites():
    spec = {"num_requests": 80, "rate": 300.0, "prompt_len": 64, "output_len": 32,
            "tenants": {"enterprise": 1, "free": 3}, "seed": 3}
    report = check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",), workload=spec)
    assert [r["workload"] for r in report.runs] == ["chat", "own"]
    assert report.runs[1]["requests"] == 80
    assert report.tenants == ["alpha", "beta", "enterprise", "free", "gamma"]
    assert report.coverage["admission"].changed > 0 and report.warnings == []


def test_a_hook_the_runs_never_call_is_reported():
    # fcfs never asks for an output-length estimate
    report = check_plugin("metroline.policies.length_estimators:LengthMean", workloads=chat_only(),
                          modes=("recompute",))
    assert report.coverage["estimate_output_tokens"].calls == 0
    assert any("hook estimate_output_tokens never called" in w for w in report.warnings)
    report = check_plugin("metroline.policies.length_estimators:LengthMean", base="srpt",
                          workloads=chat_only(), modes=("recompute",))
    assert report.coverage["estimate_output_tokens"].calls > 0
    # its estimates differ from the defaults' (None), but one mean for every request leaves srpt's
    # order as it was: no request ran differently, which the report says
    assert report.warnings == ["length_mean: no request ran differently without the plugin, on any workload"]
    assert [(w["workload"], w["differ"], w["stack"]) for w in report.without] == [("chat", 0, "srpt")]


# --- the counts are the plugin's own ---------------------------------------------------------------


class Tally:
    """Counts its own calls, its non-None answers (select_victim answers for even-numbered
    steps only) and those that differ from the defaults'; each instance adds a Counter to `tallies`."""

    name = "tally"

    def __init__(self, tallies: list) -> None:
        self.calls: Counter = Counter()
        tallies.append(self.calls)

    @hookimpl
    def select_victim(self, ctx, requester):
        self.calls["select_victim"] += 1
        if ctx.step % 2 or requester.state.name != "RUNNING":
            return None
        self.calls["select_victim answered"] += 1
        # a change only where the stack below (fcfs on the defaults) would name another victim
        self.calls["select_victim changed"] += last_admitted_victim(ctx, requester) is not requester
        return requester

    @hookimpl
    def on_preempted(self, seqs):
        self.calls["on_preempted"] += 1

    @hookimpl(wrapper=True)
    def on_tokens(self):
        self.calls["on_tokens"] += 1
        return (yield)

    @hookimpl(wrapper=True)
    def order_running(self, running):
        answer = yield
        self.calls["order_running"] += 1
        if len(running) == 3:
            self.calls["order_running reversed"] += 1
            return list(reversed(running))
        return answer


def test_coverage_counts_the_plugins_own_calls_and_answers():
    tallies: list = []
    report = check_plugin(Tally, options={"tallies": tallies}, workloads=chat_only(), modes=("recompute",))
    checked, rerun = tallies  # the first run is measured; the second checks that runs are deterministic
    assert checked == rerun
    cov = report.coverage
    assert (cov["select_victim"].calls, cov["select_victim"].changed) == (
        checked["select_victim"], checked["select_victim changed"])
    assert 0 < checked["select_victim changed"] < checked["select_victim answered"]
    for observer in ("on_preempted", "on_tokens"):  # an observer's changes are not counted, wrapper or not
        assert (cov[observer].calls, cov[observer].changed) == (checked[observer], None)
    # a wrapper changes the answer when it returns another order than the one it got
    assert cov["order_running"].calls == checked["order_running"]
    assert cov["order_running"].changed == checked["order_running reversed"] > 0


class OldStyle:
    """An old-style `hookwrapper` that forces the reverse order when exactly 3 requests run."""

    name = "old_style"

    def __init__(self, tallies: list) -> None:
        self.calls: Counter = Counter()
        tallies.append(self.calls)

    @hookimpl(hookwrapper=True)
    def order_running(self, running):
        outcome = yield
        self.calls["calls"] += 1
        if len(running) == 3:
            outcome.force_result(list(reversed(running)))
            self.calls["forced"] += 1


def test_an_old_style_hookwrapper_changes_the_answer_when_it_forces_another():
    tallies: list = []
    report = check_plugin(OldStyle, options={"tallies": tallies}, workloads=chat_only(), modes=("recompute",))
    cov = report.coverage["order_running"]
    assert (cov.calls, cov.changed) == (tallies[0]["calls"], tallies[0]["forced"])
    assert cov.changed > 0


class Failing:
    name = "failing"

    @hookimpl
    def order_running(self):
        raise RuntimeError("boom")


class Rescuer:
    """A wrapper over a plugin that raises: it answers in its place (`rescue`), or lets the error
    through."""

    name = "rescuer"

    def __init__(self, rescue: bool) -> None:
        self.rescue = rescue

    @hookimpl(wrapper=True)
    def order_running(self, running):
        try:
            return (yield)
        except PluginError:
            if not self.rescue:
                raise
            return list(running)


def _watched(rescue: bool):
    engine = make_engine(plugins=[Failing(), Rescuer(rescue)])
    coverage: dict = {}
    watch(engine, "rescuer", coverage)
    engine.plugins.monitor(lambda *a: None, lambda *a: None)  # every hook call through pluggy
    engine.add_request(request("r", 4, max_new=3))
    return engine, coverage["order_running"]


def test_a_wrapper_answering_in_place_of_an_error_changed_the_answer():
    engine, cov = _watched(rescue=True)
    run_to_end(engine)
    assert cov.calls == cov.changed > 0


def test_a_wrapper_letting_an_error_through_changed_nothing():
    engine, cov = _watched(rescue=False)
    with pytest.raises(PluginError, match="boom"):
        run_to_end(engine)
    assert (cov.calls, cov.changed) == (1, 0)


class PassThrough:
    """An admission wrapper that filters on a test that never rejects, or returns what it got."""

    name = "pass_through"

    def __init__(self, how: str) -> None:
        self.how = how

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        answer = yield
        if answer is None or self.how == "same":
            return answer
        if self.how == "filter-none":
            return Candidates.of(answer).filter(lambda s: True)
        if self.how == "reverse":
            return list(reversed(list(answer)))
        busy = len(ctx.running) > 0  # odd-numbered arrivals wait until nothing runs
        return Candidates.of(answer).filter(lambda s: s.arrival_no % 2 == 0 or not busy)


@pytest.mark.parametrize(("how", "changes"), [("same", False), ("filter-none", False), ("reverse", True),
                                              ("filter-half", True)])
def test_an_admission_wrapper_changes_the_answer_only_when_its_candidates_differ(how, changes):
    workload = Workload("few", generate(SyntheticSpec(num_requests=40, rate=200.0, prompt_len=64, output_len=16)))
    report = check_plugin(PassThrough, options={"how": how}, workloads=[workload], modes=("recompute",))
    cov = report.coverage["admission"]
    assert cov.calls > 0 and (cov.changed > 0) == changes


# --- re-labelled tenants -------------------------------------------------------------------------------


def _items(n):
    return [WorkloadItem(float(i), ((("k", i), 8),), 4, tenant="alpha") for i in range(n)]


def test_with_tenants_gives_names_in_turn_or_draws_by_share():
    relabelled = with_tenants(Workload("w", _items(7)), ["enterprise", "free"])
    assert [it.tenant for it in relabelled] == ["enterprise", "free"] * 3 + ["enterprise"]
    assert [(it.arrival_s, it.segments, it.output_len) for it in relabelled] == [
        (it.arrival_s, it.segments, it.output_len) for it in _items(7)]
    drawn = with_tenants(Workload("w", _items(400)), {"enterprise": 1, "free": 3, "never": 0})
    counts = Counter(it.tenant for it in drawn)
    assert set(counts) == {"enterprise", "free"} and 60 < counts["enterprise"] < 140
    assert drawn.items == with_tenants(Workload("w", _items(400)), {"enterprise": 1, "free": 3, "never": 0}).items


@pytest.mark.parametrize("tenants", ["enterprise", [], ["a", "a"], ["a", ""], {"a": 0}, {"a": -1, "b": 2}])
def test_bad_tenants_are_refused(tenants):
    with pytest.raises(ValueError, match="tenant"):
        with_tenants(Workload("w", _items(3)), tenants)


# --- metroline check-plugin ---------------------------------------------------------------------------


def _cli(argv):
    parser = argparse.ArgumentParser(prog="metroline")
    add_check_plugin_parser(parser.add_subparsers(dest="command"))
    return cmd_check_plugin(parser.parse_args(["check-plugin", *argv]))


def test_the_check_plugin_command(tmp_path, capsys):
    spec = tmp_path / "traffic.toml"
    spec.write_text('num_requests = 60\nrate = 300.0\nprompt_len = 64\noutput_len = 24\nseed = 1\n'
                    '[tenants]\nenterprise = 1\nfree = 2\n')
    target = f"{__name__}:EnterpriseFirst"
    assert _cli([target, "--mode", "recompute", "--tenants", "enterprise,free", "--workload", str(spec),
                 "--strict"]) == 0
    out = capsys.readouterr().out
    assert "traffic" in out and "admission: called" in out and "warning" not in out
    assert _cli([target, "--mode", "recompute", "--options", '{"free_cap": 2}', "--strict"]) == 1
    out = capsys.readouterr().out
    assert "hook select_victim called" in out and "never changed an answer" in out and "(strict)" in out
    with pytest.raises(ValueError, match="--options must be a JSON object"):
        _cli([target, "--options", "[1]"])


# --- deprecated usage ----------------------------------------------------------------------------------

OLD_HRRN = Path(__file__).parent / "data" / "old_plugins" / "hrrn.py"  # the guide's HRRN of a221d88: ctx.hooks
HOOKS_LINE = ("plugin 'hrrn': ctx.hooks is deprecated since metroline 0.2.0 and will be removed in 0.3.0 "
              f"(installed: metroline {METROLINE_VERSION}): use ctx.hook instead")


@pytest.fixture
def old_hrrn(tmp_path, monkeypatch):
    """The turn-old HRRN importable as `hrrn_turn_old:HRRN`; every deprecation warned about again."""
    shutil.copy(OLD_HRRN, tmp_path / "hrrn_turn_old.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    deprecations.forget_warnings()
    yield "hrrn_turn_old:HRRN"
    sys.modules.pop("hrrn_turn_old", None)
    deprecations.forget_warnings()


def test_check_plugin_reports_a_deprecated_attribute_read_during_the_runs(old_hrrn):
    with pytest.warns(MetrolineDeprecationWarning):
        report = check_plugin(old_hrrn, workloads=chat_only(), modes=("recompute",))
    assert report.deprecations == [HOOKS_LINE]
    assert str(report).splitlines()[-1] == f"deprecated: {HOOKS_LINE}"
    # reported on every check, not only the first one of the process (the warning is given once)
    assert check_plugin(old_hrrn, workloads=chat_only(), modes=("recompute",)).deprecations == [HOOKS_LINE]
    clean = check_plugin(EnterpriseFirst, workloads=chat_only(), modes=("recompute",))
    assert clean.deprecations == [] and "deprecated" not in str(clean)


def test_the_check_plugin_command_prints_deprecated_usage(old_hrrn, capsys):
    with pytest.warns(MetrolineDeprecationWarning):
        assert _cli([old_hrrn, "--mode", "recompute"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("conformance of hrrn: ")
    assert out.splitlines()[-1] == f"deprecated: {HOOKS_LINE}"


class OldHookName:
    """Implements `on_step_done`, made the deprecated name of `on_step_end` by the test below."""

    name = "old_hook_name"

    @hookimpl
    def on_step_done(self, plan):
        pass


def test_check_plugin_reports_a_deprecated_hook_name_found_at_registration(monkeypatch):
    dep = Deprecation("hook on_step_done", "hook on_step_end", since="0.2.0", removed_in="0.3.0", target="on_step_end")
    monkeypatch.setitem(deprecations.HOOKS, "on_step_done", dep)
    deprecations.forget_warnings()
    with pytest.warns(MetrolineDeprecationWarning):
        report = check_plugin(OldHookName, workloads=chat_only(), modes=("recompute",))
    assert report.deprecations == [
        "plugin 'old_hook_name': hook on_step_done is deprecated since metroline 0.2.0 and will be removed in 0.3.0 "
        f"(installed: metroline {METROLINE_VERSION}): use hook on_step_end instead"
    ]
    assert report.coverage["on_step_end"].calls > 0  # it ran as on_step_end
