"""Loading plugins: by shipped name, entry point or dotted path, then instantiating them.

A plugin spec is one of:

- a shipped name (`fcfs`, `static`, ... see `SHIPPED`),
- the name of an entry point in the group `metroline.plugins` of any installed distribution,
- a dotted path `package.module:attribute` or `package.module`.

The target may be a class (instantiated for each engine, so each gets its own state), an instance,
or a module. A plugin's name is its `name` attribute when it has one, else the spec; options are
looked up under either in `EngineConfig.plugin_options`. A class that declares its options as a
pydantic model `Options` is called with the table validated into it (see `plugin_options`); any
other class with the table as keyword arguments. An instance or a module takes no options.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from importlib.metadata import entry_points
from typing import Any

from ..errors import PluginLoadError
from . import deprecations, hookspecs
from .options import options_model, validate_options

ENTRY_POINT_GROUP = "metroline.plugins"
"""The entry-point group of installed plugins: a package declares
`[project.entry-points."metroline.plugins"] NAME = "pkg.module:Class"` and `--plugin NAME` loads it."""

SHIPPED: dict[str, str] = {
    # ordering policies
    "fcfs": "metroline.policies.fcfs:FCFS",
    "static": "metroline.policies.static:StaticBatching",
    "priority": "metroline.policies.priority:Priority",
    "srpt": "metroline.policies.srpt:SRPT",
    "weighted_fair": "metroline.policies.weighted_fair:WeightedFair",
    "token_rr": "metroline.policies.token_rr:TokenRoundRobin",
    # budget split, admission reservation and preemption strategies (stack on any policy)
    "decode_first": "metroline.policies.budget_split:DecodeFirst",
    "prefill_first": "metroline.policies.budget_split:PrefillFirst",
    "weighted_budget": "metroline.policies.budget_split:WeightedBudget",
    "reserve": "metroline.policies.reserve:ReserveBlocks",
    "auto_preemption": "metroline.policies.auto_preemption:AutoPreemption",
    # how much to speculate (answers num_draft_tokens under speculative_config)
    "adaptive_speculation": "metroline.policies.speculation:AdaptiveSpeculation",
    # output-length estimators (answer estimate_output_tokens under any policy)
    "length_mean": "metroline.policies.length_estimators:LengthMean",
    "length_regression": "metroline.policies.length_estimators:LengthRegression",
    # building blocks for platform teams
    "tenant_quota": "metroline.plugins_contrib.tenant_quota:TenantQuota",
    "prefix_aware": "metroline.plugins_contrib.prefix_aware:PrefixAware",
    "slo_classes": "metroline.plugins_contrib.slo_classes:SLOClasses",
    "tenant_shares": "metroline.plugins_contrib.tenant_shares:TenantShares",
    # the vLLM community's proposed policies (docs/guide/community-policies.md)
    "least_computed": "metroline.plugins_contrib.least_computed:LeastComputed",
    "residual_sjf": "metroline.plugins_contrib.residual_sjf:ResidualSJF",
    "session_affinity": "metroline.plugins_contrib.session_affinity:SessionAffinity",
}
"""Shipped plugins by name: the policies and the contrib building blocks."""

ROUTERS: dict[str, str] = {
    "round_robin": "metroline.policies.routing.round_robin:RoundRobin",
    "least_outstanding_tokens": "metroline.policies.routing.least_outstanding:LeastOutstandingTokens",
    "power_of_two": "metroline.policies.routing.power_of_two:PowerOfTwo",
    "prefix_aware": "metroline.policies.routing.prefix_aware:PrefixAwareRouter",
    "length_pools": "metroline.policies.routing.length_pools:LengthPools",
}
"""Shipped routers by name (`--router NAME`): plugins of the `route` hook, for a cluster."""


_installed: tuple[tuple, tuple] = ((), ())  # (key, entry points) of the last scan


def installed_entry_points() -> tuple[Any, ...]:
    """The entry points of `ENTRY_POINT_GROUP` in the installed distributions. Scanning every
    distribution's metadata takes milliseconds, and an engine resolves each of its plugin specs, so
    the scan is kept until `sys.path` or the modification time of one of its folders changes:
    installing, upgrading or removing a distribution adds or removes a `.dist-info` folder there
    (what `importlib.metadata` keys its own folder listings on)."""
    global _installed
    key = tuple((entry, _mtime(entry)) for entry in map(os.path.abspath, sys.path))  # '' is the current folder
    if _installed[0] != key:
        _installed = (key, tuple(entry_points(group=ENTRY_POINT_GROUP)))
    return _installed[1]


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def resolve(spec: str) -> Any:
    """The object a plugin spec names (see the module docstring)."""
    if spec in SHIPPED:
        return import_dotted(SHIPPED[spec], f"plugin {spec!r}")
    for ep in installed_entry_points():
        if ep.name == spec:
            try:
                return ep.load()
            except Exception as exc:  # anything the module raises at import (SyntaxError too)
                raise PluginLoadError(f"plugin {spec!r}: entry point {ep.value!r} failed to load: {exc}") from exc
    if ("." in spec or ":" in spec) and all(p.isidentifier() for p in spec.replace(":", ".").split(".")):
        return import_dotted(spec, f"plugin {spec!r}")
    known = sorted(set(SHIPPED) | {ep.name for ep in installed_entry_points()})
    close = difflib.get_close_matches(spec, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise PluginLoadError(
        f"unknown plugin {spec!r}{hint} (known: {', '.join(known)}; or give a dotted path pkg.mod:Obj)"
    )


def import_dotted(path: str, label: str, error: type[Exception] = PluginLoadError, hint: str = "") -> Any:
    """The object `pkg.mod:attr.sub` names (or the module, without `:`). A failure is one `error`
    starting with `label` (`"plugin 'x'"`, `"executor 'y'"`); `hint` follows an import error.

    A top-level module found nowhere on `sys.path` is looked for in the current folder too, last
    (as `python -m` would have put it first): `metroline run --policy hrrn:HRRN` run next to
    `hrrn.py` loads it. An installed module of the same name still wins."""
    module_name, _, attr = path.partition(":")
    try:
        obj = _import_here_too(module_name)
    except ImportError as exc:
        raise error(f"{label}: cannot import {module_name!r}: {exc}{hint}") from exc
    except Exception as exc:  # the module raised while importing (SyntaxError included)
        raise error(f"{label}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    except SystemExit as exc:  # sys.exit() at import: not a reason for the command to end, silently
        raise error(f"{label}: importing {module_name!r} called sys.exit({exc.code!r})") from exc
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{label}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def _import_here_too(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != module_name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # kept when found: later imports of its submodules need it
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            if again.name == exc.name:
                sys.path.remove(here)
                raise exc from None
            raise


def instantiate(spec: str, target: Any, options: dict[str, Any]) -> tuple[str, Any]:
    """Build the plugin object from what `resolve` found; return (name, plugin). A class with an
    `Options` model gets `options` validated into it (a `PluginOptionsError` names the plugin and
    each bad option); another class gets them as keyword arguments."""
    name = plugin_name(target, spec)
    if not has_hooks(target):
        raise PluginLoadError(
            f"plugin {spec!r}: {_kind(target)} has no metroline hook (valid: a module, class or object "
            "with @hookimpl methods named like the hooks of metroline.core.plugins.hookspecs)"
        )
    if inspect.isclass(target):
        model = options_model(target)
        try:
            if model is not None:
                return name, target(validate_options(name, model, options))
            return name, target(**options)
        except PluginLoadError:
            raise
        except (TypeError, ValueError) as exc:
            raise PluginLoadError(f"plugin {name!r}: bad options {options!r}: {exc}") from exc
        except Exception as exc:
            raise PluginLoadError(f"plugin {name!r}: __init__ raised {type(exc).__name__}: {exc}") from exc
    if options:
        raise PluginLoadError(f"plugin {name!r} is not a class and takes no options (got {options!r})")
    return name, target


HOOK_NAMES = tuple(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), f"{hookspecs.PROJECT}_spec"))
"""Every hook `metroline.core.plugins.hookspecs` specifies."""


def plugin_name(target: Any, spec: str) -> str:
    """A plugin's name: its `name` attribute when that is a non-empty string, else the spec."""
    name = getattr(target, "name", None)
    return name if isinstance(name, str) and name else spec


def has_hooks(target: Any) -> bool:
    """Whether `target` (a module, class or instance) has at least one `@hookimpl` named like a
    metroline hook (or like a deprecated hook, `metroline.core.plugins.deprecations`): what makes it a plugin rather
    than any importable object."""
    if not (inspect.ismodule(target) or inspect.isclass(target) or _is_instance(target)):
        return False
    marker = f"{hookspecs.PROJECT}_impl"
    for hook in (*HOOK_NAMES, *deprecations.HOOKS):
        try:
            fn = inspect.getattr_static(target, hook)
        except AttributeError:
            continue
        fn = getattr(fn, "__func__", fn)  # staticmethod / classmethod
        if hasattr(fn, marker):
            return True
    return False


def _is_instance(target: Any) -> bool:
    """An instance of a user class (not a function, a builtin value or a module)."""
    return not (
        inspect.isroutine(target) or isinstance(target, (int, float, str, bytes, bool, list, tuple, dict, set))
        or target is None
    )


def _kind(target: Any) -> str:
    if inspect.ismodule(target):
        return f"module {target.__name__!r}"
    if inspect.isclass(target):
        return f"class {target.__qualname__!r}"
    if inspect.isroutine(target):
        return f"function {getattr(target, '__qualname__', target)!r}"
    return f"{type(target).__name__} {target!r:.60}"
