"""Load sweeps: every policy at several arrival rates, with SLO attainment, goodput, and the
capacity at SLO (the highest rate at which at least `ATTAINMENT_TARGET` of the requests meet every
SLO).

The workload is replayed at each rate with its arrival times divided by `rate / native rate`
(`scale_items`): the same requests, in the same order, only closer together or further apart, so
two rates differ by the load alone (common random numbers across rates and across policies).

With `rates=None` the rates are found by bisection, for each policy on its own: from the
workload's native rate, doubled (or halved) until the attainment crosses the target, then the
bracket is halved on a log scale until its ends are within `tolerance` of each other. This assumes
the attainment falls as the rate grows (true of a queue; a run's noise can break it near the
crossing, which moves the answer by at most the noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..workloads.build import Workload, scale_items
from .parallel import run_many
from .run_series import RunSeries, series_of
from .slo import ATTAINMENT_TARGET, evaluate

MAX_DOUBLINGS = 10
"""With `rates=None`: how many times the start rate is doubled (or halved) looking for the crossing
before the search gives up (the capacity is then reported as out of range)."""


def native_rate(workload: Workload) -> float:
    """The workload's mean arrival rate in requests per second: (requests - 1) / arrival span.
    Raises `ValueError` when every request arrives at the same time (there is no rate to scale)."""
    items = workload.items
    span = items[-1].arrival_s - items[0].arrival_s if items else 0.0
    if len(items) < 2 or span <= 0:
        raise ValueError(f"workload {workload.name}: all its requests arrive at once, so it has no rate to sweep")
    return (len(items) - 1) / span


def at_rate(base: Workload, rate: float, native: float | None = None) -> Workload:
    """`base` replayed at `rate` requests per second (its arrivals scaled by rate / native rate)."""
    native = native or native_rate(base)
    scale = rate / native
    params = {**base.params, "rate_scale": base.params.get("rate_scale", 1.0) * scale}
    return Workload(base.name, scale_items(base.items, scale), base.description, params)


class Sweep:
    """The runs of one sweep, each (policy label, rate) run at most once."""

    def __init__(
        self, base: Workload, labels: list[str], configs: list[EngineConfig], make_executor: Callable[[], Any],
        bounds: dict[str, float], *, target: float = ATTAINMENT_TARGET, **run_options: Any,
    ) -> None:
        self.base, self.native = base, native_rate(base)
        self.labels, self.configs = labels, dict(zip(labels, configs))
        self.make_executor, self.bounds, self.target = make_executor, bounds, target
        self.run_options = run_options
        self.docs: dict[tuple[str, float], dict[str, Any]] = {}
        self.series: dict[tuple[str, float], RunSeries] = {}

    def run(self, points: list[tuple[str, float]]) -> None:
        """Run the (label, rate) points not run yet, all in one pool."""
        todo, runs, labels = self.pending(points)
        if todo:
            self.record(todo, runs, run_many(runs, self.make_executor, extract=series_of, labels=labels,
                                             **self.run_options))

    def pending(self, points: list[tuple[str, float]]) -> tuple[list[tuple[str, float]], list[tuple], list[str]]:
        """The (label, rate) points of `points` not run yet, their runs (workload at the rate,
        config) and their progress labels: what `run` hands `run_many` (and `SeededSweep` pools)."""
        todo = [p for p in dict.fromkeys(points) if p not in self.docs]
        workloads = {rate: at_rate(self.base, rate, self.native) for _, rate in todo}
        runs = [(workloads[rate], self.configs[label]) for label, rate in todo]
        return todo, runs, [f"{label}@{rate:.4g}" for label, rate in todo]

    def record(self, todo: list[tuple[str, float]], runs: list[tuple], results: list[tuple[dict[str, Any], RunSeries]]) -> None:
        """Keep the results of the `pending` points `todo` (with their `runs`), with their offered
        rate and SLO figures."""
        for (label, rate), (workload, _), (doc, series) in zip(todo, runs, results):
            doc["offered"] = {"rate_req_s": rate, "rate_scale": workload.params["rate_scale"]}
            doc["slo"] = evaluate(series.records, self.bounds, doc["summary"]["duration_s"])
            self.docs[label, rate] = doc
            self.series[label, rate] = series

    def passes(self, label: str, rate: float) -> bool:
        attainment = self.docs[label, rate]["slo"]["attainment"]
        return attainment is not None and attainment >= self.target

    def over_rates(self, rates: list[float]) -> dict[str, dict[str, Any]]:
        """Run every policy at every rate; the capacity at SLO of each policy: the highest of the
        rates that passes, bracketed by the next higher rate (None when it is the highest)."""
        rates = sorted(set(rates))
        self.run([(label, r) for label in self.labels for r in rates])
        capacity = {}
        for label in self.labels:
            passing = [r for r in rates if self.passes(label, r)]
            best = passing[-1] if passing else None
            higher = [r for r in rates if best is None or r > best]
            capacity[label] = self._capacity(label, best, higher[0] if higher else None)
        return capacity

    def bisect(self, tolerance: float = 0.05, start: float | None = None) -> dict[str, dict[str, Any]]:
        """The capacity at SLO of each policy by bisection (see the module's docstring), to a
        relative `tolerance`; the search of every policy advances in the same pool, round by round."""
        if not tolerance > 0:
            raise ValueError(f"tolerance: must be > 0, got {tolerance!r}")
        start = start or self.native
        lo: dict[str, float | None] = dict.fromkeys(self.labels)
        hi: dict[str, float | None] = dict.fromkeys(self.labels)
        nxt: dict[str, float | None] = dict.fromkeys(self.labels, start)
        while any(r is not None for r in nxt.values()):
            self.run([(label, r) for label, r in nxt.items() if r is not None])
            for label, rate in list(nxt.items()):
                if rate is None:
                    continue
                if self.passes(label, rate):
                    lo[label] = rate
                else:
                    hi[label] = rate
                nxt[label] = _next_rate(lo[label], hi[label], start, tolerance)
        return {label: self._capacity(label, lo[label], hi[label]) for label in self.labels}

    def _capacity(self, label: str, passing: float | None, failing: float | None) -> dict[str, Any]:
        return {
            "rate_req_s": passing,
            "bracket": [passing, failing],
            "attainment": self.docs[label, passing]["slo"]["attainment"] if passing is not None else None,
        }

    def document(self, capacity: dict[str, dict[str, Any]], mode: str, tolerance: float | None) -> dict[str, Any]:
        """The sweep's result document: `{"sweep", "capacity", "points"}`, the points (result
        documents with their `offered` rate and `slo` figures) by policy, then rate."""
        order = {label: i for i, label in enumerate(self.labels)}
        keys = sorted(self.docs, key=lambda k: (order[k[0]], k[1]))
        return {
            "sweep": {
                "mode": mode, "bounds": self.bounds, "attainment_target": self.target, "tolerance": tolerance,
                "native_rate_req_s": self.native, "policies": self.labels, "workload": self.base.describe(),
            },
            "capacity": capacity,
            "points": [self.docs[k] for k in keys],
        }


def _next_rate(lo: float | None, hi: float | None, start: float, tolerance: float) -> float | None:
    """The next rate to try given the highest passing (`lo`) and lowest failing (`hi`) so far;
    None when the search is over."""
    limit = 2.0 ** MAX_DOUBLINGS
    if lo is None:
        return hi / 2 if hi / 2 >= start / limit else None
    if hi is None:
        return lo * 2 if lo * 2 <= start * limit else None
    if hi <= lo * (1 + tolerance):
        return None
    return math.sqrt(lo * hi)
