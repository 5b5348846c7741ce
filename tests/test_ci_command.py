"""The README's test command is the one `.ci/run` runs, and it runs the whole suite (slow tests
too) in worker processes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def logical_lines(text: str) -> list[str]:
    """`text`'s shell lines with backslash continuations joined and spaces collapsed."""
    return [" ".join(line.split()) for line in re.sub(r"\\\n", " ", text).splitlines()]


def test_the_readme_test_command_is_the_one_ci_runs():
    readme = [line for line in logical_lines((ROOT / "README.md").read_text()) if "pip install -q -e '.[test]'" in line]
    ci = [line for line in logical_lines((ROOT / ".ci" / "run").read_text()) if "pip install -q -e '.[test]'" in line]
    assert len(readme) == 1 and ci == readme
    assert readme[0].endswith("python -m pytest --runslow -n 2 --dist loadfile")
