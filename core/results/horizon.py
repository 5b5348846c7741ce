"""The measurement window of a run: a warm-up left out at the start, a horizon where measuring stops.

A run measured to its end favours whatever finishes: a policy that starves some requests until the
load stops looks only as bad as their final latencies, and on a trace longer than one can simulate
the run has to stop somewhere. `MeasurementWindow(warmup_s, horizon_s)` measures the run as it was
seen at `horizon_s` seconds, over the requests that arrived in [warmup_s, horizon_s):

- the replay stops at the horizon (nothing after it is simulated); a request that arrived before
  it and had not finished by it is *unfinished*: it is counted (`unfinished` in the summary), and
  its latencies are censored at the horizon, i.e. it enters the TTFT, queueing and end-to-end
  distributions with the time it had waited so far (horizon - arrival, or its first token or first
  schedule when that came before the horizon). These are lower bounds of its true latencies, so a
  policy that leaves requests unfinished cannot look faster for it (no survivor bias);
- requests that arrived during the warm-up are left out of the request figures (the engine was
  filling up), but the tokens they got inside the window count in its throughput: throughput is the
  output tokens produced in [warmup_s, horizon_s) over the window's length;
- the step figures (batch size, utilisation...) are over the steps that ended inside the window.

Without a horizon the window ends at the run's last finish; without either the summary is the
ordinary one (`metrics.summarize`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any

from .metrics import COMPLETED_REASONS, REJECTED, TIME_S, MetricsCollector, RequestRecord, distribution, summarize

UNFINISHED = "unfinished"
"""The finish reason of a request still in the engine at the horizon."""


@dataclass(frozen=True)
class MeasurementWindow:
    """Measure requests that arrive in [`warmup_s`, `horizon_s`), as seen at `horizon_s` (None: the
    run's end); see the module docstring."""

    warmup_s: float = 0.0
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.warmup_s, (int, float)) and math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"--warmup: must be a number of seconds >= 0, got {self.warmup_s!r}")
        h = self.horizon_s
        if h is not None and not (isinstance(h, (int, float)) and math.isfinite(h) and h > self.warmup_s):
            raise ValueError(f"--horizon: must be a number of seconds > the warm-up ({self.warmup_s:g}), got {h!r}")

    @property
    def active(self) -> bool:
        """Whether the window changes anything (a warm-up or a horizon)."""
        return self.warmup_s > 0 or self.horizon_s is not None

    @property
    def stop_s(self) -> float:
        """When a replay stops: the horizon, or never (infinity)."""
        return math.inf if self.horizon_s is None else float(self.horizon_s)

    def describe(self) -> dict[str, float | None]:
        """The window as the result document records it (`"measurement"`)."""
        return {"warmup_s": float(self.warmup_s), "horizon_s": self.horizon_s}


def unfinished_records(engine: Any, arrivals: list[float]) -> list[RequestRecord]:
    """Records (finish reason `UNFINISHED`, no finish time) of the sequences still in `engine`
    after a replay that submitted request `str(i)` at `arrivals[i]` and stopped early."""
    collector = MetricsCollector(engine.config.max_num_seqs)
    for i in range(len(arrivals)):
        try:
            seqs = engine.sequences(str(i))
        except KeyError:  # finished and forgotten, or rejected
            continue
        for seq in seqs:
            if not seq.is_finished:
                collector.record_finished(seq)
    return [r._replace(finish_reason=UNFINISHED) for r in collector.requests]


def as_seen_at(record: RequestRecord, end_s: float) -> RequestRecord:
    """`record` as it stood at time `end_s`: what had not happened yet is None (and a request not
    finished by then is `UNFINISHED`, with the tokens it had)."""
    if record.finish_s is not None and record.finish_s <= end_s or record.finish_reason == REJECTED:
        return record

    def by_then(t: float | None) -> float | None:
        return t if t is not None and t <= end_s else None

    tokens = record.token_times[: bisect_right(record.token_times, end_s)]
    return record._replace(
        first_scheduled_s=by_then(record.first_scheduled_s), prefill_done_s=by_then(record.prefill_done_s),
        first_token_s=by_then(record.first_token_s), finish_s=None, output_tokens=len(tokens),
        finish_reason=UNFINISHED, token_times=tokens,
    )


def _censored(records: list[RequestRecord], end_s: float) -> dict[str, dict[str, float | None]]:
    """TTFT, queueing and end-to-end distributions of completed and unfinished `records`, an
    unfinished one's unknown times taken as `end_s` (lower bounds of its latencies)."""
    ttft, queue, e2e = [], [], []
    for r in records:
        done = r.finish_reason in COMPLETED_REASONS
        if not done and r.finish_reason != UNFINISHED:
            continue
        ttft.append((r.first_token_s if r.first_token_s is not None else end_s) - r.arrival_s)
        queue.append((r.first_scheduled_s if r.first_scheduled_s is not None else end_s) - r.arrival_s)
        e2e.append((r.finish_s if done else end_s) - r.arrival_s)
    return {"ttft_s": distribution(ttft), "queue_s": distribution(queue), "e2e_s": distribution(e2e)}


def window_summary(
    records: list[RequestRecord], steps: list[tuple], window: MeasurementWindow, *, max_num_seqs: int,
    kv_peak_blocks: int, wall_s: float,
) -> dict[str, Any]:
    """The summary (`metrics.summarize`'s keys, plus `unfinished`) of the requests that arrived in
    the window, as seen at its end; `records` hold every request of the run, the unfinished ones
    included (`unfinished_records`). See the module docstring for what changes."""
    if window.horizon_s is not None:
        end = float(window.horizon_s)
    else:
        finishes = [r.finish_s for r in records if r.finish_s is not None]
        end = max(finishes) if finishes else (steps[-1][TIME_S] if steps else window.warmup_s)
    start = window.warmup_s
    seen = [as_seen_at(r, end) for r in records]
    measured = [r for r in seen if start <= r.arrival_s < end]
    times = [s[TIME_S] for s in steps]
    in_window = steps[bisect_right(times, start): bisect_right(times, end)]
    summary = summarize(measured, in_window, max_num_seqs=max_num_seqs, kv_peak_blocks=kv_peak_blocks, wall_s=wall_s)
    span = max(0.0, end - start)
    tokens = sum(bisect_left(r.token_times, end) - bisect_left(r.token_times, start) for r in seen)
    completed = summary["completed"]
    summary.update(_censored(measured, end))
    summary.update(
        duration_s=span, output_tokens=tokens,
        output_throughput_tok_s=tokens / span if span > 0 else 0.0,
        request_throughput_req_s=completed / span if span > 0 else 0.0,
    )
    summary["unfinished"] = sum(1 for r in measured if r.finish_reason == UNFINISHED)
    return summary


def measured_summaries(doc: dict[str, Any], engine: Any, arrivals: list[float], window: MeasurementWindow,
                       wall_s: float) -> None:
    """Replace the summaries of the result document `doc` (whole run, per tenant, per priority)
    of a replay of requests arriving at `arrivals` on `engine` by those of `window`, and record
    the window in `doc["measurement"]`."""
    stop = window.stop_s
    live = unfinished_records(engine, [t for t in arrivals if t < stop])
    records = [*engine.metrics.requests, *live]
    steps = engine.metrics.steps
    kw = dict(max_num_seqs=engine.config.max_num_seqs, kv_peak_blocks=engine.pool.peak_used_blocks, wall_s=wall_s)
    doc["summary"] = window_summary(records, steps, window, **kw)
    for group, key in (("tenants", lambda r: r.tenant), ("priorities", lambda r: str(r.priority))):
        names = sorted({key(r) for r in records}, key=(str if group == "tenants" else int))
        doc[group] = {n: window_summary([r for r in records if key(r) == n], steps, window, **kw) for n in names}
    doc["measurement"] = window.describe()
