"""Load sweeps over several draws (`sweep --seeds N`): the knee (capacity at SLO) of every policy
on each of N paired draws of the workload, its interval, and the policies' knee ratio with a
paired interval.

One draw's knee is one number from one workload: on five draws of the same 400-request trace one
policy's knee moved between 0.48 and 4.10 req/s. Here every policy runs at every rate of one
common grid (`--rates`, in requests per second) on the same N draws (common random numbers:
`compare --seeds`'s draws), so:

- a policy's knee on draw i is where its SLO attainment crosses the target between the highest
  passing rate of the grid and the next one, interpolated linearly in (log rate, attainment); a
  draw whose attainment never crosses inside the grid has no knee (`out_of_range` counts them, and
  no interval is given while any draw is out of range: widen the grid);
- the knee's interval is the mean over the draws with the expanded bootstrap interval
  (`stats.interval`);
- the ratio of a policy's knee to the baseline's (the first policy) is paired draw by draw: the
  geometric mean of the per-draw ratios, its interval that of the mean log ratio exponentiated;
- every rate's attainment and goodput get their interval over the draws (the plot's bands).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..results.stats import interval
from ..workloads.build import Workload
from .parallel import run_many
from .run_series import series_of
from .slo import ATTAINMENT_TARGET
from .sweep import Sweep


def knee(rates: list[float], attainment: list[float | None], target: float) -> float | None:
    """Where `attainment` (at the sorted `rates`) crosses `target`, interpolated in log rate
    between the highest passing rate and the next one; None when no rate passes or the highest
    rate does."""
    passing = [i for i, a in enumerate(attainment) if a is not None and a >= target]
    if not passing or passing[-1] == len(rates) - 1:
        return None
    i = passing[-1]
    a_p, a_f = attainment[i], attainment[i + 1] or 0.0
    lp, lf = math.log(rates[i]), math.log(rates[i + 1])
    return math.exp(lp + (a_p - target) / (a_p - a_f) * (lf - lp))


class SeededSweep:
    """One `Sweep` per draw of the workload, every policy at every rate of one grid, run in one pool."""

    def __init__(
        self, bases: list[Workload], seeds: list[int], labels: list[str], configs: list[EngineConfig],
        make_executor: Callable[[], Any], bounds: dict[str, float], *, target: float = ATTAINMENT_TARGET,
        **run_options: Any,
    ) -> None:
        self.seeds, self.labels, self.bounds, self.target = seeds, labels, bounds, target
        self.make_executor, self.run_options = make_executor, run_options
        self.sweeps = [Sweep(b, labels, configs, make_executor, bounds, target=target, **run_options) for b in bases]

    @property
    def series(self) -> dict[tuple[str, float], Any]:
        """The first draw's run series by (label, rate), as `Sweep.series` (the load check reads them)."""
        return self.sweeps[0].series

    def over_rates(self, rates: list[float]) -> dict[str, Any]:
        """Run every policy at every rate on every draw; the document's `capacity` (per policy:
        each draw's knee, their interval, the draws out of range) and `ratio` (per policy other
        than the baseline: the paired knee ratio)."""
        rates = sorted(set(rates))
        points = [(label, r) for label in self.labels for r in rates]
        pending = [s.pending(points) for s in self.sweeps]
        runs = [run for _, rs, _ in pending for run in rs]
        labels = [f"{lb}#{seed}" for (_, _, lbs), seed in zip(pending, self.seeds) for lb in lbs]
        results = run_many(runs, self.make_executor, extract=series_of, labels=labels, **self.run_options) if runs else []
        start = 0
        for sweep, (todo, rs, _) in zip(self.sweeps, pending):
            sweep.record(todo, rs, results[start:start + len(rs)])
            start += len(rs)
        knees = {label: [knee(rates, [s.docs[label, r]["slo"]["attainment"] for r in rates], self.target)
                         for s in self.sweeps] for label in self.labels}
        capacity = {label: _knee_summary(k) for label, k in knees.items()}
        base = self.labels[0]
        ratio = {label: _ratio(knees[label], knees[base], base) for label in self.labels[1:]}
        return {"rates": rates, "capacity": capacity, "ratio": ratio, "bands": self._bands(rates)}

    def _bands(self, rates: list[float]) -> dict[str, list[dict[str, Any]]]:
        bands: dict[str, list[dict[str, Any]]] = {}
        for label in self.labels:
            rows = []
            for r in rates:
                slo = [s.docs[label, r]["slo"] for s in self.sweeps]
                att = [x["attainment"] or 0.0 for x in slo]
                good = [x["goodput_req_s"] or 0.0 for x in slo]
                rows.append({"rate_req_s": r, "attainment": interval(att).as_dict(), "goodput_req_s": interval(good).as_dict()})
            bands[label] = rows
        return bands

    def document(self, result: dict[str, Any]) -> dict[str, Any]:
        """The sweep's result document: `{"sweep", "capacity", "ratio", "bands", "points"}`; the
        points are every draw's, each naming its `workload.seed`."""
        first = self.sweeps[0]
        points = [p for sweep in self.sweeps for p in sweep.document({}, "rates", None)["points"]]
        return {
            "sweep": {
                "mode": "rates", "bounds": self.bounds, "attainment_target": self.target, "tolerance": None,
                "seeds": self.seeds, "rates": result["rates"], "policies": self.labels,
                "native_rate_req_s": first.native, "native_rates_req_s": [s.native for s in self.sweeps],
                "workload": first.base.describe(),
            },
            "capacity": result["capacity"], "ratio": result["ratio"], "bands": result["bands"], "points": points,
        }


def _knee_summary(knees: list[float | None]) -> dict[str, Any]:
    found = [k for k in knees if k is not None]
    whole = len(found) == len(knees)
    return {"knee_req_s": knees, "out_of_range": len(knees) - len(found),
            "knee": interval(found).as_dict() if whole and len(found) > 1 else None}


def _ratio(knees: list[float | None], base: list[float | None], baseline: str) -> dict[str, Any]:
    pairs = [(k, b) for k, b in zip(knees, base) if k is not None and b is not None]
    per_draw = [k / b if k is not None and b is not None else None for k, b in zip(knees, base)]
    result: dict[str, Any] = {"vs": baseline, "per_draw": per_draw, "ratio": None}
    if len(pairs) == len(knees) and len(pairs) > 1:
        logs = interval([math.log(k / b) for k, b in pairs])
        result["ratio"] = {"estimate": math.exp(logs.estimate), "low": math.exp(logs.low), "high": math.exp(logs.high),
                           "level": logs.level, "n": logs.n}
    return result
