"""The plugin API's surface (`metroline.api`), its committed snapshot, and the changelog rule.

The surface is rendered as text by `metroline.core.plugins.api_render` (`surface_lines`, one line
`KEY: description` per public name, member, field, hook and shipped plugin option; `key_of`).

Two rules, checked by tests/test_api_surface.py and by `python -m metroline.api --check`:

1. the surface equals the snapshot `docs/api_surface.txt` (`snapshot_problems`);
2. every key whose line differs between the last release's surface
   (`docs/api_surface.released.txt`) and the snapshot is named in CHANGELOG.md's unreleased
   section (`## [Unreleased]`, or the coming version's, `## [0.2.0] - Unreleased`), under Added,
   Changed, Deprecated or Removed; a removed key under Removed, and only if the release had it
   deprecated (`changelog_problems`).

`python -m metroline.api --write-snapshot` writes the snapshot again. At a release, the
unreleased section is dated and the snapshot is copied to the released surface.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .api_render import key_of, surface_lines

__all__ = [
    "CHANGELOG", "CHANGELOG_SECTIONS", "HEADER", "RELEASED", "SNAPSHOT", "SurfaceDiff", "changelog_problems",
    "diff", "key_of", "main", "mentions", "read_surface", "snapshot_problems", "surface_lines",
    "unreleased_sections", "write_snapshot",
]

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "docs" / "api_surface.txt"
"""The committed snapshot of the surface."""
RELEASED = ROOT / "docs" / "api_surface.released.txt"
"""The surface of the last release."""
CHANGELOG = ROOT / "CHANGELOG.md"
CHANGELOG_SECTIONS = ("Added", "Changed", "Deprecated", "Removed")
"""The subsections of Unreleased where an API change is named."""
HEADER = "# metroline's plugin API surface (metroline.api): one line per name; see metroline.core.plugins.api_surface\n"


UNRELEASED = re.compile(r"^## \[(?:Unreleased\]|[^\]\n]+\] - Unreleased)[^\n]*\n(.*?)(?=^## |\Z)", re.S | re.M)
"""The changelog's section of the changes not released yet: `## [Unreleased]`, or the coming
version's, `## [0.2.0] - Unreleased`."""


# --- the rules -----------------------------------------------------------------------------------


@dataclass
class SurfaceDiff:
    """How a surface differs from another (lines keyed by `key_of`)."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)

    def keys(self) -> list[str]:
        """Every key that was added, removed or changed."""
        return sorted({*map(key_of, self.added), *map(key_of, self.removed), *(key_of(a) for a, _ in self.changed)})

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def __str__(self) -> str:
        out = [f"  removed   {line}" for line in self.removed]
        for old, new in self.changed:
            out += [f"  changed   {old}", f"        now {new}"]
        out += [f"  added     {line}" for line in self.added]
        return "\n".join(out)


def diff(old: Iterable[str], new: Iterable[str]) -> SurfaceDiff:
    """The keys of `new` that `old` lacks, those `new` lacks, and those whose line differs."""
    a = {key_of(line): line for line in old}
    b = {key_of(line): line for line in new}
    return SurfaceDiff(
        added=[b[k] for k in sorted(b.keys() - a.keys())],
        removed=[a[k] for k in sorted(a.keys() - b.keys())],
        changed=[(a[k], b[k]) for k in sorted(a.keys() & b.keys()) if a[k] != b[k]],
    )


def read_surface(path: Path) -> list[str]:
    """The lines of a surface file (comments and blank lines left out)."""
    return [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def write_snapshot(path: Path | None = None) -> None:
    """Write the code's surface to `path` (default: the snapshot, `SNAPSHOT`)."""
    (SNAPSHOT if path is None else path).write_text(HEADER + "\n".join(surface_lines()) + "\n")


def snapshot_problems(live: list[str] | None = None, snapshot: list[str] | None = None) -> list[str]:
    """Why the code's surface (`live`) differs from the snapshot: one message with the diff, or
    none."""
    live = surface_lines() if live is None else live
    snapshot = read_surface(SNAPSHOT) if snapshot is None else snapshot
    d = diff(snapshot, live)
    if not d:
        return []
    return [
        "the plugin API surface differs from its snapshot docs/api_surface.txt:\n" + str(d) + "\n"
        "if this change is meant, run `python -m metroline.api --write-snapshot` and name "
        f"{', '.join(d.keys())} in CHANGELOG.md's Unreleased section (a removed name must be deprecated first)"
    ]


def unreleased_sections(changelog: str) -> dict[str, str]:
    """The subsections (`### Added`, ...) of the changelog's unreleased section (`## [Unreleased]`
    or `## [X.Y.Z] - Unreleased`), by heading."""
    m = UNRELEASED.search(changelog)
    if m is None:
        return {}
    parts = re.split(r"^### +(.+?) *$", m.group(1), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def mentions(text: str, key: str) -> bool:
    """Whether `text` names `key` as a whole (not as the start of a longer dotted name)."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?!\w|\.\w|\(\w)", text) is not None


def changelog_problems(
    snapshot: list[str] | None = None, released: list[str] | None = None, changelog: str | None = None
) -> list[str]:
    """Why the changelog does not account for the surface's changes since the last release: each
    key that changed and is not named under Added/Changed/Deprecated/Removed of Unreleased, a
    removed key not named under Removed, and a key removed that the release had not deprecated."""
    snapshot = read_surface(SNAPSHOT) if snapshot is None else snapshot
    released = read_surface(RELEASED) if released is None else released
    changelog = CHANGELOG.read_text() if changelog is None else changelog
    sections = unreleased_sections(changelog)
    if not sections and UNRELEASED.search(changelog) is None:
        return ["CHANGELOG.md has no unreleased section ('## [Unreleased]' or '## [X.Y.Z] - Unreleased')"]
    api_text = "\n".join(text for heading, text in sections.items() if heading in CHANGELOG_SECTIONS)
    d = diff(released, snapshot)
    problems = []
    for key in d.keys():
        if not mentions(api_text, key):
            problems.append(f"{key}: changed since the last release but not named in CHANGELOG.md's Unreleased "
                            f"section (under {', '.join(CHANGELOG_SECTIONS)})")
    for line in d.removed:
        key = key_of(line)
        if not mentions(sections.get("Removed", ""), key):
            problems.append(f"{key}: removed, but not named under Unreleased's Removed")
        if "[deprecated since" not in line:
            problems.append(f"{key}: removed without being deprecated in the last release (keep it working "
                            "with a deprecation warning for a minor version first: metroline.core.plugins.deprecations)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """`python -m metroline.api [--write-snapshot | --check]`: print the surface, write it to the
    snapshot, or check the snapshot and the changelog (exit 1 on a problem)."""
    parser = argparse.ArgumentParser(prog="python -m metroline.api", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write-snapshot", action="store_true", help=f"write the surface to {SNAPSHOT}")
    group.add_argument("--check", action="store_true",
                       help="check the surface against the snapshot and the changelog (exit 1 on a problem)")
    args = parser.parse_args(argv)
    if args.write_snapshot:
        write_snapshot()
        print(f"wrote {SNAPSHOT} ({len(surface_lines())} lines); name the changed keys in CHANGELOG.md's Unreleased")
        problems = changelog_problems()
        for p in problems:
            print(f"changelog: {p}")
        return 0
    if args.check:
        problems = snapshot_problems() + changelog_problems()
        for p in problems:
            print(p)
        if not problems:
            print("the API surface matches its snapshot, and CHANGELOG.md names every change since the last release")
        return 1 if problems else 0
    print("\n".join(surface_lines()))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
