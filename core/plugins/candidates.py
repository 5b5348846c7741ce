"""`Candidates`: an answer of the `admission` hook that states its head-of-line behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..requests.sequence import QUEUED, RUNNING, Sequence


class Candidates:
    """Waiting sequences to try, in order, and what a candidate that does not fit does.

    `head_of_line=True`: a candidate that cannot get its KV blocks stops admission for the step
    (strict order, no overtaking). `head_of_line=False`: it is skipped and later candidates may be
    admitted. Either way, running out of slots or prefill budget stops admission.
    """

    __slots__ = ("_items", "head_of_line")

    def __init__(self, items: Iterable[Sequence], head_of_line: bool = True) -> None:
        self._items = items
        self.head_of_line = head_of_line

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._items)

    @staticmethod
    def of(answer: Iterable[Sequence]) -> Candidates:
        """An `admission` answer as `Candidates` (a plain iterable is head-of-line)."""
        return answer if isinstance(answer, Candidates) else Candidates(answer)

    def filter(self, keep: Callable[[Sequence], bool], admitted: Callable[[Sequence], Any] | None = None) -> Candidates:
        """The same candidates without those `keep` rejects (they are passed over, as if absent:
        later candidates may still be admitted), with the same head-of-line behaviour. `keep` is
        called as each candidate is pulled, so it sees the admissions made earlier in the step;
        `admitted(seq)` is told of each candidate it let through that the scheduler admitted,
        before the next one is judged."""
        return Candidates(_filtered(iter(self._items), keep, False, admitted), self.head_of_line)

    def gate(self, admit: Callable[[Sequence], bool], admitted: Callable[[Sequence], Any] | None = None) -> Candidates:
        """The same candidates, where one that `admit` refuses counts as blocked: under
        head-of-line it ends admission for the step (nothing behind it overtakes it), otherwise it
        is skipped. For wrappers that hold candidates back for lack of room (a reserve).
        `admitted` as in `filter`."""
        return Candidates(_filtered(iter(self._items), admit, self.head_of_line, admitted), self.head_of_line)


def _filtered(
    items: Iterator[Sequence], keep: Callable[[Sequence], bool], stop: bool, admitted: Callable[[Sequence], Any] | None
) -> Iterator[Sequence]:
    last = None  # the last candidate let through while it waited: was it admitted?
    try:
        for seq in items:
            if last is not None:
                if last.state is RUNNING:
                    admitted(last)
                last = None
            if keep(seq):
                if admitted is not None and seq.state in QUEUED:
                    last = seq
                yield seq
            elif stop:
                return
    finally:
        if last is not None and last.state is RUNNING:
            admitted(last)
        close_candidates(items)


def close_candidates(items: Any) -> None:
    """Close `items` when it can be closed (a generator): its `finally` runs now, e.g. a
    `LazyHeap.ordered()` puts back what was not taken. A wrapper that stops pulling from the answer
    below it calls this, so the policy's own generator gets its cleanup."""
    close = getattr(items, "close", None)
    if close is not None:
        close()
