"""`metroline plugins` and `metroline workloads`: what is loaded, what is built in."""

from __future__ import annotations

import argparse

from .options import resolve_options


def cmd_plugins(args: argparse.Namespace) -> int:
    """List the plugins the options load, the shipped ones and the installed entry points."""
    from importlib.metadata import entry_points

    from ..plugins import ENTRY_POINT_GROUP, SHIPPED, PluginManager

    config, _ = resolve_options(args)
    manager = PluginManager(config)
    print("loaded plugins (highest precedence first):")
    for name, hooks in manager.describe():
        print(f"  {name:<16} {', '.join(hooks)}")
    print("shipped:", ", ".join(SHIPPED))
    eps = [f"{ep.name} ({ep.value})" for ep in entry_points(group=ENTRY_POINT_GROUP)]
    print("entry points:", ", ".join(eps) if eps else "none")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    """List the built-in workloads with their descriptions."""
    from ..workloads import BUILTIN_WORKLOADS

    for name, description in BUILTIN_WORKLOADS.items():
        print(f"{name:<14} {description}")
    return 0
