"""Every reference the docs and the code's docstrings and comments make resolves.

Three kinds of reference are checked, in README.md, docs/*.md, docs/*.rst and the docstrings,
comments and command-line texts (the `help=`, `description=`, `epilog=` and `usage=` strings of
argparse, what `--help` prints) of every tracked Python file:

- a repository path (`core/step/engine.py`, `tests/data/`, `docs/plugins.md`): a file or folder
  that exists, from the repository root, or from the referring file's folder or one above it, or
  as the tail of a tracked path (a table row naming `routing/` under `policies/`); a path given
  to a flag (`--out tests/data/new.json`) is an output, not a reference;
- a dotted name under the package, with its `metroline.` prefix or without it from one of the
  package's folders (`metroline.core.step.admission`, `core.step.admission`,
  `metroline.api.StepContext`, `policies.fcfs.FCFS`): a module that exists, and the first name
  after the module defined at its top level (a class's member after it, when the class is in
  that module); an entry-point group (`metroline.plugins`) resolves too. A moved module's old
  path (`metroline.core.moved.OLD_PATHS`) still imports, for users' code, but is stale in our
  own text: it resolves only on a line that says it moved or is deprecated;
- a design document in capitals (`DESIGN.md`, `ARCHITECTURE.md`): a file of the repository.

CHANGELOG.md is not scanned: it records history, and names the modules' paths before they moved
(nor is this file, whose docstrings show examples).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_SUFFIXES = {".md", ".rst"}
NOT_SCANNED = {"CHANGELOG.md", "tests/test_references.py"}  # history; this file's examples
EXTENSIONS = "py|md|rst|toml|txt|json|jsonl|csv|cfg|ini|whl"

PATH = re.compile(
    rf"(?<![\w./:@~-])((?:\.?[A-Za-z_][\w.-]*/)+(?:[\w.-]+\.(?:{EXTENSIONS})\b|(?=[\s`'\"),;:]|$)))"
)
MODULE = re.compile(r"(?<![\w./])metroline(?:\.[A-Za-z_]\w*)+")
PACKAGE_FOLDERS = ("core", "policies", "kv_backends", "executors", "plugins_contrib")
BARE_MODULE = re.compile(rf"(?<![\w./-])(?:{'|'.join(PACKAGE_FOLDERS)})(?:\.[A-Za-z_]\w*)+")
"""A dotted name from one of the package's folders, without `metroline.` (`core.step.engine`)."""
MOVED_CONTEXT = re.compile(r"\b(moved|deprecated|old path|old name|formerly|renamed)\b", re.I)
CLI_TEXT_KEYWORDS = {"help", "description", "epilog", "usage"}
DESIGN_DOC = re.compile(r"(?<![\w./-])([A-Z][A-Z_]{2,}\.(?:md|rst|txt))\b")


@dataclass(frozen=True)
class Dangling:
    """One reference that does not resolve: where it is, what it names."""

    file: str
    line: int
    kind: str
    target: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind} {self.target!r} does not exist"


def tracked_files(root: Path) -> list[Path]:
    """The repository's tracked files (every file but ignored ones where git is missing)."""
    try:
        out = subprocess.run(
            ["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True
        ).stdout.split()
        return [root / p for p in out if (root / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "dist", "__pycache__", "_build"}
        return [p for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


def texts_of(path: Path) -> list[tuple[int, str]]:
    """The (line, text) pieces of `path` that are prose: a doc file whole, a Python file's
    docstrings and comments."""
    source = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in DOC_SUFFIXES:
        return [(i, line) for i, line in enumerate(source.splitlines(), 1)]
    pieces: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                pieces.append((tok.start[0], tok.string))
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError):
        return pieces
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        # a docstring: the first statement of a module, class or function, and a string right
        # after an assignment (an attribute's docstring)
        candidates = []
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            candidates.append(body[0])
        candidates += [b for a, b in zip(body, body[1:]) if isinstance(a, (ast.Assign, ast.AnnAssign))]
        for stmt in candidates:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                for offset, line in enumerate(stmt.value.value.splitlines()):
                    pieces.append((stmt.lineno + offset, line))
    pieces += cli_texts(tree)
    return pieces


def cli_texts(tree: ast.AST) -> list[tuple[int, str]]:
    """The command-line texts of a module: every string (the literal parts of an f-string, and
    adjacent literals joined) given as `help=`, `description=`, `epilog=` or `usage=`."""
    pieces: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg not in CLI_TEXT_KEYWORDS:
                continue
            parts = [n.value for n in ast.walk(kw.value)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if parts:
                pieces.append((kw.value.lineno, "".join(parts)))
    return pieces


@lru_cache(maxsize=None)
def _top_level_names(module_file: Path) -> dict[str, ast.ClassDef | None]:
    """The names a module defines or imports at its top level (a class's name maps to its node)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names: dict[str, ast.ClassDef | None] = {}

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names[node.name] = None
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            names[sub.id] = None
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return names


def _class_members(node: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for stmt in ast.walk(node):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(stmt.name)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            members.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            members.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.Attribute) and isinstance(stmt.value, ast.Name) and stmt.value.id == "self":
            members.add(stmt.attr)
    return members


def module_resolves(root: Path, dotted: str) -> bool:
    """Whether `metroline.a.b.Name.member` names a module of the package, and what follows the
    module a name it defines at its top level (and a member of that class, when it is one)."""
    parts = dotted.split(".")[1:]
    folder = root
    module_file = root / "__init__.py"
    i = 0
    while i < len(parts):
        if (folder / parts[i]).is_dir():  # a package, or a namespace package (no __init__.py, as tests/)
            folder = folder / parts[i]
            module_file = folder / "__init__.py"
        elif (folder / f"{parts[i]}.py").is_file():
            module_file = folder / f"{parts[i]}.py"
            i += 1
            break
        else:
            break
        i += 1
    rest = parts[i:]
    if not rest:
        return True
    if not module_file.is_file():  # a namespace package defines no names
        return False
    names = _top_level_names(module_file)
    if "__getattr__" in names:  # a module that answers names of its own (a moved module's)
        return True
    if rest[0] not in names:
        return False
    node = names[rest[0]]
    if len(rest) > 1 and node is not None:
        return rest[1] in _class_members(node) or any(
            isinstance(b, ast.Name) and b.id not in names for b in node.bases
        ) or bool(node.bases)
    return True


def path_resolves(root: Path, referrer: Path, target: str, tails: set[str]) -> bool:
    """Whether the path `target` exists from the root (also as `metroline/...`), from the
    referrer's folder or one of its parents, or is the tail of a tracked path (`tails`)."""
    target = target.rstrip("/")
    if target == "metroline":  # the package: the root
        return True
    if target.startswith("metroline/"):
        target = target[len("metroline/"):]
    bases = [root, *[p for p in referrer.parents if root in p.parents or p == root]]
    return any((base / target).exists() for base in bases) or target in tails


def _tails(paths: list[str]) -> set[str]:
    """Every tail of the tracked paths and of their folders (`a/b/c.py`: `b/c.py`, `c.py`, `b`)."""
    out: set[str] = set()
    for path in paths:
        parts = path.split("/")
        for end in range(1, len(parts) + 1):
            for start in range(1, end):
                out.add("/".join(parts[start:end]))
    return out


def _moved_paths(root: Path) -> set[str]:
    """The old dotted paths of moved modules (the string keys of `OLD_PATHS` in
    `core/moved.py`): they still import, for users' code, but our own text names the new path."""
    names: set[str] = set()
    moved = root / "core" / "moved.py"
    if moved.is_file():
        for node in ast.walk(ast.parse(moved.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "OLD_PATHS" for t in node.targets):
                names |= {f"metroline.core.{k.value}" for k in node.value.keys if isinstance(k, ast.Constant)}
    return names


def _entry_point_groups(root: Path) -> set[str]:
    """The entry-point groups of pyproject.toml (`metroline.plugins`): dotted names that are no
    module."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return set()
    return set(re.findall(r'^\[project\.entry-points\."([\w.]+)"\]', pyproject.read_text(), re.M))


def _our_path(root: Path, target: str, first_dirs: set[str]) -> bool:
    first = target.split("/", 1)[0]
    return first in first_dirs or first == "metroline"


def find_dangling(root: Path, files: list[Path] | None = None) -> list[Dangling]:
    """Every reference in the scanned files of `root` that does not resolve."""
    every = tracked_files(root)
    files = every if files is None else files
    rel_paths = [p.relative_to(root).as_posix() for p in every]
    first_dirs = {part for p in rel_paths for part in p.split("/")[:-1]}
    tails = _tails(rel_paths)
    dotted = _entry_point_groups(root)
    moved = _moved_paths(root)
    found: list[Dangling] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        if rel in NOT_SCANNED or not (path.suffix == ".py" or path.suffix in DOC_SUFFIXES):
            continue
        previous = ""
        for line_no, text in texts_of(path):
            context, previous = previous + " " + text, text  # "moved" may end the line before
            for m in PATH.finditer(text):
                target = m.group(1)
                before = text[max(0, m.start() - 40):m.start()]
                if "://" in text[max(0, m.start() - 12):m.start() + 3] or target.startswith(("../", "./")):
                    continue
                if re.search(r"--[\w-]+[ =]$", before):  # an output path given to a flag
                    continue
                if _our_path(root, target, first_dirs) and not path_resolves(root, path, target, tails):
                    found.append(Dangling(rel, line_no, "path", target))
            for m in [*MODULE.finditer(text), *BARE_MODULE.finditer(text)]:
                target = m.group(0).rstrip(".")
                if re.fullmatch(rf"[\w.]+\.(?:{EXTENSIONS})", target) and (root / path.parent / target).exists():
                    continue  # a file beside the referrer (`policies.md` in docs/guide), not a module
                full = target if target.startswith("metroline.") else f"metroline.{target}"
                old = next((o for o in moved if full == o or full.startswith(o + ".")), None)
                if old is not None:
                    if not MOVED_CONTEXT.search(context):
                        found.append(Dangling(rel, line_no, "moved module", target))
                elif full not in dotted and not module_resolves(root, full):
                    found.append(Dangling(rel, line_no, "module", target))
            for m in DESIGN_DOC.finditer(text):
                name = m.group(1)
                if not any(p.name == name for p in files) and not (root / name).exists():
                    found.append(Dangling(rel, line_no, "document", name))
    return found


def test_no_dangling_references():
    dangling = find_dangling(ROOT)
    assert not dangling, f"{len(dangling)} dangling references:\n" + "\n".join(map(str, dangling))


@pytest.mark.parametrize(
    "planted, kind",
    [
        ('"""The phases are in `core/step/no_such_phase.py`."""\n', "path"),
        ("# see metroline.core.step.no_such_module for the order\nx = 1\n", "module"),
        ('"""The order of the phases: see DESIGN.md, "One step"."""\n', "document"),
        ('"""`metroline.api.NoSuchName` is what hooks see."""\n', "module"),
        ("# the order: core.step.no_such_module.order\nx = 1\n", "module"),
        ('"""Protection is `core.step.engine.no_such_rule`."""\n', "module"),
        ('"""Protection is `core.preemption.is_protected`."""\n', "moved module"),
        ('"""Protection is `metroline.core.preemption`."""\n', "moved module"),
        ('p.add_argument("--resample", help="how a trace is redrawn; see core/resample.py")\n', "path"),
        ('p = ArgumentParser(description=f"replays; {x} see metroline.core.no_such_runner")\n', "module"),
    ],
)
def test_a_planted_dangling_reference_is_found(tmp_path, planted, kind):
    """The scan finds a reference planted in a copy of a real module, and nothing else there."""
    (tmp_path / "core" / "step").mkdir(parents=True)
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "api.py").write_text("StepContext = object\n")
    for pkg in ("core", "core/step"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "core" / "step" / "engine.py").write_text(
        '"""The loop: `metroline.core.step.engine`, in `core/step/engine.py`; `metroline.api.StepContext`;\n'
        '`core.step.engine.run`. `metroline.core.preemption` moved to `core.plugins.preemption`."""\n'
        "def run(): pass\n"
        'p.add_argument("--x", help="see core/step/engine.py and core.step.engine.run")\n'
    )
    (tmp_path / "core" / "moved.py").write_text('OLD_PATHS = {"preemption": "core.plugins.preemption"}\n')
    (tmp_path / "core" / "plugins").mkdir()
    (tmp_path / "core" / "plugins" / "__init__.py").write_text("")
    (tmp_path / "core" / "plugins" / "preemption.py").write_text("def is_protected(seq): pass\n")
    planted_file = tmp_path / "core" / "step" / "planted.py"
    files = [tmp_path / "core" / "step" / "engine.py", tmp_path / "api.py", tmp_path / "core" / "moved.py"]
    assert find_dangling(tmp_path, files) == []
    planted_file.write_text(planted)
    found = find_dangling(tmp_path, files + [planted_file])
    assert [(d.file, d.kind) for d in found] == [("core/step/planted.py", kind)]


def test_a_planted_dangling_path_in_a_doc_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "config.py").write_text("")
    doc = tmp_path / "docs" / "guide.md"
    doc.write_text("The config is `core/config.py`; the recovery was `core/recovery.py`.\n")
    found = find_dangling(tmp_path, [doc, tmp_path / "core" / "config.py"])
    assert [(d.file, d.line, d.target) for d in found] == [("docs/guide.md", 1, "core/recovery.py")]


def test_a_module_in_a_namespace_package_resolves_and_a_missing_one_does_not(tmp_path):
    """`tests/` and its folders have no `__init__.py` (namespace packages, as Python imports them):
    a module in one resolves; a module or a name missing there does not."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests" / "integration" / "helpers.py").write_text("class Faulty: pass\n")
    assert module_resolves(tmp_path, "metroline.tests.integration.helpers")
    assert module_resolves(tmp_path, "metroline.tests.integration.helpers.Faulty")
    assert not module_resolves(tmp_path, "metroline.tests.integration.no_such_module")
    assert not module_resolves(tmp_path, "metroline.tests.integration.helpers.NoSuchName")
    assert not module_resolves(tmp_path, "metroline.tests.integration.NoSuchName")
