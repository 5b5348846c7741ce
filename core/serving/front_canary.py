"""A canary while serving: the front splits each canary pool's traffic between its arms (the split
of `core/cluster/targets.py`: an exact interleaved percent, or by tenant), records each arm's
streamed requests as it sees them, and compares the arms (`results/canary.py`) on `/v1/canary`
(what `metroline canary-report http://...` reads), with per-arm TTFT and TPOT histograms on
`/metrics`.

What the front measures, per streamed request that ended well: TTFT from receiving the request
to the replica's first content event, TPOT as the time from that event to the last one divided
by the content events after the first (one event per token, as the replica streams them), and
the end-to-end time. A request that is not streamed has no first token to time at the front: it
counts in `/metrics`' end-to-end histograms but not in the comparison.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from ..cluster.spec import BASELINE, CANARY, ClusterSpec, ReplicaPlan, config_changes
from ..cluster.targets import ArmSplit
from ..cluster.view import RouteRequest
from ..results.canary import compare_arms, samples_of_rows
from .metrics import _LATENCY

MAX_ROWS = 100_000
"""The most requests each arm keeps for the comparison (the oldest are dropped first)."""

_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


class FrontCanary:
    """The canary pools of a cluster as the front serves them."""

    def __init__(self, spec: ClusterSpec, plans: list[ReplicaPlan], registry: CollectorRegistry) -> None:
        self.splits = [(pool, ArmSplit(p.canary)) for pool, p in spec.pool_specs.items() if p.canary is not None]
        self.arm_of = [plan.arm for plan in plans]  # by replica slot
        self.pool_of = [plan.pool for plan in plans]
        self.policy = {pool: {arm: next(p.policy for p in plans if p.pool == pool and p.arm == arm)
                              for arm in (BASELINE, CANARY)} for pool, _ in self.splits}
        self.changes = {pool: config_changes(next(p.config for p in plans if p.pool == pool and p.arm == BASELINE),
                                             next(p.config for p in plans if p.pool == pool and p.arm == CANARY))
                        for pool, _ in self.splits}
        self.rows: dict[str, dict[str, deque]] = {
            pool: {BASELINE: deque(maxlen=MAX_ROWS), CANARY: deque(maxlen=MAX_ROWS)} for pool, _ in self.splits}
        self.started = time.monotonic()
        labels = ("pool", "arm")
        self.ttft = Histogram("metroline_front_canary_ttft_seconds", "Time to the first content event of a "
                              "streamed request, by canary pool and arm", labels, registry=registry, buckets=_LATENCY)
        self.tpot = Histogram("metroline_front_canary_tpot_seconds", "Time per output event after the first of a "
                              "streamed request, by canary pool and arm", labels, registry=registry,
                              buckets=_TPOT_BUCKETS)
        for pool, _ in self.splits:
            for arm in (BASELINE, CANARY):
                self.ttft.labels(pool, arm)
                self.tpot.labels(pool, arm)

    def arms(self, request: RouteRequest) -> dict[str, str]:
        """pool -> the request's arm there, for every canary pool (called once per request)."""
        return {pool: split(request) for pool, split in self.splits}

    def allows(self, slot: int, arms: dict[str, str]) -> bool:
        """Whether the replica in `slot` is one the request of `arms` may be routed to."""
        pool = self.pool_of[slot]
        return pool not in arms or self.arm_of[slot] == arms[pool]

    def record(self, slot: int, started: float, first: float | None, last: float | None, events: int,
               ended: float) -> None:
        """A streamed request served by the replica in `slot` ended well: received at `started`,
        first and last content events at `first` and `last`, `events` content events."""
        arm = self.arm_of[slot]
        if arm is None or first is None:
            return
        pool = self.pool_of[slot]
        ttft = first - started
        tpot = (last - first) / (events - 1) if events > 1 and last is not None else None
        self.ttft.labels(pool, arm).observe(ttft)
        if tpot is not None:
            self.tpot.labels(pool, arm).observe(tpot)
        self.rows[pool][arm].append((started - self.started, ttft, tpot, ended - started))

    def report(self) -> dict[str, Any]:
        """`/v1/canary`: per canary pool, each arm's policy stack, its rows `[arrival_s, ttft_s,
        tpot_s, e2e_s]` and the comparison of the arms."""
        pools = {}
        for pool, arms in self.rows.items():
            rows = {arm: [list(r) for r in arms[arm]] for arm in (BASELINE, CANARY)}
            pools[pool] = {
                "policy": self.policy[pool], "changes": self.changes[pool], "rows": rows,
                "comparison": compare_arms(samples_of_rows(rows[BASELINE]), samples_of_rows(rows[CANARY])),
            }
        return {"kind": "metroline.canary", "pools": pools}


def content_events(chunk: bytes) -> int:
    """How many server-sent events with output in them `chunk` holds (`data:` frames other than
    `[DONE]` and errors)."""
    n = chunk.count(b"data: ")
    if n:
        n -= chunk.count(b"data: [DONE]") + chunk.count(b'data: {"error"')
    return n
