"""The plugin API's surface as text (`metroline.api`), its committed snapshot, and the changelog rule.

`surface_lines()` renders every public name of `metroline.api` as one line `KEY: description`, and
one line per public member of each class (`Candidates.filter: method (keep: ..., ...) ->
Candidates`), per field of a model (`SamplingParams.temperature: field ...`), per hook
(`hookspecs.admission: hook (ctx) firstresult`, with its argument names) and per shipped plugin and
option (`plugin_options.weighted_fair.weights: option ...`). A deprecated name's line says so.

Two rules, checked by tests/test_api_surface.py and by `python -m metroline.api --check`:

1. the surface equals the snapshot `docs/api_surface.txt` (`snapshot_problems`);
2. every key whose line differs between the last release's surface
   (`docs/api_surface.released.txt`) and the snapshot is named in CHANGELOG.md's Unreleased
   section, under Added, Changed, Deprecated or Removed; a removed key under Removed, and only if
   the release had it deprecated (`changelog_problems`).

`python -m metroline.api --write-snapshot` writes the snapshot again. At a release, the
Unreleased section becomes the version's and the snapshot is copied to the released surface.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ForwardRef

from . import deprecations, hookspecs

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "docs" / "api_surface.txt"
"""The committed snapshot of the surface."""
RELEASED = ROOT / "docs" / "api_surface.released.txt"
"""The surface of the last release."""
CHANGELOG = ROOT / "CHANGELOG.md"
CHANGELOG_SECTIONS = ("Added", "Changed", "Deprecated", "Removed")
"""The subsections of Unreleased where an API change is named."""
HEADER = "# metroline's plugin API surface (metroline.api): one line per name; see core/api_surface.py\n"


def surface_lines() -> list[str]:
    """The plugin API's surface, one line per key, sorted by key."""
    from ... import api
    from .loader import HOOK_NAMES, SHIPPED, resolve
    from .options import options_model

    lines = []
    for name in api.__all__:
        lines.extend(_describe(name, getattr(api, name)))
    for hook in HOOK_NAMES:
        lines.append(_hook_line(hook))
    for old, dep in deprecations.HOOKS.items():
        lines.append(f"hookspecs.{old}: hook{_deprecated(dep)}")
    for (hook, arg), dep in deprecations.ARGUMENTS.items():
        lines.append(f"hookspecs.{hook}({arg}): argument{_deprecated(dep)}")
    for name in SHIPPED:
        target = resolve(name)
        lines.append(f"plugin_options.{name}: shipped plugin {_kind_of(target)}")
        model = options_model(target)
        for fname, info in (model.model_fields.items() if model is not None else ()):
            lines.append(f"plugin_options.{name}.{fname}: option {_field(model, fname, info)}")
    keys = [key_of(line) for line in lines]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert not dupes, f"two lines of the API surface share a key: {dupes}"
    return sorted(lines, key=key_of)


def key_of(line: str) -> str:
    """The key of a surface line (the name before the first `": "`)."""
    return line.split(": ", 1)[0]


# --- rendering ---------------------------------------------------------------------------------


def _describe(name: str, obj: Any) -> list[str]:
    if isinstance(obj, type):
        return _describe_class(name, obj)
    if inspect.isroutine(obj):
        return [f"{name}: function {_signature(obj)}"]
    if type(obj).__name__ == "HookimplMarker":
        return [f"{name}: hookimpl marker of project {obj.project_name!r}"]
    return [f"{name}: constant {_value(obj)}"]


def _describe_class(name: str, cls: type) -> list[str]:
    bases = ", ".join(b.__qualname__ for b in cls.__bases__ if b is not object)
    of = f" of {bases}" if bases else ""
    if issubclass(cls, enum.Enum):
        lines = [f"{name}: enum{of}"]
        lines += [f"{name}.{m}: member {_value(v.value)}" for m, v in cls.__members__.items()]
        return lines
    fields: list[tuple[str, str]] = []
    if hasattr(cls, "model_fields"):  # a pydantic model
        kind = f"model{of}"
        fields = [(f, _field(cls, f, info)) for f, info in cls.model_fields.items()]
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        kind = "named tuple"
        defaults = getattr(cls, "_field_defaults", {})
        fields = [(f, _annotation(cls, f) + (f" = {_value(defaults[f])}" if f in defaults else "")) for f in cls._fields]
    elif dataclasses.is_dataclass(cls):
        kind = f"dataclass{of}"
        fields = [(f.name, _dataclass_field(cls, f)) for f in dataclasses.fields(cls)]
    elif issubclass(cls, BaseException):
        own_init = any("__init__" in vars(k) for k in cls.__mro__ if k.__module__.startswith("metroline"))
        kind = f"exception{of}" + (f" {_signature(cls)}" if own_init else "")
    else:
        kind = f"class{of} {_signature(cls)}"
    lines = [f"{name}: {kind}"]
    lines += [f"{name}.{f}: field {text}" for f, text in fields]
    known = {f for f, _ in fields}
    for member, text in _members(cls):
        if member not in known:
            dep = deprecations.ATTRIBUTES.get(f"{cls.__name__}.{member}")
            lines.append(f"{name}.{member}: {text}{_deprecated(dep) if dep else ''}")
    return lines


def _members(cls: type) -> list[tuple[str, str]]:
    """The public members metroline's own classes in `cls`'s MRO define: slots, attributes set
    in `__init__`, methods, properties and class attributes (pydantic's machinery left out)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("metroline"):
            continue
        for slot in getattr(klass, "__slots__", ()):
            if not slot.startswith("_"):
                found[slot] = "attribute"
        if "__init__" in vars(klass) and "__slots__" not in vars(klass):
            for attr in _init_attributes(klass):
                found.setdefault(attr, "attribute")
        for member, value in vars(klass).items():
            if member.startswith("_") or member.startswith("model_") or type(value).__name__ == "PydanticDescriptorProxy":
                continue
            if isinstance(value, property):
                ret = inspect.signature(value.fget).return_annotation if value.fget else inspect.Signature.empty
                found[member] = "property" + ("" if ret is inspect.Signature.empty else f" -> {_ann(ret)}")
            elif isinstance(value, staticmethod):
                found[member] = f"staticmethod {_signature(value.__func__)}"
            elif isinstance(value, classmethod):
                found[member] = f"classmethod {_signature(value.__func__, drop_first=True)}"
            elif inspect.isfunction(value):
                found[member] = f"method {_signature(value, drop_first=True)}"
            elif type(value).__name__ in ("member_descriptor", "_tuplegetter"):
                continue  # a slot (listed above) or a named tuple's field
            else:
                found[member] = f"attribute = {_value(value)}"
    return sorted(found.items())


def _init_attributes(klass: type) -> list[str]:
    """The public attributes `klass.__init__` sets on `self`."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass.__init__)))
    except (OSError, TypeError, SyntaxError):
        return []
    names = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                if not t.attr.startswith("_"):
                    names.append(t.attr)
    return names


def _hook_line(hook: str) -> str:
    fn = getattr(hookspecs, hook)
    opts = getattr(fn, f"{hookspecs.PROJECT}_spec")
    args = ", ".join(inspect.signature(fn).parameters)
    kind = (
        "decision" if hook in hookspecs.DECISION_HOOKS else "observer" if hook in hookspecs.OBSERVER_HOOKS
        else "routing" if hook in hookspecs.ROUTING_HOOKS else "edge"
    )
    flags = [f for f in ("firstresult", "historic") if opts.get(f)]
    return f"hookspecs.{hook}: hook ({args}) {kind}{''.join(' ' + f for f in flags)}"


def _deprecated(dep: deprecations.Deprecation) -> str:
    instead = f"use {dep.new}" if dep.new else "no replacement"
    return f" [deprecated since {dep.since}, removed in {dep.removed_in}: {instead}]"


def _kind_of(target: Any) -> str:
    return "class" if isinstance(target, type) else "module" if inspect.ismodule(target) else "object"


def _signature(fn: Callable[..., Any], drop_first: bool = False) -> str:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(...)"
    params = list(sig.parameters.values())
    if drop_first and params:
        params = params[1:]
    parts, star_done = [], False
    for i, p in enumerate(params):
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
            text = f"*{p.name}"
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}"
        else:
            text = p.name
        if p.annotation is not p.empty:
            text += f": {_ann(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_value(p.default)}"
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    ret = "" if sig.return_annotation is sig.empty else f" -> {_ann(sig.return_annotation)}"
    return f"({', '.join(parts)}){ret}"


def _ann(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, ForwardRef):
        return annotation.__forward_arg__
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _annotation(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        ann = vars(klass).get("__annotations__", {})
        if name in ann:
            return _ann(ann[name])
    return "?"


def _field(model: type, name: str, info: Any) -> str:
    from pydantic_core import PydanticUndefined

    text = _annotation(model, name)
    if info.default_factory is not None:
        text += f" = {_value(info.default_factory)}()"
    elif info.default is not PydanticUndefined:
        text += f" = {_value(info.default)}"
    else:
        text += " (required)"
    if info.metadata and "Field(" not in text:
        text += f" {_value(info.metadata)}"
    return text


def _dataclass_field(cls: type, f: dataclasses.Field) -> str:
    text = _ann(f.type)
    if f.default is not dataclasses.MISSING:
        text += f" = {_value(f.default)}"
    elif f.default_factory is not dataclasses.MISSING:
        text += f" = {_value(f.default_factory)}()"
    return text


def _value(v: Any) -> str:
    """A stable text for a default or a constant (no memory addresses)."""
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return repr(v)
    if isinstance(v, type) or inspect.isroutine(v):
        return getattr(v, "__qualname__", getattr(v, "__name__", "?"))
    if isinstance(v, (frozenset, set)):
        items = sorted(_value(x) for x in v)
        return f"{type(v).__name__}({{{', '.join(items)}}})"
    if isinstance(v, tuple):
        return f"({', '.join(_value(x) for x in v)}{',' if len(v) == 1 else ''})"
    if isinstance(v, list):
        return f"[{', '.join(_value(x) for x in v)}]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_value(k)}: {_value(x)}" for k, x in v.items()) + "}"
    text = repr(v)
    return f"<{type(v).__qualname__}>" if " at 0x" in text else text


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
    """The subsections (`### Added`, ...) of the changelog's `## [Unreleased]` section, by heading."""
    m = re.search(r"^## \[Unreleased\][^\n]*\n(.*?)(?=^## |\Z)", changelog, re.S | re.M)
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
    if not sections and "## [Unreleased]" not in changelog:
        return ["CHANGELOG.md has no '## [Unreleased]' section"]
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
                            "with a deprecation warning for a minor version first: core/deprecations.py)")
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
