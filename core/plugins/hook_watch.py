"""The per-hook time budget: every plugin call is timed against `budget_s`, and a call that runs
past it is ended with an error naming the plugin, the hook and the time.

A hook runs inside the engine's step, so a plugin that sleeps or loops for one request's sake
holds up every request of the step; the budget bounds that. `HookWatch` is the plugin manager's
(`PluginManager.watch`); its budget is None (off) until a server sets one (`[serve]
hook_budget_s`; a replay has no budget: its clock is simulated).

- **Timed.** `hook_relay.attributed` calls each implementation through `HookWatch.call`, and
  `hook_relay.timed_parts` each part of a wrapper's own code (up to its `yield`, and after it; the
  implementations it wraps are timed as their own calls, in between): a call
  that returns after more than `budget_s` seconds is turned into a `PluginError` ("took 2.31 s,
  over the hook budget of 1 s"), which then fails what any error of that hook fails (its request
  alone for `check_request`, `on_arrival` and `estimate_output_tokens`; see "Plugin errors" in
  docs/architecture.md).
- **Interrupted.** A call still running at the budget is interrupted when a `Watchdog` thread runs
  (the server starts one) and the call runs in the main thread, where the server steps a
  simulated engine on its event loop: a signal (`SIGALRM`) whose handler raises `HookOverBudget`
  inside the call (a plugin's sleep or loop ends there), and the call ends as the timed error
  above. A call in another thread (an executor that steps in a worker thread, as the torch one
  does) is not interrupted (no exception can be raised into a thread safely at a chosen point):
  it ends as the timed error when it returns, and the event loop answers `/health` and the other
  requests' I/O meanwhile. Either way the watchdog names the call on stderr once it is overdue.

`overruns` counts the calls ended over the budget, by (plugin, hook), for `/metrics`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import PluginError

_now = time.perf_counter


class HookOverBudget(BaseException):  # noqa: N818 - not an Exception, so a plugin's `except Exception` lets it through
    """Raised inside a plugin call that ran past the hook budget (by the watchdog)."""


class _Call:
    __slots__ = ("hook", "interrupted", "plugin", "started", "thread")

    def __init__(self, plugin: str, hook: str, started: float, thread: int) -> None:
        self.plugin, self.hook, self.started, self.thread = plugin, hook, started, thread
        self.interrupted = False


class HookWatch:
    """Times plugin calls against `budget_s` (None: no budget, nothing is timed)."""

    def __init__(self, budget_s: float | None = None) -> None:
        self.budget_s = budget_s
        self.overruns: Counter[tuple[str, str]] = Counter()
        self.on_overrun: Callable[[str, str, float], None] | None = None
        """Called with (plugin, hook, seconds) for each call ended over the budget (metrics)."""
        self._calls: list[_Call] = []  # the outermost call first (a hook may ask another: `ctx.hook`)
        self._raise_in: _Call | None = None  # the call the watchdog interrupted, until it has raised

    def call(self, plugin: str, hook: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """`fn(*args, **kwargs)`, timed; past the budget, a `PluginError` naming the time."""
        budget = self.budget_s
        if budget is None:
            return fn(*args, **kwargs)
        me = _Call(plugin, hook, _now(), threading.get_ident())
        calls = self._calls
        calls.append(me)
        try:
            try:
                result = fn(*args, **kwargs)
            finally:
                if calls and calls[-1] is me:
                    calls.pop()
        except HookOverBudget:
            if me in calls:
                calls.remove(me)
            if not me.interrupted:  # raised for an enclosing call: that call reports it
                raise
            self._raise_in = None
            raise self._over(me, budget, interrupted=True) from None
        if _now() - me.started > budget:
            raise self._over(me, budget, interrupted=False)
        return result

    def _over(self, call: _Call, budget: float, interrupted: bool) -> PluginError:
        took = _now() - call.started
        self.overruns[call.plugin, call.hook] += 1
        if self.on_overrun is not None:
            self.on_overrun(call.plugin, call.hook, took)
        how = "was stopped after" if interrupted else "took"
        return PluginError(call.plugin, call.hook,
                           f"{how} {took:.2f} s, over the hook budget of {budget:g} s (hook_budget_s)")

    # --- the watchdog's side ---------------------------------------------------------------------

    def overdue(self) -> _Call | None:
        """The outermost call running past the budget and not interrupted yet, marked as
        interrupted (the watchdog then delivers `HookOverBudget` to its thread)."""
        budget, calls = self.budget_s, self._calls
        if budget is None or not calls:
            return None
        try:
            call = calls[0]
        except IndexError:
            return None
        if call.interrupted or _now() - call.started <= budget:
            return None
        call.interrupted = True
        self._raise_in = call
        return call

    def raise_if_interrupted(self) -> None:
        """In the interrupted call's thread (the signal handler): raise `HookOverBudget` if that
        call is still running, once."""
        call = self._raise_in
        if call is not None and call in self._calls and call.thread == threading.get_ident():
            self._raise_in = None
            raise HookOverBudget


class Watchdog:
    """A daemon thread that interrupts plugin calls past `watch`'s budget, every `period` seconds
    (a quarter of the budget, at least 10 ms). `start()` from the main thread installs the
    `SIGALRM` handler that interrupts calls in the main thread; started elsewhere (a server run in a
    thread of its own), it interrupts nothing and only names overdue calls; calls are still timed."""

    def __init__(self, watch: HookWatch) -> None:
        self.watch = watch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._signal = False
        self._previous: Any = None

    def start(self) -> None:
        budget = self.watch.budget_s
        if budget is None or self._thread is not None:
            return
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill"):
            self._previous = signal.signal(signal.SIGALRM, self._handler)
            self._signal = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(max(0.01, budget / 4),),
                                        name="metroline-hook-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self._signal:
            signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._signal = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.watch.raise_if_interrupted()

    def _run(self, period: float) -> None:
        main = threading.main_thread().ident
        while not self._stop.wait(period):
            call = self.watch.overdue()
            if call is None:
                continue
            stopping = call.thread == main and self._signal
            print(f"metroline: plugin {call.plugin!r}, hook {call.hook!r} has run for over "
                  f"{self.watch.budget_s:g} s (hook_budget_s)" + (": interrupting it" if stopping else ""),
                  file=sys.stderr, flush=True)
            if call.thread == main and self._signal:
                signal.pthread_kill(call.thread, signal.SIGALRM)
