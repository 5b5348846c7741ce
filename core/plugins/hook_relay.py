"""Calling hooks: the relay the engine calls, and the wrapping of each implementation that names the
plugin and the hook in an error and records which plugin answered a decision hook."""

from __future__ import annotations

import functools
from typing import Any

from ..errors import PluginError
from . import answers, hookspecs
from .deprecations import Owners
from .hook_watch import HookWatch
from .loader import HOOK_NAMES

FIRST_ANSWER_HOOKS = (*hookspecs.DECISION_HOOKS, *hookspecs.EDGE_HOOKS)
"""The firstresult hooks an engine calls: the first answer that is not None wins, and the plugin
that gave it is recorded (`PluginManager.answerer`)."""


PER_REQUEST_HOOKS = {"estimate_output_tokens": "seq", "check_request": "seq"}
"""The hooks called for one request's sequence (hook -> the argument that holds it): an error one
of them raises or answers is that request's (`PluginError.request_id`)."""


def attributed(
    fn: Any, plugin: str, hook: str, answerer: dict[str, str], observer_errors: list[PluginError],
    answered: dict[str, Any] | None = None, argnames: tuple[str, ...] = (), watch: HookWatch | None = None,
) -> Any:
    """`fn`, one plugin's implementation of `hook`, wrapped so that an exception it raises becomes
    a `PluginError` naming the plugin and the hook (kept in `observer_errors` for an observer hook,
    so the other observers still hear of the event), a firstresult hook's answer is recorded in
    `answerer` (and the answer itself in `answered`, when given) and checked (`answers.CHECKS`).
    For a hook of `PER_REQUEST_HOOKS` the error names the request too (`argnames`: `fn`'s
    arguments, as pluggy passes them: by position on the relay's direct path, else by name).
    With a `watch` whose budget is set, the call is timed against it (`metroline.core.plugins.hook_watch`)."""
    check = answers.CHECKS.get(hook)
    decision = hook in FIRST_ANSWER_HOOKS
    answered = {} if answered is None else answered
    deferred = observer_errors if hook in hookspecs.OBSERVER_HOOKS else None
    seq_arg = PER_REQUEST_HOOKS.get(hook)
    seq_at = argnames.index(seq_arg) if seq_arg is not None and seq_arg in argnames else None

    def whose(args: tuple, kwargs: dict) -> str | None:
        if seq_arg in kwargs:
            return getattr(kwargs[seq_arg], "request_id", None)
        if seq_at is not None and seq_at < len(args):
            return getattr(args[seq_at], "request_id", None)
        return None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            if watch is None or watch.budget_s is None:
                result = fn(*args, **kwargs)
            else:
                result = watch.call(plugin, hook, fn, args, kwargs)
            if decision and result is not None:
                answerer[hook] = plugin
                if check is not None:
                    result = check(plugin, result)
                answered[hook] = result
            return result
        except PluginError as exc:
            err = exc
        except Exception as exc:
            err = PluginError(plugin, hook, f"raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
        if seq_arg is not None:
            rid = whose(args, kwargs)
            if rid is not None:
                err.for_request(rid)
        if deferred is None:
            raise err
        deferred.append(err)  # the other observers still hear of the event; raised after them
        return None

    return call


def attributed_wrapper(
    fn: Any, plugin: str, hook: str, new_style: bool,
    answerer: dict[str, str] | None = None, answered: dict[str, Any] | None = None, watch: HookWatch | None = None,
) -> Any:
    """A wrapper implementation (`wrapper=True`, or old-style `hookwrapper=True`) wrapped so that an
    exception it raises names the plugin and the hook, and an answer it gives is checked
    (`answers.CHECKS`) as the wrapper's own: a new-style wrapper's return value, or the result an
    old-style one forced (`outcome.force_result`). For an edge hook (`check_request`) an answer
    that is not the one recorded below it in `answered` is the wrapper's: `answerer` names it.
    With a `watch` whose budget is set, each of the wrapper's own parts (up to its `yield`, and
    from it to its end) is timed against it as a call of its own (`timed_parts`)."""
    fn = timed_parts(fn, plugin, hook, watch)
    check = answers.CHECKS.get(hook)
    if hook in hookspecs.EDGE_HOOKS and answerer is not None and answered is not None:
        check = _claimed(check, hook, answerer, answered)
    if not new_style:
        return _old_style(fn, plugin, hook, check)

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


def timed_parts(fn: Any, plugin: str, hook: str, watch: HookWatch | None) -> Any:
    """`fn`, a wrapper implementation (a generator function), with each part of its own code timed
    by `watch` as a call of `plugin`'s `hook` (so the budget ends, and the watchdog interrupts, a
    wrapper that sleeps before or after its `yield`): the part up to the `yield`, and the part that
    runs once the implementations it wraps have answered (or raised). Those implementations run
    between the parts and are timed as their own calls, not as the wrapper's."""
    if watch is None:
        return fn

    @functools.wraps(fn)
    def parts(*args: Any, **kwargs: Any) -> Any:
        if watch.budget_s is None:
            return (yield from fn(*args, **kwargs))
        gen = fn(*args, **kwargs)  # a generator: nothing of the plugin's code has run yet
        done, value = watch.call(plugin, hook, _resumed, (gen.send, None), {})
        while not done:
            try:
                sent = yield value
            except GeneratorExit:
                gen.close()
                raise
            except BaseException as exc:  # what the wrapped implementations raised, for the wrapper
                done, value = watch.call(plugin, hook, _resumed, (gen.throw, exc), {})
            else:
                done, value = watch.call(plugin, hook, _resumed, (gen.send, sent), {})
        return value

    return parts


def _resumed(resume: Any, value: Any) -> tuple[bool, Any]:
    """(False, what a generator yielded next) or (True, what it returned) on `resume(value)`
    (its `send` or `throw`): its end is an answer, not an exception, so the time is checked."""
    try:
        return False, resume(value)
    except StopIteration as stop:
        return True, stop.value


def _claimed(check: Any, hook: str, answerer: dict[str, str], answered: dict[str, Any]) -> Any:
    """`check`, which also records a wrapper as the answerer of `hook` when its answer is not the
    answer recorded below it (a reason of its own, not the one it was handed)."""

    def claim(plugin: str, answer: Any) -> Any:
        if answer is not answered.get(hook):
            answer = check(plugin, answer) if check is not None else answer
            answerer[hook] = plugin
            answered[hook] = answer
        return answer

    return claim


def _old_style(fn: Any, plugin: str, hook: str, check: Any) -> Any:
    """An old-style `hookwrapper=True` implementation, attributed: it receives pluggy's `Result`
    at its one `yield`; a result it forced in place of the one below is checked as its own."""

    def named(exc: Exception) -> PluginError:
        err = PluginError(plugin, hook, f"wrapper raised {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            gen = fn(*args, **kwargs)
            first = next(gen)
        except StopIteration:
            raise PluginError(plugin, hook, "hookwrapper returned without yielding") from None
        except PluginError:
            raise
        except Exception as exc:
            raise named(exc) from exc
        outcome = yield first
        below = outcome.get_result() if outcome.exception is None else None
        try:
            gen.send(outcome)
        except StopIteration:
            pass
        except PluginError:
            raise
        except Exception as exc:
            raise named(exc) from exc
        else:
            raise PluginError(plugin, hook, "hookwrapper yielded more than once")
        if check is not None and outcome.exception is None:
            result = outcome.get_result()
            if result is not None and result is not below:
                outcome.force_result(check(plugin, result))

    return call


class HookRelay:
    """The hook relay the engine calls (`plugins.hook.admission(ctx=...)`).

    It calls the implementations as pluggy does (newest first; a decision hook stops at the first
    answer that is not None), with two differences: an observer hook is delivered to every
    implementation even when one raises (the first `PluginError` is raised once all have been
    called, so no other plugin misses the event); and a hook without wrappers calls its
    implementations directly, without pluggy's per-call machinery (a pluggy call costs about three
    times a direct one, and a step makes several). A hook with a wrapper, and every hook while a
    monitor is on (`PluginManager.monitor`), goes through pluggy itself.
    """

    def __init__(self, relay: Any, errors: list[PluginError], owners: Owners | None = None) -> None:
        self._relay = relay
        self._errors = errors
        self.owners = owners if owners is not None else Owners()
        """Whose code is whose: which plugin read a deprecated attribute (`metroline.core.plugins.deprecations`)."""
        self.rebuild(monitored=False)

    def rebuild(self, monitored: bool) -> None:
        """Set up each hook's caller for the plugins registered now."""
        for name in HOOK_NAMES:
            caller = getattr(self._relay, name)
            impls = caller.get_hookimpls()
            if monitored or any(i.wrapper or i.hookwrapper for i in impls):
                call = caller
            elif name in FIRST_ANSWER_HOOKS:
                call = first_answer_caller(impls, caller.get_hookimpls)
            else:
                call = every_answer_caller(impls, caller.get_hookimpls)
            setattr(self, name, delivered_caller(call, self._errors) if name in hookspecs.OBSERVER_HOOKS else call)


def first_answer_caller(impls: list[Any], get_hookimpls: Any) -> Any:
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


def every_answer_caller(impls: list[Any], get_hookimpls: Any) -> Any:
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


def delivered_caller(caller: Any, errors: list[PluginError]) -> Any:
    """An observer hook's caller that raises, after every implementation ran, the first
    `PluginError` an implementation deferred (see `attributed`)."""
    def call(**kwargs: Any) -> Any:
        result = caller(**kwargs)
        if errors:
            first = errors[0]
            errors.clear()
            raise first
        return result

    call.get_hookimpls = caller.get_hookimpls  # the engine skips an observer nobody implements
    return call
