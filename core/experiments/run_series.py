"""What a report, a load sweep and the load check keep of one run besides its result document:
its request records and its step log binned over time.

`series_of(engine, doc)` is computed where the run ran (in a worker process under `compare`) and
is small enough to send back: the request records without their per-token times, and the step
log reduced to `bins` time bins. Times are seconds on the engine's clock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any

from ..results.metrics import (
    DECODE_TOKENS,
    DURATION_S,
    NUM_SEQS,
    PREFILL_TOKENS,
    REJECTED,
    RUNNING,
    SWAPPED,
    TIME_S,
    USED_BLOCKS,
    WAITING,
    RequestRecord,
)

BINS = 200
"""Time bins of a run's series (its span cut into this many equal bins)."""


@dataclass
class RunSeries:
    """One run, for plots and checks.

    - `records`: the run's `RequestRecord`s with `token_times` emptied (they are not needed and
      would dominate the size);
    - `start_s`, `bin_s`: the series' bins are `[start_s + k * bin_s, start_s + (k + 1) * bin_s)`;
    - `batch`, `queue`, `kv_use`: per bin, the time-weighted mean of the batch size (sequences
      scheduled per step), of the queue length (waiting + swapped) and of the share of KV blocks
      in use (0..1); time when the engine idles counts as 0;
    - `tenant_service`: per tenant and bin, tokens served per second (prompt tokens computed,
      counted when the prefill ends, plus output tokens at their times);
    - `load`: `load_stats` of the run.
    """

    records: list[RequestRecord]
    start_s: float
    bin_s: float
    batch: list[float]
    queue: list[float]
    kv_use: list[float]
    tenant_service: dict[str, list[float]] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)

    def bin_times(self) -> list[float]:
        """The middle of each bin, in seconds."""
        return [self.start_s + (k + 0.5) * self.bin_s for k in range(len(self.batch))]


def series_of(engine: Any, doc: dict[str, Any], bins: int = BINS) -> RunSeries:
    """The `RunSeries` of a finished run (`engine` after `run_workload`; `doc` its document)."""
    records = engine.metrics.requests
    steps = engine.metrics.steps
    config = engine.config
    start = min((r.arrival_s for r in records), default=0.0)
    end = max([start, *(r.finish_s for r in records if r.finish_s is not None), *(s[TIME_S] for s in steps[-1:])])
    bin_s = (end - start) / bins if end > start else 1.0
    batch, queue, kv = [0.0] * bins, [0.0] * bins, [0.0] * bins
    for s in steps:
        t1 = s[TIME_S]
        t0 = t1 - s[DURATION_S]
        for k in range(_bin(t0, start, bin_s, bins), _bin(t1, start, bin_s, bins) + 1):
            # the part of the step inside bin k
            d = min(t1, start + (k + 1) * bin_s) - max(t0, start + k * bin_s)
            if d > 0:
                batch[k] += s[NUM_SEQS] * d
                queue[k] += (s[WAITING] + s[SWAPPED]) * d
                kv[k] += s[USED_BLOCKS] * d
    service: dict[str, list[float]] = {}
    for r in records:
        if r.finish_reason == REJECTED:
            continue
        row = service.setdefault(r.tenant, [0.0] * bins)
        if r.first_token_s is not None:
            row[_bin(r.first_token_s, start, bin_s, bins)] += r.prompt_tokens - r.cached_prompt_tokens
        tt = r.token_times
        if tt:
            _count(row, tt, start, bin_s, bins)
    return RunSeries(
        records=[r._replace(token_times=()) for r in records],
        start_s=start,
        bin_s=bin_s,
        batch=[x / bin_s for x in batch],
        queue=[x / bin_s for x in queue],
        kv_use=[x / bin_s / config.num_blocks for x in kv],
        tenant_service={t: [x / bin_s for x in row] for t, row in sorted(service.items())},
        load=load_stats(records, steps, config, doc),
    )


def _bin(t: float, start: float, bin_s: float, bins: int) -> int:
    return min(max(int((t - start) / bin_s), 0), bins - 1)


def _count(row: list[float], times: tuple[float, ...], start: float, bin_s: float, bins: int) -> None:
    """Add to `row` how many of the sorted `times` fall in each bin (a bisection per bin crossed,
    not a division per token)."""
    first, last = _bin(times[0], start, bin_s, bins), _bin(times[-1], start, bin_s, bins)
    lo = 0
    for k in range(first, last):
        hi = bisect_left(times, start + (k + 1) * bin_s, lo)
        row[k] += hi - lo
        lo = hi
    row[last] += len(times) - lo


def load_stats(records: list[RequestRecord], steps: list[tuple], config: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """How loaded the engine was while requests arrived (from the first arrival to the last; the
    whole run when they all arrive at once), each a time-weighted mean over that span:

    - `slot_use`: running sequences / `max_num_seqs`; `kv_use`: blocks in use / `num_blocks`;
      `token_use`: tokens scheduled per step / `max_num_batched_tokens`;
    - `utilisation`: the largest of the three (the resource that binds first);
    - `queued_share`: the share of the span during which some request waited (waiting or swapped);
    - `offered_rate_req_s`: requests / span (arrivals per second);
    - `served_rate_req_s`: requests that finished within the span / span;
    - `service_s`: the mean time a completed request spent from its first scheduling to its end
      (E2E minus queueing; None when nothing completed);
    - `drain_s`, `drained_rate_req_s`, `drain_queued_share`: after the last arrival, the stretch
      while the backlog drained (from the last arrival to the last completion minus `service_s`:
      the final batch winding down is left out), the rate requests completed at in it and the
      share of it during which some request waited. A backlog that keeps requests waiting there
      keeps the engine serving as fast as it can, so that rate is its capacity.
    """
    arrivals = sorted(r.arrival_s for r in records)
    if not arrivals:
        return {}
    lo, hi = arrivals[0], arrivals[-1]
    if hi <= lo:  # all at once: the whole run
        hi = max([lo, *(s[TIME_S] for s in steps[-1:])])
    span = hi - lo
    slots = kv = tokens = queued = 0.0
    for s in steps:
        t, d = s[TIME_S], s[DURATION_S]
        overlap = min(t, hi) - max(t - d, lo)
        if overlap <= 0:
            continue
        slots += s[RUNNING] * overlap
        kv += s[USED_BLOCKS] * overlap
        tokens += (s[PREFILL_TOKENS] + s[DECODE_TOKENS]) * overlap
        if s[WAITING] + s[SWAPPED]:
            queued += overlap
    if span <= 0:
        return {"span_s": 0.0}
    uses = {
        "slot_use": slots / (span * config.max_num_seqs),
        "kv_use": kv / (span * config.num_blocks),
        "token_use": tokens / (span * config.max_num_batched_tokens),
    }
    done = sorted(r.finish_s for r in records if r.finish_s is not None and r.finish_reason != REJECTED)
    served = bisect_right(done, hi)
    service = _mean_service(doc)
    drain = _drain(done, steps, hi, service)
    return {
        "span_s": span,
        **uses,
        "utilisation": max(uses.values()),
        "binding": max(uses, key=uses.get),
        "queued_share": queued / span,
        "offered_rate_req_s": (len(arrivals) - 1) / span if arrivals[-1] > arrivals[0] else len(arrivals) / span,
        "served_rate_req_s": served / span,
        "service_s": service,
        **drain,
        "rate_scale": (doc.get("workload") or {}).get("rate_scale", 1.0),
    }


def _drain(done: list[float], steps: list[tuple], hi: float, service: float | None) -> dict[str, Any]:
    """`drain_s`, `drained_rate_req_s` and `drain_queued_share` (see `load_stats`) from the sorted
    completion times `done`, the step log and the last arrival `hi`."""
    end = done[-1] - service if done and service is not None else hi
    if end <= hi:
        return {"drain_s": 0.0, "drained_rate_req_s": None, "drain_queued_share": 0.0}
    queued = 0.0
    for s in steps:
        t, d = s[TIME_S], s[DURATION_S]
        overlap = min(t, end) - max(t - d, hi)
        if overlap > 0 and s[WAITING] + s[SWAPPED]:
            queued += overlap
    span = end - hi
    drained = bisect_right(done, end) - bisect_right(done, hi)
    return {"drain_s": span, "drained_rate_req_s": drained / span, "drain_queued_share": queued / span}


def _mean_service(doc: dict[str, Any]) -> float | None:
    summary = doc.get("summary") or {}
    e2e, queue = (summary.get("e2e_s") or {}).get("mean"), (summary.get("queue_s") or {}).get("mean")
    return e2e - queue if e2e is not None and queue is not None else None
