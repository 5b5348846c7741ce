"""bench/mutate.py, the mutation tool: the mutants it makes from a small source, and a mutant
applied to a private copy of a tree, run against a test file, and the original put back."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def mutate():
    spec = importlib.util.spec_from_file_location("metroline_bench_mutate", BENCH / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up by name
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""A docstring with 1 < 2 in it is not mutated."""


def clamp(x: int = 5, items=None):
    if x is None:
        return 0
    if x < 3 and not items:
        x = x + 1
    return min(x, 9)


def order(seqs):
    return sorted(seqs, key=lambda s: (s.arrival, s.index))
'''

EXPECTED = {
    ("int", "def clamp(x: int = 5, items=None):", "def clamp(x: int = 6, items=None):"),
    ("int", "def clamp(x: int = 5, items=None):", "def clamp(x: int = 4, items=None):"),
    ("compare", "if x is None:", "if x is not None:"),
    ("drop-guard", "if x is None: return 0", "pass"),
    ("int", "return 0", "return 1"),
    ("int", "return 0", "return -1"),
    ("bool-op", "if x < 3 and not items:", "if x < 3 or not items:"),
    ("negate", "if x < 3 and not items:", "if not (x < 3 and not items):"),
    ("compare", "if x < 3 and not items:", "if x <= 3 and not items:"),
    ("int", "if x < 3 and not items:", "if x < 4 and not items:"),
    ("int", "if x < 3 and not items:", "if x < 2 and not items:"),
    ("drop-not", "if x < 3 and not items:", "if x < 3 and items:"),
    ("plus-one", "x = x + 1", "x = x - 1"),
    ("int", "x = x + 1", "x = x + 2"),
    ("int", "x = x + 1", "x = x + 0"),
    ("min-max", "return min(x, 9)", "return max(x, 9)"),
    ("int", "return min(x, 9)", "return min(x, 10)"),
    ("int", "return min(x, 9)", "return min(x, 8)"),
    ("tie-break", "return sorted(seqs, key=lambda s: (s.arrival, s.index))",
     "return sorted(seqs, key=lambda s: (s.index, s.arrival))"),
}


def test_the_mutants_of_a_small_source_are_exactly_the_expected_single_point_changes(mutate):
    mutants = mutate.generate("lib.py", SOURCE)
    assert {(m.operator, m.before, m.after) for m in mutants} == EXPECTED
    assert len(mutants) == len(EXPECTED)
    original = ast.dump(ast.parse(SOURCE))
    for m in mutants:
        # each compiles, differs from the original, and changes only the lines it names
        assert ast.dump(ast.parse(m.source)) != original
        changed = [i + 1 for i, (a, b) in enumerate(zip(SOURCE.splitlines(), m.source.splitlines()))
                   if a != b]
        assert changed and changed[0] == m.line


def test_a_mutant_is_named_by_its_text_not_its_line_number(mutate):
    shifted = mutate.generate("lib.py", "\n\n# a comment\n" + SOURCE)
    assert ({m.key for m in shifted} == {m.key for m in mutate.generate("lib.py", SOURCE)})
    assert {m.line for m in shifted} == {m.line + 3 for m in mutate.generate("lib.py", SOURCE)}


def test_identical_lines_get_their_occurrence(mutate):
    mutants = mutate.generate("lib.py", "a = 1\nb = 2\na = 1\n")
    assert [(m.line, m.after, m.occurrence) for m in mutants if m.before == "a = 1"] == [
        (1, "a = 0", 0), (1, "a = 2", 0), (3, "a = 0", 1), (3, "a = 2", 1)]


def source_tree(tmp_path, test_source: str):
    """A tree with `lib.py` (`SOURCE`) and a test module of `test_source` under its tests folder."""
    root = tmp_path / "tree"
    (root / "tests").mkdir(parents=True)
    (root / "lib.py").write_text(SOURCE)
    (root / "tests" / "test_lib.py").write_text(test_source)
    return root


def test_a_mutant_runs_in_a_private_copy_and_the_original_is_put_back(mutate, tmp_path):
    root = source_tree(tmp_path,
        "from metroline.lib import clamp\n\n"
        "def test_clamp():\n"
        "    assert clamp(50) == 9\n")
    mutants = {(m.operator, m.after): m for m in mutate.generate("lib.py", SOURCE)}
    ws = mutate.Workspace(root)
    try:
        assert ws.pytest(["tests/test_lib.py"], timeout=600)[0] == "passed"
        timeouts = {(sys.executable, "tests/test_lib.py"): 600}  # generous: a loaded machine must not turn a kill into a timeout
        killed = mutants[("min-max", "return max(x, 9)")]
        assert mutate.run_mutant(ws, killed, ["tests/test_lib.py"], [], timeouts) == (
            "killed", "own")
        # clamp(50) is 9 whether or not `x is None` returns early: the test cannot see that guard
        guard = mutants[("drop-guard", "pass")]
        assert mutate.run_mutant(ws, guard, ["tests/test_lib.py"], [], timeouts) == (
            "survived", "")
        # after each run the copy holds the original again, and the tree itself was never touched
        assert (ws.tree / "lib.py").read_text() == SOURCE
        assert (root / "lib.py").read_text() == SOURCE
    finally:
        ws.close()
    assert not ws.dir.exists()


def test_an_entry_runs_its_tests_with_the_python_it_names(mutate, tmp_path, monkeypatch):
    # the vLLM bridge's tests need a Python that has vLLM: an entry's `python` names it, `$NAME`
    # read from the environment; the tests run with it, and a missing one is refused by name
    config = tmp_path / "mutation.toml"
    config.write_text(
        '[[group.g.modules]]\npaths = ["lib.py"]\ntests = ["tests/test_lib.py"]\n'
        'python = "$MUTATE_TEST_PYTHON"\n'
        '[[group.h.modules]]\npaths = ["other.py"]\ntests = ["tests/test_other.py"]\n')
    loaded = mutate.load_config(config)
    assert loaded.python == {"lib.py": "$MUTATE_TEST_PYTHON", "other.py": ""}
    assert mutate.interpreter("") == sys.executable
    monkeypatch.delenv("MUTATE_TEST_PYTHON", raising=False)
    with pytest.raises(ValueError, match=r"\$MUTATE_TEST_PYTHON is not set"):
        mutate.interpreter(loaded.python["lib.py"])
    monkeypatch.setenv("MUTATE_TEST_PYTHON", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="is not an executable"):
        mutate.interpreter(loaded.python["lib.py"])

    # a wrapper that marks its runs: the test file passes only under it
    wrapper = tmp_path / "marked-python"
    wrapper.write_text(f'#!/bin/sh\nMUTATE_MARK=wrapped exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("MUTATE_TEST_PYTHON", str(wrapper))
    python = mutate.interpreter(loaded.python["lib.py"])
    assert python == str(wrapper)
    root = source_tree(tmp_path,
        "import os\nfrom metroline.lib import clamp\n\n"
        "def test_clamp_under_the_wrapper():\n"
        "    assert os.environ.get('MUTATE_MARK') == 'wrapped'\n"
        "    assert clamp(50) == 9\n")
    ws = mutate.Workspace(root)
    try:
        assert ws.pytest(["tests/test_lib.py"], timeout=600)[0] == "failed"
        assert ws.pytest(["tests/test_lib.py"], timeout=600, python=python)[0] == "passed"
        killed = next(m for m in mutate.generate("lib.py", SOURCE) if m.after == "return max(x, 9)")
        timeouts = {(python, "tests/test_lib.py"): 600}
        assert mutate.run_mutant(ws, killed, ["tests/test_lib.py"], [], timeouts, python) == (
            "killed", "own")
    finally:
        ws.close()
