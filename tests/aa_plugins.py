"""A plugin with private randomness, for A/A checks (`compare --aa`): random order of service."""

from __future__ import annotations

import random

from metroline.api import Candidates, hookimpl


class RandomOrder:
    """Admission in a random order (random order of service), drawn from `ctx.salt`: two engines
    with different salts serve the same queue in different orders."""

    name = "random_order"

    def __init__(self) -> None:
        self._rng: random.Random | None = None

    @hookimpl
    def admission(self, ctx):
        if self._rng is None:
            self._rng = random.Random(ctx.salt)
        waiting = list(ctx.waiting)
        self._rng.shuffle(waiting)
        return Candidates(waiting, head_of_line=False)
