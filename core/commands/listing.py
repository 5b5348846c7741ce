"""`metroline plugins` and `metroline workloads`: what is loaded, what is built in."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from .options import resolve_options

OPTION_INDENT = " " * 6
"""How far an option line is indented under its plugin's line."""


def cmd_plugins(args: argparse.Namespace) -> int:
    """List the plugins the options load (each with its hooks and its options: type, default,
    description, and the value set when it differs), the shipped ones with their options, and the
    installed entry points."""
    from importlib.metadata import entry_points

    from ..plugins.manager import ENTRY_POINT_GROUP, SHIPPED, PluginManager, resolve

    config, _ = resolve_options(args)
    manager = PluginManager(config)
    print("loaded plugins (highest precedence first):")
    for name, hooks in manager.describe():
        print(f"  {name:<16} {', '.join(hooks)}")
        for line in option_lines(manager.get(name)):
            print(OPTION_INDENT + line)
    print("shipped:", ", ".join(SHIPPED))
    loaded = set(manager.names())
    others = [name for name in SHIPPED if name not in loaded]
    if others:
        print("options of the shipped plugins not loaded ([plugin_options.NAME] in a --config file):")
        for name in others:
            print(f"  {name}")
            for line in option_lines(resolve(name)) or ["(no options)"]:
                print(OPTION_INDENT + line)
    eps = [f"{ep.name} ({ep.value})" for ep in entry_points(group=ENTRY_POINT_GROUP)]
    print("entry points:", ", ".join(eps) if eps else "none")
    return 0


def option_lines(plugin: Any) -> list[str]:
    """One line per option of `plugin` (a plugin class or a loaded plugin object): `name (type,
    default D): description`, with `= value` after the name for a loaded plugin whose value differs
    from the default. A class that declares no `Options` model but takes keyword arguments gets
    one line naming them."""
    from ..plugins.options import describe_options, options_model

    model = options_model(plugin)
    if model is None:
        cls = plugin if inspect.isclass(plugin) else type(plugin)
        if inspect.ismodule(plugin) or cls.__init__ is object.__init__ or getattr(cls, "options_internal", False):
            return []
        params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
        if not params:
            return []
        return [f"options not declared (no Options model): {', '.join(str(p) for p in params)}"]
    values = getattr(plugin, "options", None)
    lines = []
    for info in describe_options(model):
        value = repr(getattr(values, info.name)) if isinstance(values, model) else info.default
        shown = f" = {value}" if value != info.default else ""
        description = f": {info.description}" if info.description else ""
        lines.append(f"{info.name}{shown} ({info.type}, default {info.default}){description}")
    return lines


def cmd_workloads(args: argparse.Namespace) -> int:
    """List the built-in workloads with their descriptions."""
    from ..workloads.build import BUILTIN_WORKLOADS

    for name, description in BUILTIN_WORKLOADS.items():
        print(f"{name:<14} {description}")
    return 0
