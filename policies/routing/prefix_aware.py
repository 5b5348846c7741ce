"""`prefix_aware`: cache-aware routing with a load bound, as SGLang's router: the replica with the
longest prefix hit of the prompt, unless its load exceeds the least loaded replica's by more than
`load_bound`; then (and when no replica has a hit) the least loaded one.

Load is a replica's outstanding requests (routed there, not ended). Ties: the lower load, then the
lower index.

Where the hits come from: in a cluster (the simulated one, the front of `metroline serve
--replicas`) the views share the cluster's `PrefixDirectory`, the blocks of the prompts routed to
each replica (salted per tenant at the front), and a route is one binary search over the prompt's
first `MAX_ESTIMATE_BLOCKS` block hashes for all replicas at once, as SGLang's router matches its
approximate tree instead of asking the workers. That is an estimate: a prompt counts on a replica
from its routing on (before the replica has computed it) until the directory ages it out, even if
the replica has evicted it; hits are counted up to `MAX_ESTIMATE_BLOCKS` blocks (longer shared
prefixes tie, the load decides). Views without a directory (hand-built ones), or the option
`ask_replicas`, ask each view's `prefix_hit` instead: in simulation the replica's own cache, exact,
at one query per replica within the bound.
"""

from __future__ import annotations

from metroline.api import hookimpl


class PrefixAwareRouter:
    """Options: `load_bound` (default 8): how many more outstanding requests than the least loaded
    replica the replica with the longest hit may have and still get the request; `ask_replicas`
    (default false): ask each view's `prefix_hit` instead of the cluster's directory."""

    name = "prefix_aware"

    def __init__(self, load_bound: int = 8, ask_replicas: bool = False) -> None:
        if load_bound < 0:
            raise ValueError("load_bound must be >= 0")
        self.load_bound = load_bound
        self.ask_replicas = bool(ask_replicas)
        self._shown: tuple = ()  # the last tuple of views routed over, and of it:
        self._directory = None  # their directory
        self._bits: list[int] = []  # each view's bit in the directory
        self._outstanding: list = []  # each view's `outstanding`
        self._all = 0  # all their bits
        self._holders: dict[int, tuple[int, ...]] = {}  # a mask of bits -> their positions, in order
        self._known: dict[int, tuple] = {}  # id(tuple) -> (tuple, directory, bits, outstanding, holders, all): the others seen

    @hookimpl
    def route(self, request, replicas):
        if replicas is not self._shown and not self._learn(replicas):
            return self._ask_each(request, replicas)  # no directory shared by all the views
        directory = self._directory
        outstanding = self._outstanding
        chain = request.block_chain(directory.block_size, directory.max_blocks)
        among, bound = self._all, -1
        while True:
            mask = directory.longest(chain, among)[1]
            if not mask:
                break
            # the holder of the longest hit with the fewest outstanding requests (the lower
            # position on a tie), unless it is over the bound (it cannot be with at most
            # `load_bound`: the bound is only computed when it may bind)
            holders = self._holders.get(mask) or self._holders_of(mask)  # in order
            best = holders[0]
            low = len(outstanding[best])
            for i in holders:
                load = len(outstanding[i])
                if load < low:
                    best, low = i, load
            if low <= self.load_bound:
                return best
            if bound < 0:
                bound = min(map(len, outstanding)) + self.load_bound
            if low <= bound:
                return best
            # every holder of the longest hit is over the bound: the longest among those within it
            among = 0
            for bit, out in zip(self._bits, outstanding):
                if len(out) <= bound:
                    among |= bit
        loads = list(map(len, outstanding))
        return loads.index(min(loads))

    def _holders_of(self, mask: int) -> tuple[int, ...]:
        """The positions whose bits are in `mask`, in order (remembered per tuple of views)."""
        if len(self._holders) >= 4096:
            self._holders.clear()
        holders = self._holders[mask] = tuple(i for i, bit in enumerate(self._bits) if bit & mask)
        return holders

    def _learn(self, replicas) -> bool:
        """Take the directory, bits and `outstanding` of another tuple of views (a cluster keeps one
        tuple per set of live replicas and canary arm, and a view keeps them while in a tuple);
        False when they share no directory, or have no distinct bits in it (or with `ask_replicas`)."""
        directory = replicas[0].prefix_directory
        if directory is None or self.ask_replicas:
            return False
        known = self._known.get(id(replicas))
        if known is None or known[0] is not replicas:
            if any(r.prefix_directory is not directory for r in replicas):
                return False
            bits = [r.prefix_bit for r in replicas]
            every = 0
            for bit in bits:
                if bit <= 0 or bit & (bit - 1) or bit & every:
                    return False  # not one distinct bit each: ask them one by one
                every |= bit
            if len(self._known) >= 64:
                self._known.clear()
            known = self._known[id(replicas)] = (replicas, directory, bits, [r.outstanding for r in replicas], {},
                                                 every)
        self._shown, self._directory, self._bits, self._outstanding, self._holders, self._all = known
        return True

    def _ask_each(self, request, replicas):
        """The longest `prefix_hit` among the views within the bound, one view at a time."""
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
