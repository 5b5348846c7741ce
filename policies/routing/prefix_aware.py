"""`prefix_aware`: cache-aware routing with a load bound, as SGLang's router: the replica whose
prefix cache holds the longest prefix of the prompt, unless its load exceeds the least loaded
replica's by more than `load_bound`; then (and when no replica has a hit) the least loaded one.

Load is a replica's outstanding requests (routed there, not ended). Ties: the lower load, then the
lower index."""

from __future__ import annotations

from metroline.api import hookimpl


class PrefixAwareRouter:
    """Options: `load_bound` (default 8): how many more outstanding requests than the least loaded
    replica the replica with the longest hit may have and still get the request."""

    name = "prefix_aware"

    def __init__(self, load_bound: int = 8) -> None:
        if load_bound < 0:
            raise ValueError("load_bound must be >= 0")
        self.load_bound = load_bound

    @hookimpl
    def route(self, request, replicas):
        loads = [r.outstanding_requests for r in replicas]
        least = min(range(len(replicas)), key=loads.__getitem__)
        bound = loads[least] + self.load_bound
        best, best_hit, best_load = least, 0, loads[least]
        for r in replicas:
            i = r.index
            load = loads[i]
            if load > bound:
                continue
            # The hit that would take the request from the best so far (a tie needs a lower load):
            # a view answers 0 below it, often after one probe.
            need = 1 if not best_hit else best_hit if load < best_load else best_hit + 1
            hit = r.prefix_hit_at_least(request, need)
            if hit > best_hit or (hit == best_hit and hit and load < best_load):
                best, best_hit, best_load = i, hit, load
        return best
