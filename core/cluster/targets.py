"""The replicas a request may be routed to: every live replica, except that in a pool with a canary
a request sees only the replicas of its arm (`spec.CanarySpec`: a percent of the requests, or the
requests of some tenants). The router never sees the split: it chooses among the views it is
given, whose `index` is their position in that tuple.

A percent split is interleaved, not drawn: of the first k requests, exactly floor(k * percent /
100) (give or take the first) go to the canary, evenly spread. A random draw per request would
give the arms shares that differ by chance, and under load a few percent more traffic is a
latency difference of its own: an A/A canary would be called worse or better for its share, not
its policy. The interleave starts at `seed` percent, so splits with different seeds differ."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .spec import BASELINE, CANARY, CanarySpec, ClusterSpec, ReplicaPlan
from .prefix_directory import PrefixDirectory
from .view import ReplicaView, RouteRequest


class ArmSplit:
    """The arm (`baseline` or `canary`) of each request arriving at a pool whose canary is
    `canary`: by tenant, or every request in turn by the interleave of the module docstring."""

    __slots__ = ("_credit", "_share", "_tenants")

    def __init__(self, canary: CanarySpec) -> None:
        self._tenants = frozenset(canary.tenants) if canary.tenants is not None else None
        self._share = round((canary.percent or 0.0) * 100)  # in 1/10000ths: exact counts, no float drift
        self._credit = (canary.seed % 100) * 100

    def __call__(self, request: RouteRequest) -> str:
        if self._tenants is not None:
            return CANARY if request.tenant in self._tenants else BASELINE
        self._credit += self._share
        if self._credit >= 10_000:
            self._credit -= 10_000
            return CANARY
        return BASELINE


class RouteTargets:
    """`for_request(request)` -> (the views the router sees, the replica index of each view).

    `make_view(replica_index, position)` builds a view of replica `replica_index` whose `index` is
    `position` (its place in the tuple the router gets). Tuples are built once per combination of
    arms and of replicas down (`set_down`), so routing a request costs no allocation."""

    def __init__(self, spec: ClusterSpec, plans: list[ReplicaPlan],
                 make_view: Callable[[int, int], ReplicaView]) -> None:
        self._plans = plans
        self._make_view = make_view
        self._canaries = [(pool, ArmSplit(p.canary)) for pool, p in spec.pool_specs.items() if p.canary is not None]
        self._down: set[int] = set()
        self._tables: dict[tuple[str, ...], tuple[tuple[ReplicaView, ...], list[int]]] = {}
        self._all = self._table(())

    def arms(self, request: RouteRequest) -> tuple[str, ...]:
        """The request's arm in each pool with a canary (in the pools' order); called once per
        request (a percent split counts the requests)."""
        return tuple(split(request) for _, split in self._canaries)

    def for_request(self, request: RouteRequest) -> tuple[tuple[ReplicaView, ...], list[int]]:
        if not self._canaries:
            return self._all
        key = self.arms(request)
        table = self._tables.get(key)
        if table is None:
            table = self._table(key)
        return table

    def set_down(self, index: int, down: bool = True) -> None:
        """Show replica `index` to no router (down) or again (up)."""
        if down:
            self._down.add(index)
        else:
            self._down.discard(index)
        self._tables.clear()
        self._all = self._table(())

    @property
    def live(self) -> int:
        """How many replicas are not down."""
        return len(self._plans) - len(self._down)

    def _table(self, key: tuple[str, ...]) -> tuple[tuple[ReplicaView, ...], list[int]]:
        wanted = {pool: arm for (pool, _), arm in zip(self._canaries, key)}
        chosen = [p.index for p in self._plans
                  if p.index not in self._down and (p.pool not in wanted or p.arm == wanted[p.pool])]
        table = (tuple(self._make_view(i, pos) for pos, i in enumerate(chosen)), chosen)
        self._tables[key] = table
        return table


def cluster_directory(plans: list[ReplicaPlan]) -> PrefixDirectory:
    """The prefix directory of a simulated cluster: as many blocks as its replicas' pools hold
    together, at the first replica's block size (replica `i`'s bit is `1 << i`)."""
    return PrefixDirectory(max(2, sum(p.config.num_blocks for p in plans)), plans[0].config.block_size)


def replica_view(plan: ReplicaPlan, position: int, engine: Any, outstanding: Any,
                 directory: PrefixDirectory | None = None) -> ReplicaView:
    """The view of a simulated replica (an `Engine`) at `position`."""
    return ReplicaView(position, plan.name, plan.pool, plan.policy, engine, outstanding, directory, 1 << plan.index)
