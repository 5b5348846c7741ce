"""Errors the engine raises on behalf of plugins."""

from __future__ import annotations


class PluginError(RuntimeError):
    """A plugin raised, or gave an invalid answer to, a hook. Names the plugin and the hook."""

    def __init__(self, plugin: str, hook: str, problem: str) -> None:
        super().__init__(f"plugin {plugin!r}, hook {hook!r}: {problem}")
        self.plugin = plugin
        self.hook = hook
        self.problem = problem


class PluginLoadError(ValueError):
    """A plugin could not be found, imported or configured."""


class NoProgressError(RuntimeError):
    """The engine has requests but its plugins schedule nothing, and nothing will change that (no
    arrival is pending and no plugin asked to be woken up later)."""


class RequestRefused(ValueError):
    """A request that could never run under the engine's plugins (see the `check_request` hook);
    it is refused at `Engine.add_request`, as an invalid request is."""
