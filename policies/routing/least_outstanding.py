"""`least_outstanding_tokens`: the replica with the fewest outstanding tokens (prompt plus
`max_new_tokens` of the requests routed there that have not ended); ties to the lowest index."""

from __future__ import annotations

from metroline.api import hookimpl


class LeastOutstandingTokens:
    """Join the replica with the least outstanding work, in tokens."""

    name = "least_outstanding_tokens"

    @hookimpl
    def route(self, request, replicas):
        best, best_load = 0, None
        for r in replicas:
            load = r.outstanding.total
            if best_load is None or load < best_load:
                best, best_load = r.index, load
        return best
