"""The shipped plugins use the public plugin API only: every module of `policies/` and
`plugins_contrib/` imports from metroline nothing but `metroline.api` (and other shipped plugins'
modules, which are public by name), so an outside author can write any of them. The scan reads
the source (`ast`): imports inside functions and under `TYPE_CHECKING` count too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_PACKAGES = ("policies", "plugins_contrib")
ALLOWED = ("metroline.api", "metroline.policies", "metroline.plugins_contrib")


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """`(line, module)` of every import of `path` that names a module of metroline (relative ones
    resolved against the file's package)."""
    package = ["metroline", *path.relative_to(root).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("metroline"):
                if module in ("metroline", "metroline.policies", "metroline.plugins_contrib") or (
                    node.level and not node.module
                ):  # `from metroline import api`, `from . import x`: the names are modules
                    found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
                else:
                    found.append((node.lineno, module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("metroline")]
    return found


def allowed(module: str) -> bool:
    """Whether a plugin module may import `module`: the plugin API, or a shipped plugin's module."""
    return module == "metroline.api" or any(module == p or module.startswith(p + ".") for p in ALLOWED[1:])


def internal_imports(root: Path) -> list[str]:
    """`file:line: module` for each import of a plugin module that reaches past `metroline.api`."""
    bad = []
    for package in PLUGIN_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for line, module in sorted(imported_modules(path, root)):
                if not allowed(module):
                    bad.append(f"{path.relative_to(root)}:{line}: {module}")
    return bad


def test_shipped_plugins_import_only_the_public_api():
    assert internal_imports(ROOT) == []


def test_the_scan_finds_an_internal_import(tmp_path):
    (tmp_path / "policies" / "routing").mkdir(parents=True)
    (tmp_path / "plugins_contrib").mkdir()
    (tmp_path / "policies" / "ok.py").write_text(
        "from metroline.api import hookimpl\nfrom ..api import Split\nfrom .srpt import SRPT\nimport json\n"
    )
    (tmp_path / "policies" / "routing" / "bad.py").write_text(
        "def f():\n    from ...core.plugins.hookspecs import hookimpl\n"
    )
    (tmp_path / "plugins_contrib" / "bad.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from metroline.core.step.context import StepContext\n"
        "from metroline import core\n"
    )
    assert internal_imports(tmp_path) == [
        "policies/routing/bad.py:2: metroline.core.plugins.hookspecs",
        "plugins_contrib/bad.py:3: metroline.core.step.context",
        "plugins_contrib/bad.py:4: metroline.core",
    ]
