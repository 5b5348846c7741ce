"""Resampling a trace: a new draw of a recorded workload for each seed, so runs over several seeds
see different (but alike) workloads, as synthetic workloads redrawn with another seed do.

A trace is one recording; replaying it again gives the same result, so a comparison on it has no
repeat and no interval. Two methods draw new workloads from it (`RESAMPLE_METHODS`):

- `redraw` (the default): as many requests as the trace holds. Each request is a row of the
  trace drawn with replacement, its prompt and output lengths (and tenant, priority and prompt
  segments) kept together, so the joint distribution of lengths is the trace's. Arrivals start at
  0 and their gaps are the trace's own inter-arrival gaps drawn with replacement, each capped at
  the trace's `IDLE_QUANTILE` gap: the distribution of gaps is the trace's up to that quantile, so
  a bursty trace stays as bursty gap by gap, but its idle periods (the Azure code trace has gaps
  up to 217 s against a median under a second) are not imported wholesale. Uncapped, a draw that
  picks a few of them has a much lower mean rate; scaled to a target rate (`sweep`, `--rate-scale`)
  its other gaps shrink by as much, and the draw becomes one long burst: the capacity at SLO of one
  policy on five draws of 400 requests spread 8.5 x. What is lost is the order of the gaps (slow
  drifts of the rate over the trace) and the idle tail beyond the cap. A row drawn twice would
  share its whole prompt with itself; the last segment of each drawn request's prompt gets a key
  of its own, so only the prefixes the trace shares (Mooncake's block ids) are shared.
- `gamma:B`: rows drawn as by `redraw`, arrivals a gamma process at the trace's mean rate with
  shape B: B = 1 is Poisson, B < 1 burstier, B > 1 more regular (vLLM's `benchmark_serving
  --burstiness`): the trace's lengths under a chosen burstiness instead of its own.
- `window`: a window of `window_s` seconds of the trace at a uniformly random start, its
  requests as recorded, arrivals shifted to start at 0. Everything the trace has is kept inside
  the window (its order of gaps included); windows of different seeds overlap when the trace is
  not much longer than the window.

Everything is a function of (trace, seed, method): the draw uses its own `random.Random` keyed by
the seed, independent of the process.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from itertools import accumulate

from .items import WorkloadError, WorkloadItem

RESAMPLE_METHODS = ("redraw", "window", "gamma")
"""The ways `resample` draws a new workload from a trace (see the module docstring)."""
IDLE_QUANTILE = 0.99
"""`redraw` caps every drawn gap at this quantile of the trace's gaps (its idle periods)."""


def parse_method(text: str) -> tuple[str, float | None]:
    """`(method, parameter)` of a `--resample` value: "redraw", "window:SECONDS" (the window's
    length) or "gamma:B" (the burstiness, the gamma's shape)."""
    method, sep, number = text.partition(":")
    if method == "redraw" and not sep:
        return method, None
    if method in ("window", "gamma") and sep:
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return method, value
    raise WorkloadError(f"resample: {text!r}: expected 'redraw', 'window:SECONDS' or 'gamma:BURSTINESS' (numbers > 0)")


def resample(items: list[WorkloadItem], seed: int, method: str = "redraw", param: float | None = None) -> list[WorkloadItem]:
    """A draw of the trace `items` (sorted by arrival) for `seed` by `method` ("redraw", "window"
    with `param` its length in seconds, "gamma" with `param` its burstiness). The same arguments
    always give the same draw."""
    if not items:
        raise WorkloadError("resample: the trace has no requests")
    if method == "redraw":
        if param is not None:
            raise WorkloadError("resample: the 'redraw' method takes no parameter")
        return redraw(items, seed)
    if method in ("window", "gamma"):
        if param is None:
            raise WorkloadError(f"resample: the {method!r} method needs its number ({'seconds' if method == 'window' else 'burstiness'})")
        return random_window(items, seed, param) if method == "window" else gamma_arrivals(items, seed, param)
    raise WorkloadError(f"resample: unknown method {method!r} (valid: {', '.join(RESAMPLE_METHODS)})")


def _keyed(rows: list[WorkloadItem], seed: int, arrivals: list[float]) -> list[WorkloadItem]:
    """The drawn `rows` at `arrivals`, the last segment of each prompt keyed anew (see the module docstring)."""
    drawn = []
    for i, (row, t) in enumerate(zip(rows, arrivals)):
        (key, length), head = row.segments[-1], row.segments[:-1]
        segments = (*head, ((key, "draw", seed, i), length))
        drawn.append(WorkloadItem(t, segments, row.output_len, row.tenant, row.priority))
    return drawn


def capped_gaps(items: list[WorkloadItem]) -> list[float]:
    """The trace's inter-arrival gaps, each capped at their `IDLE_QUANTILE` quantile (nearest rank)."""
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(items, items[1:])]
    if not gaps:
        return gaps
    cap = sorted(gaps)[min(len(gaps) - 1, math.ceil(IDLE_QUANTILE * len(gaps)) - 1)]
    return [min(g, cap) for g in gaps]


def redraw(items: list[WorkloadItem], seed: int) -> list[WorkloadItem]:
    """The `redraw` method: rows drawn with replacement, arrival gaps drawn with replacement from
    the trace's gaps capped at their `IDLE_QUANTILE` (see the module docstring)."""
    n = len(items)
    rng = random.Random(f"resample/redraw/{seed}")
    rows = rng.choices(items, k=n)
    gaps = capped_gaps(items)
    arrivals = [0.0, *accumulate(rng.choices(gaps, k=n - 1))] if gaps else [0.0]
    return _keyed(rows, seed, arrivals)


def gamma_arrivals(items: list[WorkloadItem], seed: int, burstiness: float) -> list[WorkloadItem]:
    """The `gamma:B` method: rows drawn with replacement, gaps gamma-distributed with shape
    `burstiness` and the trace's mean gap (its mean rate)."""
    n = len(items)
    span = items[-1].arrival_s - items[0].arrival_s
    if n < 2 or span <= 0:
        raise WorkloadError("resample: gamma: the trace's requests all arrive at once (it has no rate)")
    mean_gap = span / (n - 1)
    rng = random.Random(f"resample/gamma/{burstiness!r}/{seed}")
    arrivals = [0.0, *accumulate(rng.gammavariate(burstiness, mean_gap / burstiness) for _ in range(n - 1))]
    return _keyed(rng.choices(items, k=n), seed, arrivals)


def random_window(items: list[WorkloadItem], seed: int, window_s: float) -> list[WorkloadItem]:
    """The `window` method: the requests arriving in [start, start + window_s) for a start drawn
    uniformly from [first arrival, last arrival - window_s], shifted to start at 0."""
    first, last = items[0].arrival_s, items[-1].arrival_s
    if not window_s > 0:
        raise WorkloadError(f"resample: window_s must be > 0, got {window_s!r}")
    if window_s >= last - first:
        raise WorkloadError(
            f"resample: a window of {window_s:g} s does not fit in the trace's {last - first:g} s "
            "(give a shorter window, or the redraw method)"
        )
    start = random.Random(f"resample/window/{seed}").uniform(first, last - window_s)
    times = [it.arrival_s for it in items]
    lo, hi = bisect_left(times, start), bisect_left(times, start + window_s)
    return [WorkloadItem(it.arrival_s - start, it.segments, it.output_len, it.tenant, it.priority)
            for it in items[lo:hi]]
