"""`power_of_two`: two replicas drawn at random (seeded), the one with fewer outstanding tokens
wins (the first drawn on a tie): the power of two choices."""

from __future__ import annotations

import random

from metroline.api import hookimpl


class PowerOfTwo:
    """Options: `seed` (default 0): the draws are the same on every run with the same seed."""

    name = "power_of_two"

    def __init__(self, seed: int = 0) -> None:
        self._random = random.Random(seed).random

    @hookimpl
    def route(self, request, replicas):
        n = len(replicas)
        if n == 1:
            return 0
        draw = self._random
        a = int(draw() * n)
        b = int(draw() * (n - 1))
        if b >= a:
            b += 1
        return b if replicas[b].outstanding.total < replicas[a].outstanding.total else a
