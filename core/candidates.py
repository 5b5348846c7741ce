"""`Candidates`: an answer of the `admission` hook that states its head-of-line behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sequence import Sequence


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

    def filter(self, keep: Callable[[Sequence], bool]) -> Candidates:
        """The same candidates lazily filtered by `keep`, with the same head-of-line behaviour."""
        return Candidates((s for s in self._items if keep(s)), self.head_of_line)
