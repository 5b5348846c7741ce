"""The modules a plugin's code runs, for the manifest: every module its defining module imports,
directly or through another such module, that is neither the standard library, an installed
package (site-packages) nor metroline itself (which the manifest's commit and diff cover). A
plugin's helper module edited between a run and its replay changes the results; `replay` names
it (`replay_check.changed_inputs`).

Imports are read from the modules' source (`ast`: `import a.b`, `from . import c`, `from .d import
e`, at any depth of the file, so imports inside functions count too) and resolved among the
modules already imported, else located without being imported (`importlib.util.find_spec`, when
its package is imported: an import inside a function that has not run yet still counts). A name
that cannot be located so is left out.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

_EXCLUDED = tuple(str(Path(p).resolve()) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
_METROLINE = str(Path(__file__).resolve().parents[2])


def own_file(path: str | None) -> Path | None:
    """`path` when it is a plugin author's source file (see the module docstring), else None."""
    if not path or not path.endswith(".py"):
        return None
    resolved = str(Path(path).resolve())
    if resolved.startswith(_EXCLUDED) or resolved.startswith(_METROLINE + "/") or "site-packages" in resolved:
        return None
    return Path(resolved)


def _locate(name: str) -> tuple[str | None, str]:
    """The source file of module `name` and its package (`__package__`): from `sys.modules`, else
    found without importing it; (None, "") when it cannot be found."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__file__", None), loaded.__package__ or ""
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:  # find_spec would import the parent: run no code here
        return None, ""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None, ""
    if spec is None or not spec.has_location:
        return None, ""
    return spec.origin, name if spec.submodule_search_locations is not None else name.rpartition(".")[0]


def _imported_names(package: str, source: str) -> set[str]:
    """The absolute names of the modules `source` (the code of a module of `package`) imports,
    and of the names it imports from a package (some may be modules themselves)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            try:
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level else node.module
            except (ImportError, ValueError):
                continue
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def imported_modules(module: ModuleType) -> dict[str, str]:
    """`{module name: sha256 of its source}` of every plugin author's module `module` imports
    (see the module docstring), `module` itself left out; sorted by name."""
    found: dict[str, str] = {}
    todo = [(module.__name__, getattr(module, "__file__", None), module.__package__ or "")]
    seen = {module.__name__}
    while todo:
        name, file, package = todo.pop()
        path = own_file(file)
        if path is None:
            continue
        source = path.read_bytes()
        if name != module.__name__:
            found[name] = hashlib.sha256(source).hexdigest()
        for imported in sorted(_imported_names(package, source.decode("utf-8", "replace")) - seen):
            seen.add(imported)
            located, its_package = _locate(imported)
            if located is not None:
                todo.append((imported, located, its_package))
    return dict(sorted(found.items()))
