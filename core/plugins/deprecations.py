"""Deprecated public names: what replaced them, since when, and until when they keep working.

A public name of the plugin API (`metroline.api`) that is renamed or removed keeps working for at
least one minor version: its old spelling still works and warns with a
`MetrolineDeprecationWarning` naming the new spelling and the version that removes the old one.
The warning is given once per plugin and name in a process (`warn`). Three kinds of names:

- `ATTRIBUTES`: an attribute of an object plugins see (`ctx.hooks`, now `ctx.hook`): the class
  keeps a property under the old name that calls `warn_attribute` and returns the new one.
- `HOOKS`: a hook name. A plugin that implements the old name is registered for the new hook
  (`target`); with no target the hook is still specified and called, and only warns.
- `ARGUMENTS`: an argument of a hook, keyed `(hook, old argument)`. An implementation that takes
  the old name is passed the new argument's value (`target`) in its place; with no target the
  argument is still passed, and only warns.

The plugin manager checks `HOOKS` and `ARGUMENTS` when it registers a plugin
(`metroline.core.plugins.manager`). `recording()` collects every deprecated use, those already warned about
included, for the report of `check_plugin`.

To deprecate a name: keep the old spelling working, add its entry here with `removed_in` at least
one minor version after `since`, list it under "Deprecated" in CHANGELOG.md's Unreleased section
and write the API snapshot again (`python -m metroline.api --write-snapshot`).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any


class MetrolineDeprecationWarning(DeprecationWarning):
    """A plugin used a deprecated name of metroline's plugin API. The message names the plugin,
    the old and the new spelling and the version that removes the old one.

    Python hides a `DeprecationWarning` raised outside `__main__` by default; the `metroline`
    command shows this one (unless `-W` or `PYTHONWARNINGS` says otherwise), and so does pytest.
    `python -W error::DeprecationWarning` makes it an error."""


@dataclass(frozen=True)
class Deprecation:
    """One deprecated name.

    `old` and `new` are spelled as a plugin writes them (`"ctx.hooks"`, `"ctx.hook"`; `new` is
    None for a name removed without a replacement). `target` is the name the old one is mapped to
    (the new hook or argument name; None: the old one is still served as it is). The old spelling
    works in every version before `removed_in`.
    """

    old: str
    new: str | None
    since: str
    removed_in: str
    target: str | None = None

    def message(self, plugin: str) -> str:
        """The warning: which plugin uses what, since and until when (and the version installed),
        and what to use instead."""
        instead = f": use {self.new} instead" if self.new else " without a replacement"
        return (
            f"{plugin}: {self.old} is deprecated since metroline {self.since} and will be removed in "
            f"{self.removed_in} (installed: metroline {_installed_version()}){instead}"
        )


ATTRIBUTES: dict[str, Deprecation] = {
    "StepContext.hooks": Deprecation("ctx.hooks", "ctx.hook", since="0.2.0", removed_in="0.3.0", target="hook"),
    # the scheduler fills a `StepPlan` through its per-step `StepState`; the plan is only the record
    "StepPlan.add": Deprecation("StepPlan.add", None, since="0.2.0", removed_in="0.3.0"),
    "StepPlan.drop": Deprecation("StepPlan.drop", None, since="0.2.0", removed_in="0.3.0"),
    "StepPlan.set_budget": Deprecation("StepPlan.set_budget", None, since="0.2.0", removed_in="0.3.0"),
    "StepPlan.seal": Deprecation("StepPlan.seal", None, since="0.2.0", removed_in="0.3.0"),
}
"""Deprecated attributes, keyed by `Class.name`."""

HOOKS: dict[str, Deprecation] = {}
"""Deprecated hook names (none yet), keyed by the old name; `target` is the new hook."""

ARGUMENTS: dict[tuple[str, str], Deprecation] = {}
"""Deprecated hook arguments (none yet), keyed by `(hook, old argument)`; `target` is the new
argument."""


@dataclass(frozen=True)
class Use:
    """One use of a deprecated name by a plugin (`plugin` is its name, or where the use was when
    no loaded plugin's code made it)."""

    plugin: str
    deprecation: Deprecation

    def __str__(self) -> str:
        return self.deprecation.message(f"plugin {self.plugin!r}" if not self.plugin.startswith("<") else self.plugin)


_warned: set[tuple[str, str]] = set()
_recorders: list[list[Use]] = []


def warn(deprecation: Deprecation, plugin: str, stacklevel: int = 2, where: CodeType | None = None) -> None:
    """Record that `plugin` used `deprecation`'s old name and, the first time in this process for
    this plugin and name, warn with a `MetrolineDeprecationWarning`: at the caller `stacklevel`
    frames up, or at the first line of `where` (a plugin's function) when given."""
    use = Use(plugin, deprecation)
    for uses in _recorders:
        uses.append(use)
    key = (plugin, deprecation.old)
    if key in _warned:
        return
    _warned.add(key)
    if where is None:
        warnings.warn(str(use), MetrolineDeprecationWarning, stacklevel=stacklevel + 1)
    else:
        warnings.warn_explicit(
            str(use), MetrolineDeprecationWarning, where.co_filename, where.co_firstlineno,
            module=_module_of(where),
        )


def warn_attribute(name: str, owners: Owners | None, frame: FrameType | None) -> None:
    """Warn that the code running in `frame` read the deprecated attribute `name` (a key of
    `ATTRIBUTES`); the plugin is the one whose code `frame` or one of its callers runs
    (`owners`, see `Owners`)."""
    warn(ATTRIBUTES[name], (owners or Owners()).plugin_of(frame), stacklevel=3)


class Owners:
    """Which plugin's code runs in a frame: the code objects of each registered plugin (its
    class's functions, or its module's, with the generators, lambdas and nested functions they
    define) and the plugin objects. Two plugins may share code (a subclass, the same class
    registered twice): a method's `self` then tells them apart."""

    __slots__ = ("codes", "objects")

    def __init__(self) -> None:
        self.codes: dict[CodeType, str] = {}
        self.objects: dict[int, str] = {}

    def add(self, plugin: Any, name: str) -> None:
        """Record `plugin`, registered under `name`."""
        self.objects[id(plugin)] = name
        functions: list[Any] = []
        if isinstance(plugin, ModuleType):
            for value in vars(plugin).values():
                if getattr(value, "__module__", None) != plugin.__name__:
                    continue
                if isinstance(value, type):
                    functions.extend(_class_functions(value))
                else:
                    functions.append(value)
        else:
            functions.extend(_class_functions(plugin if isinstance(plugin, type) else type(plugin)))
        for fn in functions:
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if isinstance(code, CodeType):
                _add_code(code, name, self.codes)

    def plugin_of(self, frame: FrameType | None, depth: int = 16) -> str:
        """The name of the plugin whose code runs in `frame` or in one of its `depth` callers (a
        plugin's helper function called by its hook); when none does, `<module M, line L>` of
        `frame`."""
        f = frame
        for _ in range(depth):
            if f is None:
                break
            name = self.codes.get(f.f_code)
            if name is not None:
                code = f.f_code
                if code.co_argcount:
                    first = f.f_locals.get(code.co_varnames[0])
                    name = self.objects.get(id(first), name)
                return name
            f = f.f_back
        if frame is None:
            return "<unknown caller>"
        return f"<module {frame.f_globals.get('__name__', '?')}, line {frame.f_lineno}>"


def _class_functions(cls: type) -> list[Any]:
    out = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "builtins":
            continue
        for value in vars(klass).values():
            if isinstance(value, property):
                out.extend(f for f in (value.fget, value.fset, value.fdel) if f is not None)
            elif isinstance(value, (staticmethod, classmethod)):
                out.append(value.__func__)
            elif isinstance(value, FunctionType):
                out.append(value)
    return out


def _add_code(code: CodeType, name: str, owners: dict[CodeType, str]) -> None:
    owners[code] = name
    for const in code.co_consts:
        if isinstance(const, CodeType):
            _add_code(const, name, owners)


def _module_of(code: CodeType) -> str:
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == code.co_filename:
            return module.__name__
    return "<plugin>"


@contextmanager
def recording() -> Iterator[list[Use]]:
    """Collect every use of a deprecated name while the block runs (also those already warned
    about earlier in the process), in the order they happened."""
    uses: list[Use] = []
    _recorders.append(uses)
    try:
        yield uses
    finally:
        _recorders.remove(uses)


def forget_warnings() -> None:
    """Warn again about uses already warned about in this process (for tests)."""
    _warned.clear()


def show_in_cli() -> None:
    """Show `MetrolineDeprecationWarning`s (Python hides deprecation warnings outside `__main__`),
    unless the user chose warning filters (`-W`, `PYTHONWARNINGS`)."""
    if not sys.warnoptions:
        warnings.filterwarnings("default", category=MetrolineDeprecationWarning)


MODULES_MOVED_IN = "0.2.0"
MODULES_REMOVED_IN = "0.3.0"
_moved_warned: set[str] = set()


def _installed_version() -> str:
    from ... import __version__

    return __version__


def warn_moved(old: str, new: str, stacklevel: int = 2) -> None:
    """Warn, once per old path in a process, that module `old` moved to `new` (see
    `core/moved.py`)."""
    if old in _moved_warned:
        return
    _moved_warned.add(old)
    warnings.warn(
        f"{old} moved to {new} in metroline {MODULES_MOVED_IN}; the old path will be removed in "
        f"{MODULES_REMOVED_IN} (installed: metroline {_installed_version()}): import {new} (or the plugin API, "
        "metroline.api) instead",
        MetrolineDeprecationWarning, stacklevel=stacklevel + 1,
    )


def moved_attribute(old: str, module: ModuleType, name: str) -> Any:
    """Attribute `name` of the old module `old`, now `module` (a package's `__getattr__` that
    kept an old module's name), with `warn_moved`."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        value = getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module {old!r} has no attribute {name!r}") from None
    warn_moved(old, module.__name__, stacklevel=3)
    return value
