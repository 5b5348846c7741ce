"""`length_pools`: prompts longer than `threshold` tokens go to the replicas of the pool `long`,
the others to the rest; within a pool, the replica with the fewest outstanding tokens (ties: the
lower index). When no replica is in the pool a request belongs to, it goes to the least loaded of
all (or, with `strict`, is refused)."""

from __future__ import annotations

from metroline.api import Refuse, hookimpl


class LengthPools:
    """Options: `threshold` (default 2048 prompt tokens), `long_pool` (default `"long"`), `strict`
    (default False: refuse a request whose pool has no replica instead of sending it elsewhere)."""

    name = "length_pools"

    def __init__(self, threshold: int = 2048, long_pool: str = "long", strict: bool = False) -> None:
        if threshold < 0:
            raise ValueError("threshold must be >= 0")
        self.threshold = threshold
        self.long_pool = long_pool
        self.strict = strict

    @hookimpl
    def route(self, request, replicas):
        long = request.prompt_len > self.threshold
        pool = self.long_pool
        best, best_load = -1, 0
        for r in replicas:
            if (r.pool == pool) is long:
                load = r.outstanding.total
                if best < 0 or load < best_load:
                    best, best_load = r.index, load
        if best >= 0:
            return best
        if self.strict:
            kind = f"pool {self.long_pool!r}" if long else f"a pool other than {self.long_pool!r}"
            return Refuse(f"prompt of {request.prompt_len} tokens and no replica in {kind}")
        return _least_loaded(replicas)


def _least_loaded(replicas) -> int:
    best, best_load = -1, 0
    for r in replicas:
        load = r.outstanding.total
        if best < 0 or load < best_load:
            best, best_load = r.index, load
    return best
