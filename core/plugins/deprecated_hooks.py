"""Deprecated hook names and hook arguments, served through pluggy's own means.

`Pluggy` is the pluggy plugin manager of `metroline.core.plugins.manager.PluginManager`. It reads
the tables of `metroline.core.plugins.deprecations` when it adds the hook specifications and
registers plugins:

- A deprecated argument (`deprecations.ARGUMENTS`, keyed `(hook, argument)`) stays in its hook's
  specification, and the engine still passes it, until the version that removes it: the spec's
  `warn_on_impl_args` (pluggy) names it, so pluggy warns when an implementation takes it. Its
  `new` is the argument to take instead (passed too, under its own name).
- A deprecated hook that is still specified and called, with no replacement
  (`deprecations.HOOKS`, no `target`): the spec's `warn_on_impl` (pluggy) warns when a plugin
  implements it.
- A renamed hook (`deprecations.HOOKS` with a `target`): the old name has no specification of its
  own; `parse_hookimpl_opts`, pluggy's extension point for reading a plugin's implementations,
  registers an implementation of the old name for the new hook (pluggy's `specname` option, as
  if the plugin had written `@hookimpl(specname=...)`). A second specification under the old name
  would have the engine call every renamed hook twice, under both names.

pluggy's warnings are made when the specification is read, so they cannot name the plugin:
`register` takes them as pluggy gives them (pointing at the implementation's first line) and
warns again through `deprecations.warn`, which names the plugin, the old and the new spelling and
`removed_in`, warns once per plugin and name in a process, and records the use for the report of
`check_plugin` (`deprecations.recording`). Registration catches warnings with
`warnings.catch_warnings`, which is process-wide: plugins are registered when an engine is built,
not while other threads step engines that warn.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pluggy

from . import deprecations
from .markers import PROJECT


class DeprecatedHookUse(deprecations.MetrolineDeprecationWarning):
    """pluggy's warning for an implementation of a deprecated hook or argument, as the
    specification carries it (`warn_on_impl`, `warn_on_impl_args`); `Pluggy.register` warns
    again naming the plugin. `deprecation` is the table's entry."""

    def __init__(self, deprecation: deprecations.Deprecation) -> None:
        super().__init__(deprecation.message("a plugin"))
        self.deprecation = deprecation


class Pluggy(pluggy.PluginManager):
    """pluggy's plugin manager for metroline's hooks, with the deprecated hook names and
    arguments of `metroline.core.plugins.deprecations` (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self._renamed: list[tuple[deprecations.Deprecation, Any]] = []  # found while registering a plugin

    def parse_hookspec_opts(self, module_or_class: Any, name: str) -> Any:
        opts = super().parse_hookspec_opts(module_or_class, name)
        if opts is None:
            return None
        hook = deprecations.HOOKS.get(name)
        arguments = {arg: dep for (of, arg), dep in deprecations.ARGUMENTS.items() if of == name}
        if (hook is None or hook.target is not None) and not arguments:
            return opts
        opts = dict(opts)
        if hook is not None and hook.target is None:
            opts["warn_on_impl"] = DeprecatedHookUse(hook)
        if arguments:
            params = inspect.signature(getattr(module_or_class, name)).parameters
            for arg in arguments:
                if arg not in params:
                    raise ValueError(
                        f"deprecations.ARGUMENTS[{(name, arg)!r}]: hook {name!r} has no argument {arg!r}: a "
                        "deprecated argument stays in the hook's specification until the version that removes it"
                    )
            opts["warn_on_impl_args"] = {arg: DeprecatedHookUse(dep) for arg, dep in arguments.items()}
        return opts

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        dep = deprecations.HOOKS.get(name)
        if opts is None or dep is None or dep.target is None or opts.get("specname"):
            return opts
        self._renamed.append((dep, getattr(plugin, name)))
        return {**opts, "specname": dep.target}

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """Register `plugin` as pluggy does; then warn, naming the plugin, of each deprecated hook
        or argument it implements (and record the uses, `deprecations.recording`)."""
        self._renamed = []
        error: Exception | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                registered = super().register(plugin, name)
            except Exception as exc:  # not registered: only the warnings that are not ours are given
                error = exc
        renamed, self._renamed = self._renamed, []
        plugin_name = name or self.get_canonical_name(plugin)
        for dep, fn in renamed if error is None else ():
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            deprecations.warn(dep, plugin_name, where=code)
        for w in caught:
            if not isinstance(w.message, DeprecatedHookUse):  # not ours: as it was given
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            elif error is None:
                deprecations.warn(w.message.deprecation, plugin_name, where=(w.filename, w.lineno))
        if error is not None:
            raise error
        return registered
