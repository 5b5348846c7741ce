"""The package's shape: `import metroline` imports no torch, and the import graph of `metroline` is
acyclic: at module level (what runs at import), and with the imports inside functions and under
`TYPE_CHECKING` too (the core's old circles engine<->stall, parallel<->ray_runner and
sampling<->sampling_torch are gone). The graph is built from the source with `ast`, so a cycle is
found whether or not some test happens to import both modules. The old import paths of moved
modules still give the same objects, warning once."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "policies", "kv_backends", "executors", "plugins_contrib")


def module_files() -> dict[str, Path]:
    """`metroline...` module name -> its file, for every module of the package."""
    files = {"metroline": ROOT / "__init__.py"}
    for top in [ROOT / p for p in PACKAGES] + list(ROOT.glob("*.py")):
        paths = [top] if top.is_file() else sorted(top.rglob("*.py"))
        for path in paths:
            rel = path.relative_to(ROOT).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if parts and parts != ["__main__"]:
                files[".".join(["metroline", *parts])] = path
    return files


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, module: str, is_package: bool, modules: set[str], module_level_only: bool) -> set[str]:
    """The `metroline` modules `path` imports (a `from pkg import name` of a submodule counts as
    that submodule; importing `a.b.c` also runs the packages `a.b` and `a`)."""
    tree = ast.parse(path.read_text())
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        while name:
            if name != module:
                found.add(name)
            name = name.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("metroline"):
                        add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("metroline"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    add(sub if sub in modules else target)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                if not module_level_only:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not module_level_only or isinstance(node, ast.ClassDef):
                    visit(node.body)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, field, []) or []:
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(tree.body)
    return found


def graph(module_level_only: bool) -> dict[str, set[str]]:
    files = module_files()
    names = set(files)
    return {m: imports(p, m, p.name == "__init__.py", names, module_level_only) for m, p in files.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `edges` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := dfs(node)):
            return found
    return None


def ignoring_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges between modules, without those into packages a module only sits in (a package's
    `__init__` runs before its modules; an edge from a package's module to the package itself is
    the parent being loaded, not a circle)."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}


def test_module_level_imports_are_acyclic():
    cycle = find_cycle(ignoring_packages(graph(module_level_only=True)))
    assert cycle is None, " -> ".join(cycle)


def test_no_circle_even_through_imports_inside_functions():
    cycle = find_cycle(ignoring_packages(graph(module_level_only=False)))
    assert cycle is None, " -> ".join(cycle)


def test_the_graph_sees_a_planted_cycle():
    """The checker is not blind: a cycle added to the real graph is found."""
    edges = ignoring_packages(graph(module_level_only=True))
    edges["metroline.core.errors"] = edges["metroline.core.errors"] | {"metroline.core.step.engine"}
    cycle = find_cycle(edges)
    assert cycle is not None and "metroline.core.errors" in cycle


def test_importing_metroline_imports_no_torch():
    code = "import sys, metroline, metroline.api, metroline.core.step.engine; print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers', 'triton'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_core_folders_read_top_down():
    """core/ holds its subpackages and only what every part shares."""
    top = sorted(p.name for p in (ROOT / "core").glob("*.py"))
    assert top == ["__init__.py", "config.py", "diagnostics.py", "errors.py", "moved.py", "speculative_config.py"]


@pytest.mark.parametrize("old, new, name", [
    ("metroline.core.hookspecs", "metroline.core.plugins.hookspecs", "hookimpl"),
    ("metroline.core.engine", "metroline.core.step.engine", "Engine"),
    ("metroline.core.candidates", "metroline.core.plugins.candidates", "Candidates"),
    ("metroline.core.sampling_torch", "metroline.executors.torch.sampling", "sample_tensor"),
])
def test_old_import_paths_give_the_same_objects_with_one_warning(old, new, name):
    code = f"""
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from {old} import {name} as a
    from {old} import {name} as b
from {new} import {name} as c
assert a is b is c
moved = [w for w in caught if "moved to" in str(w.message)]
assert len(moved) == 1 and "{new}" in str(moved[0].message), [str(w.message) for w in caught]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize("load", ["import old_plugin", "import importlib; importlib.import_module('old_plugin')"])
def test_an_old_import_path_warns_at_the_importing_line_with_the_installed_version(tmp_path, load):
    (tmp_path / "old_plugin.py").write_text("import os\nfrom metroline.core.candidates import Candidates\n")
    code = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    LOAD
[w] = [w for w in caught if "moved to" in str(w.message)]
print(w.filename.rsplit("/", 1)[-1], w.lineno, str(w.message))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT.parent)])}
    out = subprocess.run([sys.executable, "-c", code.replace("LOAD", load)], capture_output=True, text=True, env=env, cwd=tmp_path)
    import metroline

    assert out.stdout.startswith("old_plugin.py 2 metroline.core.candidates moved to"), out.stderr[-2000:]
    assert f"(installed: metroline {metroline.__version__})" in out.stdout


def test_old_module_that_is_now_a_package_answers_its_names():
    from metroline.core.plugins.manager import PluginManager
    from metroline.core.workloads.build import build_workload

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from metroline.core.plugins import PluginManager as old_manager
        from metroline.core.workloads import build_workload as old_build
    assert old_manager is PluginManager and old_build is build_workload
    assert any("metroline.core.plugins.manager" in str(w.message) for w in caught)
    with pytest.raises(ImportError):
        from metroline.core.plugins import no_such_name  # noqa: F401


def test_an_executor_with_tensors_and_no_sampler_class_still_samples_with_a_warning():
    """Before 0.2.0 the core sampled tensors itself; such an executor keeps working, warned once."""
    from sampling_models import LinearModel

    from metroline.core.step.engine import Engine

    class OldExecutor(LinearModel):
        sampler_class = None

    request = {"request_id": "a", "prompt_token_ids": [1, 2, 3],
               "sampling": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = Engine({"num_blocks": 16, "block_size": 4}, OldExecutor(vocab_size=32)).generate([request])
    assert [str(w.message) for w in caught if "sampler_class" in str(w.message)]
    new = Engine({"num_blocks": 16, "block_size": 4}, LinearModel(vocab_size=32)).generate([request])
    assert old["a"][0].output_token_ids == new["a"][0].output_token_ids
