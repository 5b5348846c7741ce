"""The deprecated module paths a plugin's source imports (`metroline.core.hookspecs`, moved in
0.2.0: `metroline.core.moved`), read from the source of the module that defines it (and of the
other modules of its package that it imports), with the line of each import."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from ..moved import OLD_PATHS
from ..plugins.deprecations import MODULES_MOVED_IN, MODULES_REMOVED_IN


def deprecated_imports(target: Any) -> list[str]:
    """One line per import of a moved `metroline.core.<name>` module in the source of `target`'s
    module: `file:line: imports <old module>, moved to <new module> in 0.2.0 ...`."""
    module = inspect.getmodule(target if inspect.isclass(target) or inspect.isfunction(target) else type(target))
    if module is None:
        return []
    try:
        source, path = inspect.getsource(module), inspect.getsourcefile(module) or module.__name__
    except (OSError, TypeError):
        return []
    lines = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for full in names:
            old = _moved(full)
            if old is not None:
                lines.append(
                    f"{path}:{node.lineno}: imports metroline.core.{old}, moved to metroline.{OLD_PATHS[old]} in "
                    f"{MODULES_MOVED_IN} (removed in {MODULES_REMOVED_IN}; import metroline.api instead)")
                break
    return lines


def _moved(dotted: str) -> str | None:
    parts = dotted.split(".")
    if len(parts) == 3 and parts[:2] == ["metroline", "core"] and parts[2] in OLD_PATHS:
        return parts[2]
    return None
