"""`round_robin`: replica 0, 1, ..., N-1, 0, ... in arrival order (the default router)."""

from __future__ import annotations

from metroline.api import hookimpl


class RoundRobin:
    """Each request to the next replica in turn, whatever their load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    @hookimpl
    def route(self, request, replicas):
        i = self._next
        if i >= len(replicas):
            i = 0
        self._next = i + 1
        return i
