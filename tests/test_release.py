"""The version is written once and the changelog and the deprecations agree with it.

`metroline.__version__` is the version `pyproject.toml` builds (`dynamic = ["version"]`); the
changelog's first section is that version's; every deprecated name works until a later version,
which its warning and its changelog entry name.
"""

import re
import tomllib
from pathlib import Path

import metroline
from metroline.core import moved
from metroline.core.plugins import deprecations

ROOT = Path(__file__).resolve().parent.parent


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_pyproject_builds_the_package_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "metroline.__version__"}


def test_the_changelog_opens_with_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([\d.]+)\]", changelog, re.M)
    assert versions[0] == metroline.__version__
    assert versions == sorted(versions, key=_version, reverse=True)


def test_every_deprecation_names_a_later_removal():
    current = _version(metroline.__version__)
    registered = [*deprecations.ATTRIBUTES.values(), *deprecations.HOOKS.values(), *deprecations.ARGUMENTS.values()]
    for dep in registered:
        assert _version(dep.since) <= current < _version(dep.removed_in), dep
        assert f"will be removed in {dep.removed_in}" in dep.message("plugin 'x'")
    assert _version(deprecations.MODULES_MOVED_IN) <= current < _version(deprecations.MODULES_REMOVED_IN)
    assert moved.OLD_PATHS


def test_every_changelog_deprecation_names_its_removal_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    section = re.search(r"^## \[[^\n]*\n(.*?)(?=^## \[)", changelog, re.S | re.M).group(1)
    deprecated = re.search(r"^### Deprecated\n(.*?)(?=^### |\Z)", section, re.S | re.M).group(1)
    entries = [e for e in re.split(r"^- ", deprecated, flags=re.M) if e.strip()]
    assert entries
    for entry in entries:
        named = re.findall(r"(?:removed in|goes in|go in) (\d+\.\d+\.\d+)", entry)
        assert named and all(_version(v) > _version(metroline.__version__) for v in named), entry
