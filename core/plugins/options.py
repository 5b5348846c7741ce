"""Plugin options declared in one place: a plugin class's nested pydantic model `Options`.

A plugin class declares the options it takes as a model nested in it (the shipped ones subclass
`PluginOptions`)::

    class MyPolicy:
        name = "my_policy"

        class Options(PluginOptions):
            window: int = Field(default=64, ge=1, description="how many requests are scored")

        def __init__(self, *args, **kwargs):
            self.options = take_options(self, args, kwargs)

When the plugin manager loads a class that has such a model, it validates the config's
`[plugin_options.NAME]` table against it and calls the class with one argument, the validated
`Options` instance (`take_options` returns it as is). Called directly, the class takes its options as
keyword (or positional, in field order) arguments, validated the same way. A class without an
`Options` model gets the table as keyword arguments, unvalidated, as before; so does a subclass
that defines its own `__init__` without declaring a model of its own (`options_model`).

Every bad option is reported in one format, `plugin 'NAME': option 'FIELD': PROBLEM (got VALUE)`
(several joined by "; "), as a `PluginOptionsError` (a `PluginLoadError`, so a `ValueError`); an
unknown key lists the valid ones, with a "did you mean" when one is close. A nested key is written as
a TOML dotted key: `option 'weights.alpha'`.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticUndefined

from ..errors import PluginLoadError

__all__ = [
    "OptionInfo", "PluginOptions", "PluginOptionsError", "describe_options", "options_model", "take_options",
    "validate_options",
]


class PluginOptions(BaseModel):
    """Base of a plugin's `Options` model: an unknown key is refused, types are strict (a bool is
    not a number, the string "1" is not an int; an int is a float), and the validated object is
    frozen (a plugin copies what it needs when it is built)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PluginOptionsError(PluginLoadError):
    """Bad options for a plugin: `plugin` is its name, `problems` the `(option, problem)` pairs (an
    empty option for a problem with the whole table)."""

    def __init__(self, plugin: str, problems: list[tuple[str, str]]) -> None:
        parts = [f"option {option!r}: {problem}" if option else problem for option, problem in problems]
        super().__init__(f"plugin {plugin!r}: " + "; ".join(parts))
        self.plugin = plugin
        self.problems = problems


def options_model(target: Any) -> type[BaseModel] | None:
    """The `Options` model that describes how a plugin class (or instance) is built; None when it
    declares none. A subclass that defines its own `__init__` without declaring an `Options` model
    of its own has none (its `__init__`, not its parent's, takes the options), so a user's subclass
    of a shipped plugin keeps getting its table as keyword arguments."""
    cls = target if isinstance(target, type) else type(target)
    model = _declared_model(cls)
    if model is None:
        return None
    mro = cls.__mro__
    declared_at = next(i for i, c in enumerate(mro) if "Options" in vars(c))
    built_at = next(i for i, c in enumerate(mro) if "__init__" in vars(c))
    return model if declared_at <= built_at else None


def _declared_model(cls: type) -> type[BaseModel] | None:
    model = getattr(cls, "Options", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def validate_options(plugin: str, model: type[BaseModel], raw: Mapping[str, Any]) -> BaseModel:
    """`raw` validated into `model`; a `PluginOptionsError` naming `plugin` and every bad option."""
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise PluginOptionsError(plugin, [_problem(model, e) for e in exc.errors()]) from None


def take_options(plugin: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseModel:
    """The validated `Options` of `plugin` from the arguments of its `__init__(self, *args,
    **kwargs)`: a validated `Options` instance alone (what the plugin manager passes) is returned as
    is; otherwise the positional arguments are the options in field order and the keyword ones by
    name, validated together."""
    model = _declared_model(type(plugin))
    name = getattr(plugin, "name", None) or type(plugin).__name__
    if model is None:
        raise TypeError(f"plugin {name!r}: {type(plugin).__qualname__} declares no Options model")
    if len(args) == 1 and not kwargs and isinstance(args[0], model):
        return args[0]
    fields = list(model.model_fields)
    if len(args) > len(fields):
        raise PluginOptionsError(name, [("", f"takes at most {len(fields)} positional options, got {len(args)}")])
    given = dict(zip(fields, args))
    twice = sorted(given.keys() & kwargs.keys())
    if twice:
        raise PluginOptionsError(name, [(key, "given twice (by position and by name)") for key in twice])
    return validate_options(name, model, {**given, **kwargs})


def _problem(model: type[BaseModel], error: Any) -> tuple[str, str]:
    """One pydantic error as `(option, problem)`."""
    loc = [part for part in error["loc"] if part != "[key]"]
    option = ".".join(_toml_key(part) for part in loc)
    if error["type"] == "extra_forbidden" and len(loc) == 1:
        valid = list(model.model_fields)
        close = difflib.get_close_matches(str(loc[0]), valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listed = f"valid options: {', '.join(valid)}" if valid else "the plugin takes no options"
        return option, f"unknown option{hint} ({listed})"
    message = error["msg"].removeprefix("Value error, ")
    return option, f"{message} (got {error['input']!r:.80})"


def _toml_key(part: Any) -> str:
    """A part of a dotted key as TOML writes it: bare when it can be, else quoted."""
    text = str(part)
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else '"' + text.replace('"', '\\"') + '"'


# --- documentation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionInfo:
    """One option as `metroline plugins` lists it: its name, type (with its limits), default and
    description."""

    name: str
    type: str
    default: str
    description: str


def describe_options(model: type[BaseModel]) -> list[OptionInfo]:
    """Each field of an `Options` model, in declaration order."""
    rows = []
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default = repr(field.default_factory())
        elif field.default is PydanticUndefined:
            default = "(required)"
        else:
            default = repr(field.default)
        rows.append(OptionInfo(name, _type_label(field.annotation, field.metadata), default, field.description or ""))
    return rows


_LIMITS = (
    (annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
)


def _limits(metadata: list[Any]) -> str:
    """The numeric limits among a field's metadata, as `>= 0, < 1`."""
    parts = []
    for item in metadata:
        for kind, attr, sign in _LIMITS:
            if isinstance(item, kind):
                parts.append(f"{sign} {getattr(item, attr)}")
        parts.extend(filter(None, [_limits(getattr(item, "metadata", []))]))  # a nested Field(...)
    return ", ".join(parts)


def _type_label(annotation: Any, metadata: list[Any] = ()) -> str:
    """A type as a reader writes it, its limits inline: `int >= 1`, `float >= 0 | None`,
    `{str: float > 0}`, `'interactive' | 'batch'`."""
    limits = _limits(list(metadata))
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _type_label(args[0], [*metadata, *args[1:]])
    if origin in (Union, types.UnionType):
        labels = [_type_label(a, metadata if a is not type(None) else ()) for a in args]
        return " | ".join(labels)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is dict:
        return "{" + f"{_type_label(args[0])}: {_type_label(args[1])}" + "}"
    label = "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))
    return f"{label} {limits}" if limits else label
