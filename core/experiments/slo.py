"""Service-level objectives: which requests met them, SLO attainment and goodput.

An SLO is a bound in seconds on one latency of a request: `ttft` (arrival to first token),
`tpot` (time per output token after the first: (finish - first token) / (output tokens - 1)) and
`e2e` (arrival to finish), each defined as in the run's summary (`metroline.core.results.metrics`). A request
meets the SLOs when it completed and is within every bound given; a request with one output token
has no TPOT and meets a TPOT bound; a rejected or unfinished request meets none.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from ..results.metrics import COMPLETED_REASONS, RequestRecord

SLO_METRICS = ("ttft", "tpot", "e2e")
"""The latencies an SLO can bound."""

ATTAINMENT_TARGET = 0.9
"""The share of requests that must meet the SLOs for a load to count as served at SLO."""


def positive_number(text: str, where: str, unit: str) -> float:
    """`text` as a finite number > 0; else `ValueError` starting with `where`."""
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text.strip()!r} is not a number of {unit}") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{where}: must be a number of {unit} > 0")
    return x


def parse_slo(text: str, flag: str = "--slo") -> dict[str, float]:
    """`"ttft=0.5,tpot=0.05"` -> `{"ttft": 0.5, "tpot": 0.05}` (seconds, each > 0); a bad item
    raises `ValueError` naming `flag`."""
    bounds: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_METRICS:
            raise ValueError(f"{flag}: {item!r}: expected METRIC=SECONDS with METRIC one of {', '.join(SLO_METRICS)}")
        bound = positive_number(value, f"{flag}: {item!r}", "seconds")
        if key in bounds:
            raise ValueError(f"{flag}: {key} is given twice")
        bounds[key] = bound
    if not bounds:
        raise ValueError(f"{flag}: give at least one bound, e.g. ttft=0.5,tpot=0.05")
    return bounds


def latencies(r: RequestRecord) -> dict[str, float | None]:
    """The request's TTFT, TPOT and E2E in seconds (None for what it does not have)."""
    ttft = r.first_token_s - r.arrival_s if r.first_token_s is not None else None
    e2e = r.finish_s - r.arrival_s if r.finish_s is not None else None
    tpot = None
    if r.first_token_s is not None and r.finish_s is not None and r.output_tokens >= 2:
        tpot = (r.finish_s - r.first_token_s) / (r.output_tokens - 1)
    return {"ttft": ttft, "tpot": tpot, "e2e": e2e}


def meets(r: RequestRecord, bounds: dict[str, float]) -> bool:
    """Whether request `r` completed within every bound of `bounds`."""
    if r.finish_reason not in COMPLETED_REASONS:
        return False
    lat = latencies(r)
    for key, bound in bounds.items():
        value = lat[key]
        if value is None:
            if key == "tpot" and lat["ttft"] is not None:
                continue  # one output token: no time per output token to bound
            return False
        if value > bound:
            return False
    return True


def evaluate(records: Iterable[RequestRecord], bounds: dict[str, float], duration_s: float) -> dict[str, Any]:
    """SLO figures of one run: `{"bounds", "requests", "met", "attainment", "goodput_req_s",
    "met_by_metric"}`. `attainment` = met / requests (every request counts, rejected ones too);
    `goodput_req_s` = met / `duration_s` (the run's duration, first arrival to last finish: the
    summary's request throughput, counting only the requests within every SLO);
    `met_by_metric`: for each bound alone, the share of requests within it."""
    records = list(records)
    n = len(records)
    met = sum(1 for r in records if meets(r, bounds))
    by_metric = {k: (sum(1 for r in records if meets(r, {k: b})) / n if n else None) for k, b in bounds.items()}
    return {
        "bounds": dict(bounds),
        "requests": n,
        "met": met,
        "attainment": met / n if n else None,
        "goodput_req_s": met / duration_s if duration_s > 0 else None,
        "met_by_metric": by_metric,
    }
