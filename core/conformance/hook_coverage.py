"""Which of a plugin's hooks ran, and which changed anything: the coverage half of `check_plugin`.

`watch(engine, plugin, coverage)` wraps each hook implementation of the plugin registered as
`plugin` in `engine` with a counter that adds to `coverage` (hook name -> `HookCoverage`):

- `calls`: how many times the implementation was called;
- `changed`: how many of its answers made a difference. For a plain implementation of a decision
  hook (`firstresult`): an answer other than the one the implementations below it give when asked
  the same question (`shadow.Shadow`; `admission`'s candidates compared as the scheduler pulls
  them); for `check_request`: a refusal. For a
  `wrapper=True` implementation: an answer other than the one it received from below (neither
  the same object nor equal to it), or an exception turned into an answer or raised in place of
  one. An `admission` wrapper's candidates are compared as the scheduler pulls them: it changed
  the answer when the candidates it let through differ from those it pulled from below (one
  dropped, added or reordered, or its answer ended before the one below did), or when it changed
  `head_of_line`; a `Candidates.filter` whose test rejects no candidate pulled is no change. A
  `sample` wrapper's answer is compared with the samplers' tokens without the masks it
  registered (`ctx.ban_tokens` & co.). For
  an old-style `hookwrapper`: a result it forced. For an observer (`on_*`), whose effect is the
  plugin's own state, it is None: only its calls are counted.

A hook that was never called, or never changed an answer, is a code path of the plugin that the
workload did not reach: `HookCoverage.problem` says which.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from ..plugins.candidates import Candidates, close_candidates
from ..plugins.hookspecs import OBSERVER_HOOKS
from ..plugins.manager import HOOK_NAMES
from .shadow import AdmissionShadow, Shadow, copy_masks


@dataclass
class HookCoverage:
    """How a plugin's implementation of one hook was exercised (see the module docstring)."""

    hook: str
    calls: int = 0
    changed: int | None = 0  # None for an observer hook

    @property
    def problem(self) -> str | None:
        """Why the hook's code path looks untested (`"never called"`, `"called 40 times, never
        changed an answer"`), or None."""
        if self.calls == 0:
            return "never called"
        if self.changed == 0:
            return f"called {self.calls} times, never changed an answer"
        return None

    def count_change(self) -> None:
        """One more changed answer (nothing for an observer hook, whose changes are not counted)."""
        if self.changed is not None:
            self.changed += 1

    def __str__(self) -> str:
        changed = "" if self.changed is None else f", changed the answer {self.changed} times"
        return f"{self.hook}: called {self.calls} times{changed}"


def watch(engine: Any, plugin: str, coverage: dict[str, HookCoverage]) -> None:
    """Count the calls and changed answers of `plugin`'s hook implementations into `coverage`
    (missing entries are created). Call it before `engine.plugins.monitor`, which makes every
    hook call go through the wrapped implementations."""
    calls: dict[str, dict[str, Any]] = {}  # hook -> the arguments of its call under way

    def before(hook_name: str, impls: Any, kwargs: dict) -> None:
        calls[hook_name] = kwargs

    engine.plugins.monitor(before, lambda *a: None)
    for hook in HOOK_NAMES:
        impls = getattr(engine.plugins.hook, hook).get_hookimpls()
        plain = [i for i in impls if not (i.wrapper or i.hookwrapper)]
        for impl in impls:
            if impl.plugin_name != plugin:
                continue
            cov = coverage.setdefault(hook, HookCoverage(hook, changed=None if hook in OBSERVER_HOOKS else 0))
            below = Shadow(engine, hook, plain[: plain.index(impl)] if impl in plain else plain, calls)
            if impl.wrapper:
                impl.function = _counted_wrapper(impl.function, cov, below if hook == "sample" else None)
            elif impl.hookwrapper:
                impl.function = _counted_old_wrapper(impl.function, cov)
            elif hook in SHADOWED:
                impl.function = _shadowed(impl.function, cov, below)
            else:
                impl.function = _counted(impl.function, cov)


SHADOWED = frozenset({"admission", "select_victim", "split_budget", "order_running", "sample", "estimate_output_tokens"})
"""Decision hooks whose plain implementations are compared with the answer of the stack below."""


def _shadowed(fn: Callable[..., Any], cov: HookCoverage, below: Shadow) -> Callable[..., Any]:
    """A plain decision implementation, counted: an answer is a change when the implementations
    below it, asked the same question, answer otherwise (`shadow.Shadow`)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        cov.calls += 1
        answer = fn(*args, **kwargs)
        if answer is None:
            return answer
        other = below.answer()
        if isinstance(answer, Candidates) or cov.hook == "admission":
            answer = answer if isinstance(answer, Candidates) else Candidates(answer)
            return AdmissionShadow(other, cov.count_change).wrap(answer)
        if not _same_answer(answer, other):
            cov.count_change()
        return answer

    return call


def _same_answer(a: Any, b: Any) -> bool:
    """Answers compared as the engine uses them: sequences by identity, lists item by item."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(x is y or _same(x, y) for x, y in zip(a, b))
    return _same(a, b)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a tensor's ==, an object that refuses comparison: not the same
        return False


def _counted(fn: Callable[..., Any], cov: HookCoverage) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        cov.calls += 1
        answer = fn(*args, **kwargs)
        if answer is not None:
            cov.count_change()
        return answer

    return call


def _counted_wrapper(fn: Callable[..., Generator], cov: HookCoverage, samplers: Shadow | None = None
                     ) -> Callable[..., Generator]:
    """A `wrapper=True` implementation, counted: it drives the wrapped generator itself to see
    what it received (`yield`) and what it returned. A `sample` wrapper (`samplers`: the plain
    samplers) is compared with what they choose without the masks it registered."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Generator:
        cov.calls += 1
        inner = fn(*args, **kwargs)
        if samplers is not None:
            masks_before = copy_masks(getattr(samplers.kwargs().get("ctx"), "_masks", None))
        try:
            received = yield next(inner)
        except BaseException as exc:
            answer = _finish(inner, inner.throw, exc, cov)  # raises again unless the wrapper answers
            cov.count_change()
            return answer
        tap = _AdmissionTap(cov, received) if isinstance(received, Candidates) else None
        sent = received if tap is None else tap.received()
        answer = _finish(inner, inner.send, sent, cov)
        if tap is not None and isinstance(answer, Candidates):
            return tap.answered(answer)  # judged as the scheduler pulls the candidates
        if samplers is not None and masks_before is not None:
            sent = samplers.sample_without(masks_before)
        if not _same_answer(answer, sent):
            cov.count_change()
        return answer

    return call


def _finish(inner: Generator, resume: Callable[[Any], Any], value: Any, cov: HookCoverage) -> Any:
    """Resume the wrapped wrapper with `value`; its answer (the generator's return value)."""
    try:
        resume(value)
    except StopIteration as stop:
        return stop.value
    except BaseException as exc:
        if exc is not value:
            cov.count_change()  # it raised its own error in place of an answer
        raise
    inner.close()
    raise RuntimeError(f"the {cov.hook} wrapper yielded twice")


_END = object()
"""Logged after the last candidate of an iterable that ran out."""


class _AdmissionTap:
    """One call of an `admission` wrapper: the candidates it pulled from the answer below and
    those it let through, compared when the scheduler is done with its answer."""

    def __init__(self, cov: HookCoverage, received: Candidates) -> None:
        self.cov = cov
        self.below = received
        self.pulled: list[Any] = []  # then _END if the answer below ran out
        self.passed: list[Any] = []  # then _END if the wrapper's answer ran out
        self.head_of_line_changed = False

    def received(self) -> Candidates:
        """The answer below, as the wrapper gets it: the same candidates, recorded as pulled."""
        return Candidates(_logged(iter(self.below), self.pulled), self.below.head_of_line)

    def answered(self, answer: Candidates) -> Candidates:
        """The wrapper's answer, as the scheduler gets it: the same candidates, recorded as let
        through; judged when the scheduler closes it or pulls it to the end."""
        self.head_of_line_changed = answer.head_of_line != self.below.head_of_line
        return Candidates(_logged(iter(answer), self.passed, self._judge), answer.head_of_line)

    def _judge(self) -> None:
        passed, pulled = self.passed, self.pulled
        # while the scheduler still pulled, each candidate let through is the next one pulled;
        # an answer that ran out did so with the one below, after the same candidates
        same = passed == pulled if passed[-1:] == [_END] else passed == pulled[: len(passed)]
        if self.head_of_line_changed or not same:
            self.cov.count_change()


def _logged(items: Iterator[Any], log: list[Any], then: Callable[[], None] | None = None) -> Iterator[Any]:
    """`items`, each appended to `log` as it is pulled (and `_END` when they run out); once closed
    or run out, `items` is closed and `then()` called."""
    try:
        for seq in items:
            log.append(seq)
            yield seq
        log.append(_END)
    finally:
        close_candidates(items)
        if then is not None:
            then()


def _counted_old_wrapper(fn: Callable[..., Generator], cov: HookCoverage) -> Callable[..., Generator]:
    """An old-style `hookwrapper=True` implementation, counted: a result it forces is a change."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Generator:
        cov.calls += 1
        inner = fn(*args, **kwargs)
        outcome = yield next(inner)
        before = _outcome(outcome)
        try:
            inner.send(outcome)
        except StopIteration:
            pass
        else:
            inner.close()
            raise RuntimeError(f"the {cov.hook} hookwrapper yielded twice")
        if not _same(_outcome(outcome), before):
            cov.count_change()

    return call


def _outcome(outcome: Any) -> Any:
    return outcome.exception if outcome.exception is not None else outcome.get_result()
