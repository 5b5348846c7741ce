"""Is the load one at which policies can differ? A check of a run's load, with the `--rate-scale`
that would put it near capacity.

Policies differ in whom they serve first, so they differ only when requests wait: at a load where
nobody queues every policy gives the same figures (the Azure conversation trace at its native rate
fills 5% of the batch slots). Far above capacity the queue grows for as long as requests arrive
and the latencies measure mostly how long the run was.

From a run's `load_stats` (`metroline.core.experiments.run_series`: time-weighted use of the slots, KV blocks and
token budget while requests arrive, and the share of that time someone waited) the check
estimates the capacity C in requests per second:

- when requests rarely wait (`queued_share` < `SATURATED_QUEUED_SHARE`), resource use grows with
  the rate, so C = offered rate / utilisation of the resource that binds first (exact for the
  `steps` cost model, an estimate where a step's time grows with the batch);
- otherwise the engine is saturated and serves as fast as it can: C = the rate at which requests
  finished while they arrived.

A run whose arrivals span less than `STEADY_SPANS` mean service times (first scheduling to end)
never reaches a steady state while they arrive (the batch is still filling when the last request
arrives). If its backlog then kept requests waiting (`SATURATED_QUEUED_SHARE` of the time) for
`STEADY_SPANS` service times after the last arrival, the engine served as fast as it can all that
while: C = the rate requests completed at then (an overloaded run: a burst of requests arriving
far faster than the engine serves them). Else its load is *short* and no capacity is estimated
from it. Otherwise the load is *light* when requests waited less than `LIGHT_QUEUED_SHARE` of the
time at an offered rate below `LIGHT_LOAD` x C (near capacity, requests that arrive regularly may not queue either,
and a higher rate would not help), *heavy* when the offered rate is above `HEAVY_LOAD` x C, else
fine. The suggestion is the `--rate-scale` that
offers `TARGET_LOAD` x C.
"""

from __future__ import annotations

from typing import Any

LIGHT_QUEUED_SHARE = 0.05
"""Below this share of the time with a request waiting, the load is too light for policies to differ."""
SATURATED_QUEUED_SHARE = 0.5
"""From this share of the time with a request waiting, the engine counts as saturated."""
STEADY_SPANS = 3.0
"""A run's arrivals must span this many mean service times for its load to be judged."""
LIGHT_LOAD = 0.8
"""A load below this multiple of the capacity where nobody waits is too light."""
HEAVY_LOAD = 1.5
"""Above this multiple of the capacity, the load is too heavy (the queue grows without bound)."""
TARGET_LOAD = 0.95
"""The multiple of the capacity a suggested `--rate-scale` offers."""
SPECULATION_TOKEN_USE = 0.8
"""From this use of the token budget, drafts that bind it are taking prompts' tokens (see
`speculation_message`)."""


def estimate(stats: dict[str, Any]) -> dict[str, Any] | None:
    """`{"kind": "light" | "heavy" | "fine", "load", "capacity_req_s", "suggested_rate_scale", ...}`
    for one run's `load_stats`; `{"kind": "short", ...}` for a run too short to judge; None when it
    has no span to measure (a single request)."""
    if not stats or not stats.get("span_s"):
        return None
    service = stats.get("service_s")
    offered, use, queued = stats["offered_rate_req_s"], stats["utilisation"], stats["queued_share"]
    if service is not None and stats["span_s"] < STEADY_SPANS * service:
        if not (stats.get("drain_s", 0.0) >= STEADY_SPANS * service and stats.get("drained_rate_req_s")
                and stats.get("drain_queued_share", 0.0) >= SATURATED_QUEUED_SHARE):
            return {"kind": "short", "span_s": stats["span_s"], "service_s": service}
        capacity = stats["drained_rate_req_s"]
    elif queued >= SATURATED_QUEUED_SHARE or use <= 0:
        capacity = stats["served_rate_req_s"]
    else:
        capacity = offered / use
    if not capacity > 0:
        return None
    load = offered / capacity
    kind = "light" if queued < LIGHT_QUEUED_SHARE and load < LIGHT_LOAD else "heavy" if load > HEAVY_LOAD else "fine"
    return {
        "kind": kind,
        "load": load,
        "capacity_req_s": capacity,
        "offered_rate_req_s": offered,
        "utilisation": use,
        "binding": stats["binding"],
        "queued_share": queued,
        "suggested_rate_scale": _round(stats["rate_scale"] * TARGET_LOAD / load),
    }


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def check(runs: list[dict[str, Any]], labels: list[str]) -> dict[str, Any] | None:
    """The check over several policies' runs of one workload (their `load_stats`): the load is
    light (heavy) only when it is for every policy (one policy's queue is enough for them to
    differ); the capacity and suggestion are those of the median policy. None when no run can be
    measured."""
    found = [(label, e) for label, e in ((lb, estimate(s)) for lb, s in zip(labels, runs)) if e is not None]
    if not found:
        return None
    short = [e for _, e in found if e["kind"] == "short"]
    if short:
        return {"kind": "short", "runs": dict(found), "message": (
            f"note: the load cannot be judged: requests arrive over {short[0]['span_s']:.3g} s, under "
            f"{STEADY_SPANS:g} x their mean service time of {short[0]['service_s']:.3g} s (the batch is still "
            "filling when the last one arrives); use more requests")}
    kinds = {e["kind"] for _, e in found}
    kind = kinds.pop() if len(kinds) == 1 else "fine"
    median = sorted(found, key=lambda item: item[1]["capacity_req_s"])[len(found) // 2][1]
    return {
        "kind": kind,
        "capacity_req_s": median["capacity_req_s"],
        "load": median["load"],
        "suggested_rate_scale": median["suggested_rate_scale"],
        "runs": {label: e for label, e in found},
        "message": message(kind, median),
    }


def message(kind: str, e: dict[str, Any]) -> str | None:
    """The warning for a light or heavy load (None for a fine one)."""
    where = (f"offered {e['offered_rate_req_s']:.4g} req/s is about {e['load']:.2g} x the estimated capacity of "
             f"{e['capacity_req_s']:.4g} req/s ({e['binding'].replace('_use', '')} use {e['utilisation']:.0%}, "
             f"a request waiting {e['queued_share']:.0%} of the time)")
    if kind == "light":
        return (f"warning: load too light for the policies to differ: {where}; "
                f"--rate-scale {e['suggested_rate_scale']:g} would put it near capacity")
    if kind == "heavy":
        return (f"warning: load too heavy: the queue grows as long as requests arrive, so latencies mostly "
                f"measure the run's length: {where}; --rate-scale {e['suggested_rate_scale']:g} would put it "
                "near capacity")
    return None


def speculation_message(stats: dict[str, Any], summary: dict[str, Any], label: str = "", adaptive: bool = False) -> str | None:
    """The warning for a run with speculative decoding at a load where its drafts cost TTFT (None
    otherwise): drafts share `max_num_batched_tokens` with prefills, so once the token budget is
    the resource that binds first (`stats["binding"]`), nearly full (`SPECULATION_TOKEN_USE`),
    while requests wait (`queued_share` at least `LIGHT_QUEUED_SHARE`), every draft token
    scheduled is a prompt token that waits: TTFT and the
    queue grow (on `chat-steady`, n-gram k = 4: mean TTFT 146 ms to 1,760 ms). `summary` is the
    run's (its acceptance and drafts thrown away); `adaptive`: `adaptive_speculation` is loaded."""
    if (not stats or stats.get("binding") != "token_use" or stats["token_use"] < SPECULATION_TOKEN_USE
            or stats.get("queued_share", 0.0) < LIGHT_QUEUED_SHARE):
        return None
    who = f"{label}: " if label else ""
    accepted = summary.get("acceptance_rate")
    drafts = (f"{accepted:.0%} of drafts accepted, {summary.get('draft_tokens_thrown_away', 0):,} draft tokens thrown "
              "away; " if accepted is not None else "")
    advice = ("lower num_speculative_tokens, or compare without --speculative-config" if adaptive else
              "--plugin adaptive_speculation sizes drafts to the budget left after prefills; or compare without "
              "--speculative-config")
    return (f"warning: {who}speculation spends the prefill share at this load: the token budget binds "
            f"({stats['token_use']:.0%} used) while a request waited {stats['queued_share']:.0%} of the time, so "
            f"draft tokens delay prompts and raise TTFT ({drafts}mean TTFT {(summary.get('ttft_s') or {}).get('mean', 0.0) * 1000:.0f} ms); "
            f"{advice}")
