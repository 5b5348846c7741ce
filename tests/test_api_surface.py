"""The plugin API is declared (`metroline.api`) and kept: its surface equals the committed snapshot
`docs/api_surface.txt`, every change since the last release (`docs/api_surface.released.txt`) is
named in CHANGELOG.md's Unreleased section, and a name is only removed after a deprecation.

The rename tests change the API on purpose, in the test itself (`StepContext.wake_at` renamed
`wake`, a hook argument renamed, a snapshot that lists a name the code lacks), and show each
check failing with a message naming what changed."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from metroline import api
from metroline.core.plugins import api_surface, hookspecs
from metroline.core.plugins.api_surface import (
    CHANGELOG,
    RELEASED,
    SNAPSHOT,
    SurfaceDiff,
    changelog_problems,
    diff,
    key_of,
    mentions,
    read_surface,
    snapshot_problems,
    surface_lines,
    unreleased_sections,
)
from metroline.core.step.context import StepContext


@pytest.fixture(scope="module")
def live() -> list[str]:
    return surface_lines()


def test_the_surface_equals_its_snapshot(live):
    problems = snapshot_problems(live)
    assert not problems, problems[0]


def test_every_change_since_the_release_is_in_the_changelog():
    problems = changelog_problems()
    assert not problems, "\n".join(problems)


def test_the_snapshot_is_what_the_regeneration_command_writes(tmp_path, monkeypatch, capsys):
    out = tmp_path / "api_surface.txt"
    monkeypatch.setattr(api_surface, "SNAPSHOT", out)
    assert api_surface.main(["--write-snapshot"]) == 0
    assert out.read_text() == SNAPSHOT.read_text()
    assert capsys.readouterr().out.startswith(f"wrote {out} (")


def test_python_m_metroline_api_check_passes():
    proc = subprocess.run([sys.executable, "-m", "metroline.api", "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        "the API surface matches its snapshot, and CHANGELOG.md names every change since the last release"
    )


def test_the_surface_covers_what_the_issue_lists(live):
    keys = set(map(key_of, live))
    # every name of metroline.api, each hook with its arguments, StepContext, Sequence and the request models
    assert set(api.__all__) <= keys
    for hook in hookspecs.DECISION_HOOKS + hookspecs.OBSERVER_HOOKS + hookspecs.EDGE_HOOKS:
        args = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
        [line] = [x for x in live if key_of(x) == f"hookspecs.{hook}"]
        assert line.startswith(f"hookspecs.{hook}: hook ({args}) ")
        assert line.endswith(" firstresult") == (hook in hookspecs.DECISION_HOOKS + hookspecs.EDGE_HOOKS)
    assert "hookspecs.select_victim: hook (ctx, requester, reason) decision firstresult" in live
    for member in ("now", "step", "config", "running", "waiting", "swapped", "hook", "wake_at", "num_free_blocks",
                   "cached_prefix_tokens", "is_protected", "blocks_needed", "block_size", "num_blocks"):
        assert f"StepContext.{member}" in keys
    for field in ("token_ids", "tenant", "priority", "arrival_time", "metadata", "state", "finish_reason"):
        assert f"Sequence.{field}" in keys
    assert "SamplingParams.temperature: field Annotated[float, Field(ge=0.0, strict=True, allow_inf_nan=False)] " \
        "= 1.0" in live
    assert "Split.max_prefills: field int | None = None" in live
    assert "Candidates.filter: method (keep: Callable[[Sequence], bool], admitted: Callable[[Sequence], Any] | " \
        "None = None) -> Candidates" in live
    assert "PluginError.plugin: attribute" in live
    assert any(key_of(x) == "plugin_options.weighted_fair.weights" for x in live)
    assert "StepContext.hooks: property -> Any [deprecated since 0.2.0, removed in 0.3.0: use ctx.hook]" in live
    assert not [x for x in live if " at 0x" in x]  # nothing that changes from run to run


def test_every_function_and_class_of_the_api_has_a_docstring_of_its_own():
    missing = []
    for name in api.__all__:
        obj = getattr(api, name)
        if isinstance(obj, type) and not vars(obj).get("__doc__"):  # a class's own, not a base's
            missing.append(name)
        elif inspect.isroutine(obj) and not obj.__doc__:
            missing.append(name)
    assert not missing


# --- the checks fail on a deliberate rename ------------------------------------------------------


@pytest.fixture
def wake_at_renamed(monkeypatch):
    """The code as if `StepContext.wake_at` had been renamed `wake`, with no alias."""
    fn = StepContext.wake_at
    monkeypatch.delattr(StepContext, "wake_at")
    monkeypatch.setattr(StepContext, "wake", fn, raising=False)
    return surface_lines()


def test_a_renamed_method_fails_the_snapshot_check_naming_the_removed_name(wake_at_renamed):
    line = "(t: float) -> None"
    assert diff(read_surface(SNAPSHOT), wake_at_renamed) == SurfaceDiff(
        added=[f"StepContext.wake: method {line}"], removed=[f"StepContext.wake_at: method {line}"], changed=[],
    )
    [problem] = snapshot_problems(wake_at_renamed)
    assert problem.splitlines()[:3] == [
        "the plugin API surface differs from its snapshot docs/api_surface.txt:",
        f"  removed   StepContext.wake_at: method {line}",
        f"  added     StepContext.wake: method {line}",
    ]
    assert problem.endswith("name StepContext.wake, StepContext.wake_at in CHANGELOG.md's Unreleased section "
                            "(a removed name must be deprecated first)")
    with pytest.raises(AssertionError, match=r"removed   StepContext\.wake_at"):
        test_the_surface_equals_its_snapshot(wake_at_renamed)


def test_a_renamed_method_with_a_new_snapshot_still_fails_without_changelog_and_deprecation(wake_at_renamed):
    changelog = CHANGELOG.read_text()
    problems = changelog_problems(wake_at_renamed, read_surface(RELEASED), changelog)
    assert problems == [
        "StepContext.wake: changed since the last release but not named in CHANGELOG.md's Unreleased section "
        "(under Added, Changed, Deprecated, Removed)",
        "StepContext.wake_at: changed since the last release but not named in CHANGELOG.md's Unreleased section "
        "(under Added, Changed, Deprecated, Removed)",
        "StepContext.wake_at: removed, but not named under Unreleased's Removed",
        "StepContext.wake_at: removed without being deprecated in the last release (keep it working with a "
        "deprecation warning for a minor version first: metroline.core.plugins.deprecations)",
    ]
    # naming both in the changelog is not enough: the old name had to be deprecated first
    named = changelog.replace("### Deprecated\n", "### Removed\n\n- `StepContext.wake_at`: use `StepContext.wake`."
                              "\n\n### Deprecated\n", 1)
    assert changelog_problems(wake_at_renamed, read_surface(RELEASED), named) == problems[3:]


def test_a_renamed_hook_argument_changes_the_hooks_line(monkeypatch):
    def select_victim(ctx, seq, reason):
        """select_victim with `requester` renamed `seq`."""

    spec = hookspecs.hookspec(firstresult=True)(select_victim)
    monkeypatch.setattr(hookspecs, "select_victim", spec)
    d = diff(read_surface(SNAPSHOT), surface_lines())
    assert d == SurfaceDiff(changed=[(
        "hookspecs.select_victim: hook (ctx, requester, reason) decision firstresult",
        "hookspecs.select_victim: hook (ctx, seq, reason) decision firstresult",
    )])


def test_a_snapshot_listing_a_name_the_code_lacks_fails(live):
    """The snapshot edited by hand as if `Candidates.filter` were still there under its old name
    `keep`: the code's `filter` is new to it and `keep` is gone."""
    modified = [x.replace("Candidates.filter:", "Candidates.keep:") for x in read_surface(SNAPSHOT)]
    [problem] = snapshot_problems(live, modified)
    assert "\n  removed   Candidates.keep: method (" in problem
    assert "\n  added     Candidates.filter: method (" in problem


def test_a_name_deprecated_in_the_release_may_be_removed_when_the_changelog_says_so():
    released = ["StepContext: class (...)", "StepContext.hooks: property -> Any [deprecated since 0.2.0, removed in 0.3.0: "
                "use ctx.hook]", "StepContext.hook: attribute"]
    now = ["StepContext: class (...)", "StepContext.hook: attribute"]
    good = "## [Unreleased]\n\n### Removed\n\n- `StepContext.hooks` (deprecated in 0.2.0): use `ctx.hook`.\n\n## [0.2.0]\n"
    assert changelog_problems(now, released, good) == []
    elsewhere = good.replace("### Removed", "### Changed")
    assert changelog_problems(now, released, elsewhere) == [
        "StepContext.hooks: removed, but not named under Unreleased's Removed"]
    in_an_old_release = "## [Unreleased]\n\n## [0.2.0]\n\n### Removed\n\n- `StepContext.hooks`\n"
    assert changelog_problems(now, released, in_an_old_release)[0].startswith("StepContext.hooks: changed since")


def test_mentions_names_whole_keys_only():
    assert mentions("- `Candidates.filter` takes ...", "Candidates.filter")
    assert not mentions("- `Candidates.filter` takes ...", "Candidates")
    assert mentions("- `Candidates` and `Split`", "Candidates")
    assert mentions("`StepContext.hooks` (`ctx.hooks`)", "StepContext.hooks")
    assert not mentions("`StepContext.hooks_old`", "StepContext.hooks")
    assert mentions("hookspecs.select_victim(", "hookspecs.select_victim")


def test_unreleased_sections_are_read_from_the_changelog():
    sections = unreleased_sections(CHANGELOG.read_text())
    assert set(sections) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert mentions(sections["Deprecated"], "StepContext.hooks")
    assert unreleased_sections("# Changelog\n\n## [0.1.0]\n\n### Added\n- x\n") == {}
