"""The front's `/metrics` (`front.py`): its own Prometheus registry, every series labelled with the
`replica` and its `pool`, measured at the front (a replica's own metrics stay at its `/metrics`,
reachable through the front at `/replicas/<name>/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from .metrics import _LATENCY

_LABELS = ("replica", "pool")


class FrontMetrics:
    """Requests routed, in flight and failed, replica up, TTFT and end-to-end latency per replica."""

    def __init__(self, replicas: list[tuple[str, str]]) -> None:
        r = self.registry = CollectorRegistry()
        self.routed = Counter("metroline_front_requests_routed", "Requests the router sent to a replica",
                              _LABELS, registry=r)
        self.in_flight = Gauge("metroline_front_requests_in_flight", "Requests proxied to a replica and not ended",
                               _LABELS, registry=r)
        self.failed = Counter("metroline_front_requests_failed", "Requests that failed with their replica "
                              "(connection lost or refused)", _LABELS, registry=r)
        self.up = Gauge("metroline_front_replica_up", "1 while the front routes to the replica, 0 once it is down",
                        _LABELS, registry=r)
        self.ttft = Histogram("metroline_front_ttft_seconds", "Time from the front receiving a streamed request "
                              "to the replica's first bytes of output", _LABELS, registry=r, buckets=_LATENCY)
        self.e2e = Histogram("metroline_front_e2e_seconds", "Time from the front receiving a request to its "
                             "last byte", _LABELS, registry=r, buckets=_LATENCY)
        self.refused = Counter("metroline_front_requests_refused", "Requests no replica took (reason: router, "
                               "no_replica)", ["reason"], registry=r)
        ProcessCollector(registry=r)  # the front's own process_resident_memory_bytes (each replica's: its /metrics)
        for name, pool in replicas:  # every series exists from the start, at 0
            for metric in (self.routed, self.in_flight, self.failed, self.ttft, self.e2e):
                metric.labels(name, pool)
            self.up.labels(name, pool).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
