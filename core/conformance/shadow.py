"""What the stack would have answered without the plugin under test: the implementations below it,
asked the same question in the same state, their answer discarded (`hook_coverage` compares it
with the plugin's to count a changed answer).

For a plain implementation of a decision hook, "below" is the plain implementations of lower
precedence (the base policy, the defaults). For a `sample` wrapper, whose effect is often the bans
and biases it registers on the context rather than another answer, it is the plain samplers run
with the masks the wrapper found when it was called (not the ones it added). `admission`
answers are compared as the scheduler pulls them (`AdmissionShadow`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plugins.candidates import Candidates, close_candidates

_END = object()


class Shadow:
    """Asks the plain implementations `below` (in pluggy's order, lowest precedence first) of
    `hook` in `engine`, keeping the engine's record of who answered untouched."""

    def __init__(self, engine: Any, hook: str, below: list[Any], calls: dict[str, dict[str, Any]]) -> None:
        self.plugins = engine.plugins
        self.hook = hook
        self.chain = [(i.function, tuple(i.argnames)) for i in reversed(below)]
        self._calls = calls

    def kwargs(self) -> dict[str, Any]:
        """The arguments of the hook's call under way (recorded by a hook-call monitor)."""
        return self._calls.get(self.hook, {})

    def answer(self) -> Any:
        """The first answer that is not None of the implementations below, for the call under way."""
        kwargs = self.kwargs()
        answerer = self.plugins._answerer
        had = answerer.get(self.hook)
        try:
            for fn, names in self.chain:
                result = fn(*[kwargs[n] for n in names])
                if result is not None:
                    return result
            return None
        finally:
            if had is None:
                answerer.pop(self.hook, None)
            else:
                answerer[self.hook] = had

    def sample_without(self, masks_before: Any) -> Any:
        """The samplers' tokens with the context's masks as they were before the wrapper ran."""
        ctx = self.kwargs()["ctx"]
        masks = ctx._masks
        ctx._masks = masks_before
        try:
            return self.answer()
        finally:
            ctx._masks = masks


def copy_masks(masks: Any) -> Any:
    """A copy of the `LogitMasks` of a `sample` call (None stays None)."""
    if masks is None:
        return None
    from ..requests.logit_masks import LogitMasks

    out = LogitMasks(masks.seqs)
    out.banned = {r: set(s) for r, s in masks.banned.items()}
    out.biases = {r: dict(d) for r, d in masks.biases.items()}
    out.row_biases = list(masks.row_biases)
    return out


class AdmissionShadow:
    """One `admission` answer of a plain implementation, compared with the answer below as the
    scheduler pulls it: each candidate pulled is compared with the next one of the answer below,
    pulled at the same moment (before the scheduler admits either); changed when one differs
    (dropped, added or reordered), when one answer ran out before the other, or when
    `head_of_line` differs."""

    def __init__(self, below: Any, on_change: Callable[[], None]) -> None:
        self.below = below if isinstance(below, Candidates) else Candidates(below)
        self.on_change = on_change

    def wrap(self, answer: Candidates) -> Candidates:
        head = answer.head_of_line != self.below.head_of_line
        return Candidates(self._paired(iter(answer), iter(self.below), head), answer.head_of_line)

    def _paired(self, items: Any, below: Any, changed: bool) -> Any:
        try:
            for seq in items:
                if not changed and next(below, _END) is not seq:
                    changed = True
                yield seq
            if not changed and next(below, _END) is not _END:
                changed = True
        finally:
            close_candidates(items)
            close_candidates(below)
            if changed:
                self.on_change()
