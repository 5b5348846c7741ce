"""The engine's plugins: `PluginManager` loads them (`plugin_loader`) and calls their hooks
(`hook_relay`).

A plugin spec is a shipped name, an entry point name or a dotted path; see `plugin_loader`. The
names other modules import from here (`SHIPPED`, `ENTRY_POINT_GROUP`, `resolve`, `plugin_name`,
`import_dotted`) are re-exported from there.
"""

from __future__ import annotations

import difflib
from typing import Any

import pluggy

from ..config import EngineConfig
from ..errors import PluginError, PluginLoadError
from . import deprecations, hookspecs
from .deprecated_hooks import Pluggy
from .hook_relay import HookRelay, attributed, attributed_wrapper
from .hook_watch import HookWatch
from .loader import (
    ENTRY_POINT_GROUP,
    HOOK_NAMES,
    SHIPPED,
    has_hooks,
    import_dotted,
    instantiate,
    plugin_name,
    resolve,
)

__all__ = [
    "DEFAULTS_NAME", "ENTRY_POINT_GROUP", "HOOK_NAMES", "SHIPPED", "PluginManager", "has_hooks",
    "import_dotted", "instantiate", "plugin_name", "resolve",
]

DEFAULTS_NAME = "defaults"
"""The name the built-in `DefaultPolicy` is registered under (lowest precedence)."""


class PluginManager:
    """The engine's plugins: the built-in defaults, the base policy, then the stacked plugins.

    `hook` is pluggy's hook relay (`pm.hook.admission(ctx=...)`). Decision-hook answers are
    attributed: `answerer(hook_name)` is the plugin whose implementation answered last, which
    `invalid()` uses to name the culprit of a bad answer.
    """

    def __init__(self, config: EngineConfig, extra: list[Any] | None = None, sampler_class: Any = None) -> None:
        from .defaults import DefaultPolicy

        self._pm = Pluggy()  # deprecated hooks and arguments: `metroline.core.plugins.deprecated_hooks`
        self._pm.add_hookspecs(hookspecs)
        self._owners = deprecations.Owners()  # which plugin's code is which (see `metroline.core.plugins.deprecations`)
        self._answerer: dict[str, str] = {}
        self._answered: dict[str, Any] = {}  # the answers `_answerer` names, for wrappers to tell theirs apart
        self._observer_errors: list[PluginError] = []
        self._monitors = 0
        self.watch = HookWatch()
        """The per-hook time budget (`metroline.core.plugins.hook_watch`): off until a server sets
        `watch.budget_s`."""
        self._register(DEFAULTS_NAME, DefaultPolicy(sampler_class))
        known = set()
        for spec in [config.policy, *config.plugins]:
            target = resolve(spec)
            name = plugin_name(target, spec)
            known.update((name, spec))
            try:
                options = config.options_for(name, spec)
            except ValueError as exc:
                raise PluginLoadError(str(exc)) from None
            self.add(*instantiate(spec, target, options))
        for plugin in extra or ():
            name = plugin_name(plugin, type(plugin).__name__)
            known.add(name)
            self.add(name, plugin)
        stray = sorted(set(config.plugin_options) - known)
        if stray:
            close = difflib.get_close_matches(stray[0], sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginLoadError(
                f"plugin_options.{stray[0]}: no plugin {stray[0]!r} is loaded{hint} (loaded: {', '.join(sorted(known))})"
            )
        self.hook = HookRelay(self._pm.hook, self._observer_errors, self._owners)

    def add(self, name: str, plugin: Any) -> None:
        """Register a plugin object under `name` (it takes precedence over earlier ones)."""
        if self._pm.has_plugin(name):
            raise PluginLoadError(f"plugin {name!r} is loaded twice")
        self._register(name, plugin)
        relay = getattr(self, "hook", None)
        if relay is not None:  # a plugin added after the engine was built
            relay.rebuild(self._monitors > 0)

    def _register(self, name: str, plugin: Any) -> None:
        try:
            self._pm.register(plugin, name=name)
            self._pm.check_pending()  # a hook name that no spec declares (a typo) is an error
        except (pluggy.PluginValidationError, ValueError) as exc:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            raise PluginLoadError(f"plugin {name!r}: {exc}") from exc
        self._owners.add(plugin, name)
        for impl in self._pm.get_hookcallers(plugin) or ():
            for hook_impl in impl.get_hookimpls():
                if hook_impl.plugin is not plugin:
                    continue
                if hook_impl.wrapper or hook_impl.hookwrapper:
                    hook_impl.function = attributed_wrapper(
                        hook_impl.function, name, impl.name, hook_impl.wrapper, self._answerer, self._answered, self.watch
                    )
                else:
                    hook_impl.function = attributed(
                        hook_impl.function, name, impl.name, self._answerer, self._observer_errors, self._answered,
                        tuple(hook_impl.argnames), self.watch,
                    )

    def monitor(self, before: Any, after: Any) -> Any:
        """Call `before(hook_name, impls, kwargs)` and `after(outcome, hook_name, impls, kwargs)`
        around every hook call (pluggy's hook call monitoring); returns the function that undoes
        it. For tests and tracing: it slows every hook call (they all go through pluggy while on)."""
        undo_pluggy = self._pm.add_hookcall_monitoring(before, after)
        self._monitors += 1
        self.hook.rebuild(monitored=True)

        def undo() -> None:
            undo_pluggy()
            self._monitors -= 1
            self.hook.rebuild(monitored=self._monitors > 0)

        return undo

    def answerer(self, hook: str) -> str:
        """The plugin that gave the last answer to a decision hook."""
        return self._answerer.get(hook, "?")

    def invalid(self, hook: str, problem: str) -> PluginError:
        """A `PluginError` for an invalid answer to `hook`, naming the plugin that gave it and the
        wrappers it went through."""
        plugin = self.answerer(hook)
        wrappers = [
            i.plugin_name for i in getattr(self._pm.hook, hook).get_hookimpls() if i.wrapper or i.hookwrapper
        ]
        if wrappers:
            plugin = f"{plugin} (through wrapper {', '.join(wrappers)})"
        return PluginError(plugin, hook, problem)

    def refusal(self, ctx: Any, seq: Any) -> str | None:
        """The reason the plugins give (`check_request`, through the relay like every hook,
        wrappers included) why `seq` could never run, prefixed with the name of the plugin or
        wrapper that gave it; None when they accept it."""
        self._answerer.pop("check_request", None)
        self._answered.pop("check_request", None)
        reason = self.hook.check_request(ctx=ctx, seq=seq)
        if reason is None:
            return None
        return f"{self.answerer('check_request')}: {reason}"

    def has_impls(self, hook: str) -> bool:
        """Whether any loaded plugin (the defaults included) implements `hook`."""
        return bool(getattr(self._pm.hook, hook).get_hookimpls())

    def describe(self) -> list[tuple[str, list[str]]]:
        """Each loaded plugin, highest precedence first, with the hooks it implements."""
        rows = []
        for name, plugin in reversed(self._pm.list_name_plugin()):
            hooks = sorted(c.name for c in self._pm.get_hookcallers(plugin) or ())
            rows.append((name, hooks))
        return rows

    def names(self) -> list[str]:
        """The loaded plugins' names, highest precedence first."""
        return [name for name, _ in self.describe()]

    def get(self, name: str) -> Any:
        """The plugin object registered under `name` (None if there is none)."""
        return self._pm.get_plugin(name)
