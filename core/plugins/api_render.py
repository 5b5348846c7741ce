"""The plugin API's surface rendered as text: one line per public name of `metroline.api`.

`surface_lines()` renders every public name of `metroline.api` as one line `KEY: description`, and
one line per public member of each class (`Candidates.filter: method (keep: ..., ...) ->
Candidates`), per field of a model (`SamplingParams.temperature: field ...`), per hook
(`hookspecs.admission: hook (ctx) firstresult`, with its argument names) and per shipped plugin and
option (`plugin_options.weighted_fair.weights: option ...`). A deprecated name's line says so.
`key_of` gives a line's key. The rules the rendered surface is held to (its snapshot, the
changelog) are `metroline.core.plugins.api_surface`'s.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, ForwardRef

from . import deprecations, hookspecs


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
