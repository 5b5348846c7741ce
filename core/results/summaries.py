"""The summary of a run: latency distributions, throughputs, cache and batch figures, over all
requests (`summarize`) or per tenant / priority class, computed once from the request records and
the step log of a `MetricsCollector`."""

from __future__ import annotations

import math
from operator import sub
from typing import Any, Iterable

from .collector import (
    COMPLETED_REASONS,
    DECODE_TOKENS,
    DECODING,
    NUM_SEQS,
    PREFILL_TOKENS,
    REJECTED,
    RUNNING,
    TIME_S,
    RequestRecord,
)

PERCENTILES = (50, 90, 95, 99)
"""The percentiles of a distribution (`p50` ...), besides its mean and max."""

LATENCY_FIELDS = ("mean", "p50", "p90", "p95", "p99", "max")
"""Keys of every latency distribution in a summary, in display order."""

SUMMARY_KEYS = (
    "requests", "completed", "rejected", "steps", "duration_s", "wall_s", "output_tokens",
    "output_throughput_tok_s", "request_throughput_req_s", "ttft_s", "tpot_s", "itl_s", "e2e_s",
    "queue_s", "preemptions", "recomputed_tokens", "recompute_tax", "prefix_hit_rate", "kv_peak_blocks",
    "mean_batch_size", "slot_utilization", "prefill_token_share", "zero_decode_steps",
)
"""Keys of a summary dict, in display order."""

STEP_LEVEL_KEYS = (
    "steps", "mean_batch_size", "slot_utilization", "prefill_token_share", "zero_decode_steps",
    "kv_peak_blocks",
)
"""Summary keys computed from the step log (or given), which a per-tenant summary cannot split."""


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q`-th percentile (0..100) of a non-empty list, interpolated linearly
    (`numpy.percentile`'s default `method="linear"`: the value at rank `(n - 1) * q / 100`,
    interpolated between its two neighbours)."""
    import numpy as np  # here, not at the top: `metroline --help` does not load numpy

    if len(sorted_values) == 0:
        raise ValueError("percentile of an empty population")
    return float(np.percentile(sorted_values, q))


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """`{"mean", "p50", "p90", "p95", "p99", "max"}` of `values`; all None when there are none."""
    import numpy as np

    xs = np.fromiter(values, dtype=float)
    if not xs.size:
        return dict.fromkeys(LATENCY_FIELDS)
    xs.sort()
    p50, p90, p95, p99 = np.percentile(xs, PERCENTILES).tolist()
    return {"mean": math.fsum(xs.tolist()) / xs.size, "p50": p50, "p90": p90, "p95": p95, "p99": p99,
            "max": float(xs[-1])}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _record_stats(records: list[RequestRecord], steps: list[tuple], wall_s: float) -> dict[str, Any]:
    completed = [r for r in records if r.finish_reason in COMPLETED_REASONS]
    admitted = [r for r in records if r.finish_reason != REJECTED]

    ttft, tpot, itl, e2e, queue = [], [], [], [], []
    for r in completed:
        if r.first_token_s is not None:
            ttft.append(r.first_token_s - r.arrival_s)
            if r.output_tokens >= 2 and r.finish_s is not None:
                tpot.append((r.finish_s - r.first_token_s) / (r.output_tokens - 1))
        if r.finish_s is not None:
            e2e.append(r.finish_s - r.arrival_s)
        if r.first_scheduled_s is not None:
            queue.append(r.first_scheduled_s - r.arrival_s)
        tt = r.token_times
        if len(tt) > 1:
            itl.extend(map(sub, tt[1:], tt))

    duration = 0.0
    if records:
        start = min(r.arrival_s for r in records)
        finishes = [r.finish_s for r in records if r.finish_s is not None]
        if finishes:
            end = max(finishes)
        elif steps:
            end = steps[-1][TIME_S]
        else:
            end = start
        duration = max(0.0, end - start)

    output_tokens = sum(r.output_tokens for r in admitted)
    prompt_tokens = sum(r.prompt_tokens for r in admitted)
    return {
        "requests": len(records),
        "completed": len(completed),
        "rejected": len(records) - len(admitted),
        "duration_s": duration,
        "wall_s": wall_s,
        "output_tokens": output_tokens,
        "output_throughput_tok_s": output_tokens / duration if duration > 0 else 0.0,
        "request_throughput_req_s": len(completed) / duration if duration > 0 else 0.0,
        "ttft_s": distribution(ttft),
        "tpot_s": distribution(tpot),
        "itl_s": distribution(itl),
        "e2e_s": distribution(e2e),
        "queue_s": distribution(queue),
        "preemptions": sum(r.preemptions for r in records),
        "recomputed_tokens": sum(r.recomputed_tokens for r in records),
        "prefix_hit_rate": _ratio(sum(r.cached_prompt_tokens for r in admitted), prompt_tokens),
    }


def _step_stats(steps: list[tuple], max_num_seqs: int, kv_peak_blocks: int) -> dict[str, Any]:
    n = len(steps)
    prefill = sum(s[PREFILL_TOKENS] for s in steps)
    decode = sum(s[DECODE_TOKENS] for s in steps)
    return {
        "steps": n,
        "kv_peak_blocks": kv_peak_blocks,
        "mean_batch_size": _ratio(sum(s[NUM_SEQS] for s in steps), n),
        "slot_utilization": _ratio(sum(s[RUNNING] for s in steps), n * max_num_seqs),
        "prefill_token_share": _ratio(prefill, prefill + decode),
        "zero_decode_steps": sum(1 for s in steps if s[DECODING] > 0 and s[DECODE_TOKENS] == 0),
        "computed_tokens": prefill + decode,  # not a summary key: the recompute tax's denominator
    }


def _finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, ±inf) replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def recompute_tax(recomputed_tokens: int, computed_tokens: int) -> float | None:
    """The recompute tax (vLLM RFC #54644): the share of the tokens the steps computed
    (prefill and decode tokens scheduled, over the whole step log) that computed again what a
    recompute preemption had thrown away (`recomputed_tokens`: a readmitted request's lost tokens
    less its prefix-cache hit). None when no token was computed."""
    return _ratio(recomputed_tokens, computed_tokens)


def _assemble(record_stats: dict[str, Any], step_stats: dict[str, Any]) -> dict[str, Any]:
    merged = {**record_stats, **step_stats}
    merged["recompute_tax"] = recompute_tax(record_stats["recomputed_tokens"], step_stats["computed_tokens"])
    return {k: _finite(merged[k]) for k in SUMMARY_KEYS}


def summarize(
    records: list[RequestRecord], steps: list[tuple], *, max_num_seqs: int, kv_peak_blocks: int, wall_s: float
) -> dict[str, Any]:
    """The summary of one run: a dict with exactly the keys of `SUMMARY_KEYS`.

    - `requests`: all records, rejected included; `completed`: finished by eos, length or stop;
      `rejected`: refused at submission.
    - `ttft_s`, `tpot_s`, `itl_s`, `e2e_s`, `queue_s`: distributions (see `distribution`) in
      seconds over completed requests: time to first token (first token - arrival), time per
      output token after the first ((finish - first token) / (output tokens - 1), for requests
      with at least 2 output tokens), inter-token latency (every gap between consecutive tokens,
      pooled over requests), end to end (finish - arrival), queueing (first scheduled - arrival).
    - `duration_s`: first arrival to last finish over all records (the last step's time when no
      record has finished); `wall_s` as given (the host's wall clock for the run).
    - `output_tokens`: tokens generated by every admitted (non-rejected) sequence, whatever its
      finish reason; `output_throughput_tok_s` = output_tokens / duration_s and
      `request_throughput_req_s` = completed / duration_s (both 0 when the duration is 0).
    - `preemptions`, `recomputed_tokens`: sums over records; `prefix_hit_rate`: prompt tokens served
      from the prefix cache / prompt tokens, over admitted records; `kv_peak_blocks` as given.
    - `recompute_tax`: `recomputed_tokens` / every token the steps computed (prefill + decode
      tokens of the step log; see `recompute_tax`).
    - From the step log: `steps`; `mean_batch_size` (scheduled sequences per step);
      `slot_utilization` (mean of running / max_num_seqs); `prefill_token_share` (prefill tokens /
      all tokens); `zero_decode_steps` (steps where some sequence wanted a decode token and none
      was scheduled: the decode stall).

    A ratio or mean with nothing to divide by is None, never NaN.
    """
    return _assemble(_record_stats(records, steps, wall_s), _step_stats(steps, max_num_seqs, kv_peak_blocks))


def summarize_by_tenant(
    records: list[RequestRecord], steps: list[tuple], *, max_num_seqs: int, kv_peak_blocks: int, wall_s: float
) -> dict[str, dict[str, Any]]:
    """One summary (as `summarize`) per tenant, over that tenant's records, tenants sorted by name.

    The step log is not split by tenant, so the step-level fields (`STEP_LEVEL_KEYS`: steps,
    mean_batch_size, slot_utilization, prefill_token_share, zero_decode_steps, kv_peak_blocks)
    repeat the global value in every tenant's summary. `duration_s` is the tenant's own span (its
    first arrival to its last finish), so throughputs are over the time the tenant was active.
    A tenant's `recompute_tax` is its requests' recomputed tokens over every token the run
    computed (its share of the run's tax: the tenants' taxes add up to the run's).
    """
    return _summarize_groups(records, steps, lambda r: r.tenant, max_num_seqs, kv_peak_blocks, wall_s)


def summarize_all(
    records: list[RequestRecord], steps: list[tuple], *, max_num_seqs: int, kv_peak_blocks: int, wall_s: float
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """`summarize`, `summarize_by_tenant` and `summarize_by_priority` of one run, each group that
    holds every record (a run with one tenant, or one priority class) summarised only once."""
    whole = summarize(records, steps, max_num_seqs=max_num_seqs, kv_peak_blocks=kv_peak_blocks, wall_s=wall_s)
    args = (max_num_seqs, kv_peak_blocks, wall_s, whole)
    tenants = _summarize_groups(records, steps, lambda r: r.tenant, *args)
    priorities = _summarize_groups(records, steps, lambda r: r.priority, *args)
    return whole, tenants, {str(p): summary for p, summary in priorities.items()}


def summarize_by_priority(
    records: list[RequestRecord], steps: list[tuple], *, max_num_seqs: int, kv_peak_blocks: int, wall_s: float
) -> dict[str, dict[str, Any]]:
    """One summary per priority class (keys are the priorities as strings, most urgent first), as
    `summarize_by_tenant` does per tenant."""
    groups = _summarize_groups(records, steps, lambda r: r.priority, max_num_seqs, kv_peak_blocks, wall_s)
    return {str(p): summary for p, summary in groups.items()}


def _summarize_groups(
    records: list[RequestRecord], steps: list[tuple], key: Any, max_num_seqs: int, kv_peak_blocks: int,
    wall_s: float, whole: dict[str, Any] | None = None,
) -> dict[Any, dict[str, Any]]:
    groups: dict[Any, list[RequestRecord]] = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    if whole is not None and len(groups) == 1:  # the one group is every record, in order
        return {g: whole for g in groups}
    step_stats = _step_stats(steps, max_num_seqs, kv_peak_blocks)
    return {g: _assemble(_record_stats(groups[g], steps, wall_s), step_stats) for g in sorted(groups)}


TENANT_RUNNING_KEYS = ("running_mean", "running_max")
"""Keys a result document's per-tenant summaries have besides `SUMMARY_KEYS` (see
`running_by_tenant`)."""


def running_by_tenant(
    counts: list[dict[str, int]], tenants: Iterable[str]
) -> dict[str, dict[str, float | int | None]]:
    """Per tenant, `{"running_mean", "running_max"}`: how many of its sequences were running at
    once, the mean over every recorded step (a step where it had none counts as 0) and the max.

    `counts` is `MetricsCollector.running_by_tenant` (one dict per step); both figures are None
    when no step was recorded."""
    n = len(counts)
    out: dict[str, dict[str, float | int | None]] = {}
    for t in tenants:
        per_step = [c.get(t, 0) for c in counts]
        out[t] = {"running_mean": sum(per_step) / n if n else None, "running_max": max(per_step, default=None)}
    return out
