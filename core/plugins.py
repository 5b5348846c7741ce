"""Finding, loading and calling plugins.

A plugin spec is one of:

- a shipped name (`fcfs`, `static`, ... see `SHIPPED`),
- the name of an entry point in the group `metroline.plugins` of any installed distribution,
- a dotted path `package.module:attribute` or `package.module`.

The target may be a class (instantiated with the plugin's options as keyword arguments, so each
engine gets its own state), an instance, or a module. A plugin's name is its `name` attribute when
it has one, else the spec; options are looked up under either in `EngineConfig.plugin_options`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

import pluggy

from . import answers, hookspecs
from .config import EngineConfig
from .errors import PluginError, PluginLoadError

ENTRY_POINT_GROUP = "metroline.plugins"

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
    # building blocks for platform teams
    "tenant_quota": "metroline.plugins_contrib.tenant_quota:TenantQuota",
    "prefix_aware": "metroline.plugins_contrib.prefix_aware:PrefixAware",
    "slo_classes": "metroline.plugins_contrib.slo_classes:SLOClasses",
}
"""Shipped plugins by name: the policies and the contrib building blocks."""

DEFAULTS_NAME = "defaults"


def resolve(spec: str) -> Any:
    """The object a plugin spec names (see the module docstring)."""
    if spec in SHIPPED:
        return import_dotted(SHIPPED[spec], f"plugin {spec!r}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == spec:
            try:
                return ep.load()
            except Exception as exc:  # anything the module raises at import (SyntaxError too)
                raise PluginLoadError(f"plugin {spec!r}: entry point {ep.value!r} failed to load: {exc}") from exc
    if ("." in spec or ":" in spec) and all(p.isidentifier() for p in spec.replace(":", ".").split(".")):
        return import_dotted(spec, f"plugin {spec!r}")
    known = sorted(set(SHIPPED) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
    close = difflib.get_close_matches(spec, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise PluginLoadError(
        f"unknown plugin {spec!r}{hint} (known: {', '.join(known)}; or give a dotted path pkg.mod:Obj)"
    )


def import_dotted(path: str, label: str, error: type[Exception] = PluginLoadError, hint: str = "") -> Any:
    """The object `pkg.mod:attr.sub` names (or the module, without `:`). A failure is one `error`
    starting with `label` (`"plugin 'x'"`, `"executor 'y'"`); `hint` follows an import error."""
    module_name, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{label}: cannot import {module_name!r}: {exc}{hint}") from exc
    except Exception as exc:  # the module raised while importing (SyntaxError included)
        raise error(f"{label}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{label}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def instantiate(spec: str, target: Any, options: dict[str, Any]) -> tuple[str, Any]:
    """Build the plugin object from what `resolve` found; return (name, plugin)."""
    name = plugin_name(target, spec)
    if not has_hooks(target):
        raise PluginLoadError(
            f"plugin {spec!r}: {_kind(target)} has no metroline hook (valid: a module, class or object "
            "with @hookimpl methods named like the hooks of metroline.core.hookspecs)"
        )
    if inspect.isclass(target):
        try:
            return name, target(**options)
        except (TypeError, ValueError) as exc:
            raise PluginLoadError(f"plugin {name!r}: bad options {options!r}: {exc}") from exc
        except Exception as exc:
            raise PluginLoadError(f"plugin {name!r}: __init__ raised {type(exc).__name__}: {exc}") from exc
    if options:
        raise PluginLoadError(f"plugin {name!r} is not a class and takes no options (got {options!r})")
    return name, target


HOOK_NAMES = tuple(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), f"{hookspecs.PROJECT}_spec"))
"""Every hook `core/hookspecs.py` specifies."""


def plugin_name(target: Any, spec: str) -> str:
    """A plugin's name: its `name` attribute when that is a non-empty string, else the spec."""
    name = getattr(target, "name", None)
    return name if isinstance(name, str) and name else spec


def has_hooks(target: Any) -> bool:
    """Whether `target` (a module, class or instance) has at least one `@hookimpl` named like a
    metroline hook: what makes it a plugin rather than any importable object."""
    if not (inspect.ismodule(target) or inspect.isclass(target) or _is_instance(target)):
        return False
    marker = f"{hookspecs.PROJECT}_impl"
    for hook in HOOK_NAMES:
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


class PluginManager:
    """The engine's plugins: the built-in defaults, the base policy, then the stacked plugins.

    `hook` is pluggy's hook relay (`pm.hook.admission(ctx=...)`). Decision-hook answers are
    attributed: `answerer(hook_name)` is the plugin whose implementation answered last, which
    `invalid()` uses to name the culprit of a bad answer.
    """

    def __init__(self, config: EngineConfig, extra: list[Any] | None = None) -> None:
        from .defaults import DefaultPolicy

        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._answerer: dict[str, str] = {}
        self._observer_errors: list[PluginError] = []
        self._monitors = 0
        self._register(DEFAULTS_NAME, DefaultPolicy())
        known = set()
        for spec in [config.policy, *config.plugins]:
            target = resolve(spec)
            name = plugin_name(target, spec)
            known.update((name, spec))
            options = config.plugin_options.get(name) or config.plugin_options.get(spec) or {}
            self.add(*instantiate(spec, target, options))
        for plugin in extra or ():
            name = plugin_name(plugin, type(plugin).__name__)
            known.add(name)
            self.add(name, plugin)
        stray = sorted(set(config.plugin_options) - known)
        if stray:
            raise PluginLoadError(
                f"plugin_options.{stray[0]}: no plugin {stray[0]!r} is loaded (loaded: {', '.join(sorted(known))})"
            )
        self.hook = _Relay(self._pm.hook, self._observer_errors)

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
        for impl in self._pm.get_hookcallers(plugin) or ():
            for hook_impl in impl.get_hookimpls():
                if hook_impl.plugin is not plugin:
                    continue
                if hook_impl.wrapper or hook_impl.hookwrapper:
                    hook_impl.function = self._attributed_wrapper(hook_impl.function, name, impl.name, hook_impl.wrapper)
                else:
                    hook_impl.function = self._attributed(hook_impl.function, name, impl.name)

    def _attributed(self, fn: Any, plugin: str, hook: str) -> Any:
        answerer = self._answerer
        check = answers.CHECKS.get(hook)
        decision = hook in hookspecs.DECISION_HOOKS
        deferred = self._observer_errors if hook in hookspecs.OBSERVER_HOOKS else None

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = fn(*args, **kwargs)
            except PluginError as exc:
                err = exc
            except Exception as exc:
                err = PluginError(plugin, hook, f"raised {type(exc).__name__}: {exc}")
                err.__cause__ = exc
            else:
                if decision and result is not None:
                    answerer[hook] = plugin
                    if check is not None:
                        return check(plugin, result)
                return result
            if deferred is None:
                raise err
            deferred.append(err)  # the other observers still hear of the event; raised after them
            return None

        return call

    def _attributed_wrapper(self, fn: Any, plugin: str, hook: str, new_style: bool) -> Any:
        check = answers.CHECKS.get(hook) if new_style else None

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = yield from fn(*args, **kwargs)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(plugin, hook, f"wrapper raised {type(exc).__name__}: {exc}") from exc
            if check is not None and result is not None:
                return check(plugin, result)
            return result

        return call

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
        """The first reason a plugin gives (`check_request`) why `seq` could never run, prefixed
        with the plugin's name; None when every plugin accepts it."""
        for impl in reversed(self._pm.hook.check_request.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            args = {"ctx": ctx, "seq": seq}
            reason = impl.function(*[args[a] for a in impl.argnames])
            if reason is None:
                continue
            if not isinstance(reason, str) or not reason.strip():
                raise PluginError(
                    impl.plugin_name, "check_request", f"expected a reason (a non-empty string) or None, got {reason!r:.80}"
                )
            return f"{impl.plugin_name}: {reason}"
        return None

    def has_impls(self, hook: str) -> bool:
        return bool(getattr(self._pm.hook, hook).get_hookimpls())

    def describe(self) -> list[tuple[str, list[str]]]:
        """Each loaded plugin, highest precedence first, with the hooks it implements."""
        rows = []
        for name, plugin in reversed(self._pm.list_name_plugin()):
            hooks = sorted(c.name for c in self._pm.get_hookcallers(plugin) or ())
            rows.append((name, hooks))
        return rows

    def names(self) -> list[str]:
        return [name for name, _ in self.describe()]

    def get(self, name: str) -> Any:
        return self._pm.get_plugin(name)


class _Relay:
    """The hook relay the engine calls (`plugins.hook.admission(ctx=...)`).

    It calls the implementations as pluggy does (newest first; a decision hook stops at the first
    answer that is not None), with two differences: an observer hook is delivered to every
    implementation even when one raises (the first `PluginError` is raised once all have been
    called, so no other plugin misses the event); and a hook without wrappers calls its
    implementations directly, without pluggy's per-call machinery (a pluggy call costs about three
    times a direct one, and a step makes several). A hook with a wrapper, and every hook while a
    monitor is on (`PluginManager.monitor`), goes through pluggy itself.
    """

    def __init__(self, relay: Any, errors: list[PluginError]) -> None:
        self._relay = relay
        self._errors = errors
        self.rebuild(monitored=False)

    def rebuild(self, monitored: bool) -> None:
        """Set up each hook's caller for the plugins registered now."""
        for name in HOOK_NAMES:
            caller = getattr(self._relay, name)
            impls = caller.get_hookimpls()
            if monitored or any(i.wrapper or i.hookwrapper for i in impls):
                call = caller
            elif name in hookspecs.DECISION_HOOKS:
                call = _first_answer(impls, caller.get_hookimpls)
            else:
                call = _every_answer(impls, caller.get_hookimpls)
            setattr(self, name, _delivered(call, self._errors) if name in hookspecs.OBSERVER_HOOKS else call)


def _first_answer(impls: list[Any], get_hookimpls: Any) -> Any:
    """A firstresult hook's caller: the newest implementation's answer that is not None."""
    chain = [(i.function, tuple(i.argnames)) for i in reversed(impls)]

    def call(**kwargs: Any) -> Any:
        for fn, names in chain:
            answer = fn(*[kwargs[n] for n in names])
            if answer is not None:
                return answer
        return None

    call.get_hookimpls = get_hookimpls
    return call


def _every_answer(impls: list[Any], get_hookimpls: Any) -> Any:
    """An observer hook's caller: every implementation, newest first; their answers that are not
    None, as pluggy returns them."""
    chain = [(i.function, tuple(i.argnames)) for i in reversed(impls)]

    def call(**kwargs: Any) -> list[Any]:
        answers = []
        for fn, names in chain:
            answer = fn(*[kwargs[n] for n in names])
            if answer is not None:
                answers.append(answer)
        return answers

    call.get_hookimpls = get_hookimpls
    return call


def _delivered(caller: Any, errors: list[PluginError]) -> Any:
    def call(**kwargs: Any) -> Any:
        result = caller(**kwargs)
        if errors:
            first = errors[0]
            errors.clear()
            raise first
        return result

    call.get_hookimpls = caller.get_hookimpls  # the engine skips an observer nobody implements
    return call
