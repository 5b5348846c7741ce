"""Deprecation, not breakage (`metroline.core.plugins.deprecations`): a plugin written against an old spelling of the
plugin API runs unchanged, with one `MetrolineDeprecationWarning` per plugin and name that names
the new spelling.

`tests/data/old_plugins/hrrn.py` is the HRRN policy of the plugin guide as it was published at
commit a221d88 (docs/plugins.md), byte for byte: it reads `ctx.hooks`, renamed `ctx.hook` since,
which made it fail at every step with an AttributeError. Deprecated hook names and hook arguments
have no entry in the registry yet; the tests add one for the duration of the test.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys

import warnings
from pathlib import Path

import pytest
from conftest import make_engine, request, run_to_end

from metroline import __version__ as METROLINE_VERSION
from metroline.cli import main
from metroline.core.plugins import deprecations
from metroline.core.plugins.deprecations import Deprecation, MetrolineDeprecationWarning
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.loader import has_hooks

ROOT = Path(__file__).parents[1]
OLD_HRRN = ROOT / "tests" / "data" / "old_plugins" / "hrrn.py"
RUN = ["run", "--policy", "hrrn:HRRN", "--plugin", "length_mean", "--workload", "chat", "--max-requests", "300",
       "--cost-model", "steps", "--seed", "0", "--rate-scale", "4", "--max-num-seqs", "16"]


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each test starts as a new process would: nothing warned about yet."""
    deprecations.forget_warnings()
    yield
    deprecations.forget_warnings()


def plugin_folders(tmp_path: Path) -> tuple[Path, Path]:
    """Two folders, each with an `hrrn.py`: the turn-old one (ctx.hooks) and the same file with
    `ctx.hook`, its spelling now."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    text = OLD_HRRN.read_text()
    assert text.count("ctx.hooks.") == 1
    shutil.copy(OLD_HRRN, old / "hrrn.py")
    (new / "hrrn.py").write_text(text.replace("ctx.hooks.", "ctx.hook."))
    return old, new


def metroline(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`metroline ARGS` run by a user in `folder` (its hrrn.py found there, as the guide says)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "metroline", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)


def read_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_the_turn_old_hrrn_runs_unchanged_with_one_warning_naming_ctx_hook(tmp_path):
    old, new = plugin_folders(tmp_path)
    before = metroline(new, *RUN, "--requests-csv", "requests.csv")
    after = metroline(old, *RUN, "--requests-csv", "requests.csv")
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert "DeprecationWarning" not in before.stderr
    # exactly one warning, pointing at the line of hrrn.py that reads ctx.hooks, naming ctx.hook
    warned = [line for line in after.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(warned) == 1, after.stderr
    line_no = next(i for i, t in enumerate(OLD_HRRN.read_text().splitlines(), 1) if "ctx.hooks." in t)
    assert warned[0] == (
        f"{old / 'hrrn.py'}:{line_no}: MetrolineDeprecationWarning: plugin 'hrrn': ctx.hooks is deprecated since "
        f"metroline 0.2.0 and will be removed in 0.3.0 (installed: metroline {METROLINE_VERSION}): use ctx.hook instead"
    )
    # the same schedule, request by request, as the plugin spelled the new way
    rows_new, rows_old = read_rows(new / "requests.csv"), read_rows(old / "requests.csv")
    assert len(rows_old) == 300 and rows_old == rows_new
    assert {r["finish_reason"] for r in rows_old} == {"length"}
    wall = re.compile(r"wall \(s\) +[0-9.]+")  # the run's own CPU time: the one figure that varies
    assert wall.sub("", after.stdout) == wall.sub("", before.stdout)


def test_in_process_the_run_emits_exactly_one_deprecation_warning(tmp_path, monkeypatch, capsys):
    old, _ = plugin_folders(tmp_path)
    monkeypatch.chdir(old)
    monkeypatch.delitem(sys.modules, "hrrn", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader appends the folder: undone after
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*RUN, "--requests-csv", str(tmp_path / "r.csv")]) == 0
    sys.modules.pop("hrrn", None)
    deprecation_warnings = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecation_warnings) == 1
    [w] = deprecation_warnings
    assert w.category is MetrolineDeprecationWarning
    assert "use ctx.hook instead" in str(w.message) and str(w.message).startswith("plugin 'hrrn': ctx.hooks ")
    assert Path(w.filename) == old / "hrrn.py"
    assert len(read_rows(tmp_path / "r.csv")) == 300


# --- the mechanism --------------------------------------------------------------------------------


class AsksOld:
    """Reads ctx.hooks from a helper of its own, at every step."""

    name = "asks_old"

    def __init__(self) -> None:
        self.relays = []

    def ask(self, ctx):
        return ctx.hooks

    @hookimpl
    def on_step_end(self, ctx):
        self.relays.append(self.ask(ctx))


class AsksOldToo(AsksOld):
    name = "asks_old_too"


def test_once_per_plugin_and_the_old_name_gives_the_new_object():
    a, b = AsksOld(), AsksOldToo()
    engine = make_engine(policy="fcfs", plugins=[a, b])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.add_request(request("r", 8, max_new=5))
        run_to_end(engine)
    assert len(a.relays) == len(b.relays) == 5  # one step per token: the prefill's, then 4 decodes
    assert all(r is engine.scheduler.ctx.hook for r in a.relays + b.relays)
    # observers are called newest plugin first: asks_old_too, then asks_old; each warned once
    assert [str(w.message) for w in caught] == [
        f"plugin {name!r}: ctx.hooks is deprecated since metroline 0.2.0 and will be removed in 0.3.0 "
        f"(installed: metroline {METROLINE_VERSION}): use ctx.hook instead"
        for name in ("asks_old_too", "asks_old")
    ]
    assert {w.filename for w in caught} == {__file__}
    assert {w.lineno for w in caught} == {AsksOld.ask.__code__.co_firstlineno + 1}  # the line that reads it


def test_code_outside_any_plugin_is_named_by_its_module_and_line():
    engine = make_engine(policy="fcfs")
    with pytest.warns(MetrolineDeprecationWarning) as caught:
        relay = engine.scheduler.ctx.hooks
    line = sys._getframe().f_lineno - 1  # the line above, which reads ctx.hooks
    assert relay is engine.scheduler.ctx.hook
    assert [str(w.message) for w in caught] == [
        f"<module test_deprecations, line {line}>: ctx.hooks is deprecated since metroline 0.2.0 and will be "
        f"removed in 0.3.0 (installed: metroline {METROLINE_VERSION}): use ctx.hook instead"
    ]


def test_recording_collects_every_use_even_those_already_warned_about():
    engine = make_engine(policy="fcfs", plugins=[AsksOld()])
    with warnings.catch_warnings(record=True) as caught, deprecations.recording() as uses:
        warnings.simplefilter("always")
        engine.add_request(request("r", 8, max_new=3))
        run_to_end(engine)
    assert len(caught) == 1
    assert len(uses) >= 3 and {u.plugin for u in uses} == {"asks_old"}
    assert {u.deprecation.old for u in uses} == {"ctx.hooks"}


class OldHookName:
    """Implements `on_step_done`, the (made-up, for this test) old name of `on_step_end`."""

    name = "old_hook_name"

    def __init__(self) -> None:
        self.plans = []

    @hookimpl
    def on_step_done(self, plan):
        self.plans.append(plan.step)


def test_a_deprecated_hook_name_is_registered_for_the_new_hook_and_warns_once(monkeypatch):
    dep = Deprecation("hook on_step_done", "hook on_step_end", since="0.2.0", removed_in="0.3.0", target="on_step_end")
    monkeypatch.setitem(deprecations.HOOKS, "on_step_done", dep)
    assert has_hooks(OldHookName)
    plugins = [OldHookName(), OldHookName()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engines = [make_engine(policy="fcfs", plugins=[p]) for p in plugins]
        for engine in engines:
            engine.add_request(request("r", 8, max_new=3))
            run_to_end(engine)
    assert plugins[0].plans == plugins[1].plans == [1, 2, 3]
    [w] = caught  # one warning for the plugin, not one per engine
    assert str(w.message) == ("plugin 'old_hook_name': hook on_step_done is deprecated since metroline 0.2.0 and "
                              f"will be removed in 0.3.0 (installed: metroline {METROLINE_VERSION}): use hook "
                              "on_step_end instead")
    assert (w.filename, w.lineno) == (__file__, OldHookName.on_step_done.__code__.co_firstlineno)


def test_without_the_registry_entry_the_old_hook_name_is_an_unknown_hook():
    from metroline.core.errors import PluginLoadError

    with pytest.raises(PluginLoadError, match="on_step_done"):
        make_engine(policy="fcfs", plugins=[OldHookName()])


class OldArgument:
    """Takes `running` of `order_running` under the (made-up) old name `seqs`, in a plain
    implementation and in a wrapper (called through pluggy's machinery)."""

    name = "old_argument"

    def __init__(self) -> None:
        self.seen = []

    @hookimpl
    def order_running(self, ctx, seqs):
        self.seen.append(("impl", [s.seq_id for s in seqs]))
        return list(reversed(seqs))


class OldArgumentWrapper:
    name = "old_argument_wrapper"

    def __init__(self) -> None:
        self.seen = []

    @hookimpl(wrapper=True)
    def order_running(self, seqs):
        answer = yield
        self.seen.append([s.seq_id for s in seqs])
        return answer


def test_a_deprecated_argument_is_passed_the_new_arguments_value(monkeypatch):
    dep = Deprecation("argument seqs of order_running", "running", since="0.2.0", removed_in="0.3.0", target="running")
    monkeypatch.setitem(deprecations.ARGUMENTS, ("order_running", "seqs"), dep)
    plugin, wrapper = OldArgument(), OldArgumentWrapper()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = make_engine(policy="fcfs", plugins=[plugin, wrapper])
        engine.add_request(request("a", 8, max_new=2))
        engine.add_request(request("b", 8, max_new=2))
        run_to_end(engine)
    assert plugin.seen and all(ids == ["a", "b"] for _, ids in plugin.seen)
    assert wrapper.seen == [ids for _, ids in plugin.seen]
    assert sorted(str(w.message) for w in caught) == [
        f"plugin {name!r}: argument seqs of order_running is deprecated since metroline 0.2.0 and will be removed "
        f"in 0.3.0 (installed: metroline {METROLINE_VERSION}): use running instead"
        for name in ("old_argument", "old_argument_wrapper")
    ]


def test_a_deprecated_hook_that_is_still_specified_is_called_and_warns(monkeypatch):
    dep = Deprecation("hook on_step_end", None, since="0.2.0", removed_in="0.3.0")
    monkeypatch.setitem(deprecations.HOOKS, "on_step_end", dep)
    plugin = AsksNothing()
    with pytest.warns(MetrolineDeprecationWarning, match=r"^plugin 'asks_nothing': hook on_step_end is deprecated "
                      r"since metroline 0\.2\.0 and will be removed in 0\.3\.0 \(installed: metroline "
                      + re.escape(METROLINE_VERSION) + r"\) without a replacement$"):
        engine = make_engine(policy="fcfs", plugins=[plugin])
    engine.add_request(request("r", 8, max_new=2))
    run_to_end(engine)
    assert plugin.steps == [1, 2]


class AsksNothing:
    name = "asks_nothing"

    def __init__(self) -> None:
        self.steps = []

    @hookimpl
    def on_step_end(self, ctx):
        self.steps.append(ctx.step)


def version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_every_deprecation_keeps_working_for_a_minor_version_and_is_gone_by_its_removal():
    current = version(METROLINE_VERSION)  # the version pyproject.toml builds (dynamic)
    entries = [*deprecations.ATTRIBUTES.values(), *deprecations.HOOKS.values(), *deprecations.ARGUMENTS.values()]
    assert entries
    for dep in entries:
        since, removed = version(dep.since), version(dep.removed_in)
        assert removed[:2] >= (since[0], since[1] + 1), f"{dep.old}: removed before a minor version went by"
        # the version that removes it has not been reached: remove it (CHANGELOG: Removed) before releasing it
        assert removed > current, f"{dep.old} is deprecated until {dep.removed_in}, and the version is now {current}"
        assert dep.new is None or dep.new != dep.old


def test_the_cli_shows_deprecations_unless_told_otherwise(tmp_path):
    old, _ = plugin_folders(tmp_path)
    args = ["run", "--policy", "hrrn:HRRN", "--plugin", "length_mean", "--workload", "chat", "--max-requests", "20",
            "--cost-model", "steps"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONPATH")}
    quiet = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-m", "metroline", *args], cwd=old,
                           env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "DeprecationWarning" not in quiet.stderr
    strict = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-m", "metroline", *args], cwd=old,
                            env=env, capture_output=True, text=True, timeout=300)
    assert strict.returncode == 2
    assert re.search(r"ctx\.hooks is deprecated since metroline 0\.2\.0 .*: use ctx\.hook instead", strict.stderr)
