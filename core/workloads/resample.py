"""Resampling a trace: a new draw of a recorded workload for each seed, so runs over several seeds
see different (but alike) workloads, as synthetic workloads redrawn with another seed do.

A trace is one recording; replaying it again gives the same result, so a comparison on it has no
repeat and no interval. Two methods draw new workloads from it (`RESAMPLE_METHODS`):

- `redraw` (the default): as many requests as the trace holds. Each request is a row of the
  trace drawn with replacement, its prompt and output lengths (and tenant, priority and prompt
  segments) kept together, so the joint distribution of lengths is the trace's. Arrivals start at
  0 and their gaps are the trace's own inter-arrival gaps drawn with replacement: the same mean
  rate (in expectation) and the same distribution of gaps, so a bursty trace stays as bursty gap
  by gap (what is lost is the order of the gaps: slow drifts of the rate over the trace). A row
  drawn twice would share its whole prompt with itself; the last segment of each drawn request's
  prompt gets a key of its own, so only the prefixes the trace shares (Mooncake's block ids) are
  shared.
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

RESAMPLE_METHODS = ("redraw", "window")
"""The ways `resample` draws a new workload from a trace (see the module docstring)."""


def parse_method(text: str) -> tuple[str, float | None]:
    """`(method, window_s)` of a `--resample` value: "redraw", or "window:SECONDS"."""
    method, sep, seconds = text.partition(":")
    if method == "redraw" and not sep:
        return method, None
    if method == "window" and sep:
        try:
            window_s = float(seconds)
        except ValueError:
            window_s = math.nan
        if math.isfinite(window_s) and window_s > 0:
            return method, window_s
    raise WorkloadError(f"resample: {text!r}: expected 'redraw' or 'window:SECONDS' (seconds > 0)")


def resample(items: list[WorkloadItem], seed: int, method: str = "redraw", window_s: float | None = None) -> list[WorkloadItem]:
    """A draw of the trace `items` (sorted by arrival) for `seed` by `method` ("redraw", or
    "window" with `window_s`). The same arguments always give the same draw."""
    if not items:
        raise WorkloadError("resample: the trace has no requests")
    if method == "redraw":
        if window_s is not None:
            raise WorkloadError("resample: window_s applies to the 'window' method only")
        return redraw(items, seed)
    if method == "window":
        if window_s is None:
            raise WorkloadError("resample: the 'window' method needs window_s (seconds)")
        return random_window(items, seed, window_s)
    raise WorkloadError(f"resample: unknown method {method!r} (valid: {', '.join(RESAMPLE_METHODS)})")


def redraw(items: list[WorkloadItem], seed: int) -> list[WorkloadItem]:
    """The `redraw` method: rows drawn with replacement, arrival gaps drawn with replacement from
    the trace's gaps (see the module docstring)."""
    n = len(items)
    rng = random.Random(f"resample/redraw/{seed}")
    rows = rng.choices(items, k=n)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(items, items[1:])]
    arrivals = [0.0, *accumulate(rng.choices(gaps, k=n - 1))] if gaps else [0.0]
    drawn = []
    for i, (row, t) in enumerate(zip(rows, arrivals)):
        (key, length), head = row.segments[-1], row.segments[:-1]
        segments = (*head, ((key, "draw", seed, i), length))
        drawn.append(WorkloadItem(t, segments, row.output_len, row.tenant, row.priority))
    return drawn


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
