"""Metrics: what the engine records while it runs, and the summary it gives afterwards.

Recording is on the hot path: `MetricsCollector.record_step` appends one tuple of ints and floats
per step and `record_finished` one `RequestRecord` per finished sequence. Everything else
(percentiles, throughputs, per-tenant splits, per-window fairness, the JSON result document) is
computed once, at the end, by `summarize`, `summarize_by_tenant`, `fairness` and `result_document`.

Times are seconds on the engine's clock (virtual in the simulator, wall clock on a real model).
"""

from __future__ import annotations

import math
from operator import sub
from bisect import bisect_left, bisect_right
from enum import Enum
from typing import Any, Iterable, NamedTuple

from .plan import StepPlan
from .sequence import FinishReason, Sequence

COMPLETED_REASONS = frozenset({FinishReason.EOS.value, FinishReason.LENGTH.value, FinishReason.STOP.value})
"""Finish reasons that count as a completed request (latencies are measured over these)."""
REJECTED = FinishReason.REJECTED.value

LATENCY_FIELDS = ("mean", "p50", "p90", "p95", "p99", "max")
"""Keys of every latency distribution in a summary, in display order."""

SUMMARY_KEYS = (
    "requests", "completed", "rejected", "steps", "duration_s", "wall_s", "output_tokens",
    "output_throughput_tok_s", "request_throughput_req_s", "ttft_s", "tpot_s", "itl_s", "e2e_s",
    "queue_s", "preemptions", "recomputed_tokens", "prefix_hit_rate", "kv_peak_blocks",
    "mean_batch_size", "slot_utilization", "prefill_token_share", "zero_decode_steps",
)
"""Keys of a summary dict, in display order."""

STEP_LEVEL_KEYS = (
    "steps", "mean_batch_size", "slot_utilization", "prefill_token_share", "zero_decode_steps",
    "kv_peak_blocks",
)
"""Summary keys computed from the step log (or given), which a per-tenant summary cannot split."""


# Layout of one step tuple in `MetricsCollector.steps`.
STEP = 0
TIME_S = 1
DURATION_S = 2
NUM_SEQS = 3
PREFILL_TOKENS = 4
DECODE_TOKENS = 5
PREEMPTIONS = 6
RUNNING = 7
WAITING = 8
SWAPPED = 9
DECODING = 10
FREE_BLOCKS = 11
CACHED_BLOCKS = 12
USED_BLOCKS = 13


class StepRow(NamedTuple):
    """A read-time view of one step tuple: `StepRow(*collector.steps[i])`.

    The collector stores plain tuples in this field order (the index constants `STEP` ...
    `USED_BLOCKS` name the same positions); this type is only for code that reads them.

    - `step`: the plan's step number; `time_s`: the clock after the step ran; `duration_s`: how
      long it took.
    - `num_seqs`, `prefill_tokens`, `decode_tokens`, `preemptions`: from the step plan.
    - `running`, `waiting`, `swapped`: queue lengths; `decoding`: running sequences that wanted a
      decode token when the step began.
    - `free_blocks`, `cached_blocks` (evictable), `used_blocks` (referenced by live sequences).
    """

    step: int
    time_s: float
    duration_s: float
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    preemptions: int
    running: int
    waiting: int
    swapped: int
    decoding: int
    free_blocks: int
    cached_blocks: int
    used_blocks: int


class RequestRecord(NamedTuple):
    """What is kept of one sequence once it has finished (or of a request that was rejected).

    `id` is the sequence id (`"<request>#<i>"` for the children of a parallel-sampling request).
    Timestamps are None for what never happened (a rejected request was never scheduled).
    `token_times` holds the time each output token was produced, in order.
    """

    id: str
    tenant: str
    priority: int
    arrival_s: float
    first_scheduled_s: float | None
    prefill_done_s: float | None
    first_token_s: float | None
    finish_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    preemptions: int
    recomputed_tokens: int
    finish_reason: str
    token_times: tuple[float, ...]
    error: str | None


class MetricsCollector:
    """Collects one run's step log and request records.

    - `steps`: one tuple per step, laid out as `StepRow` (use the index constants or `StepRow`
      to read it).
    - `requests`: one `RequestRecord` per finished sequence and per rejected request.
    """

    __slots__ = ("max_num_seqs", "requests", "steps", "_append_step")

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.requests: list[RequestRecord] = []
        self.steps: list[tuple] = []
        self._append_step = self.steps.append

    def record_step(
        self,
        plan: StepPlan,
        time_s: float,
        duration_s: float,
        running: int,
        waiting: int,
        swapped: int,
        decoding: int,
        free_blocks: int,
        cached_blocks: int,
        used_blocks: int,
    ) -> None:
        """Record one executed step.

        `time_s` is the clock after the step, `duration_s` its length; `decoding` is how many
        running sequences wanted a decode token when the step began (a step that schedules no
        decode token while some wanted one is a decode stall). Batch size, token counts and
        preemptions come from `plan`.
        """
        self._append_step((
            plan.step, time_s, duration_s, len(plan.scheduled), plan.num_prefill_tokens,
            plan.num_decode_tokens, len(plan.preempted), running, waiting, swapped, decoding,
            free_blocks, cached_blocks, used_blocks,
        ))

    def record_finished(self, seq: Sequence) -> None:
        """Record a sequence that has finished, whatever its finish reason. Call once per sequence."""
        reason = seq.finish_reason
        self.requests.append(RequestRecord(
            seq.seq_id, seq.tenant, seq.priority, seq.arrival_time, seq.first_scheduled_time,
            seq.prefill_done_time, seq.first_token_time, seq.finish_time, seq.num_prompt_tokens,
            seq.num_cached_prompt_tokens, len(seq.token_ids) - seq.num_prompt_tokens,
            seq.num_preemptions, seq.recomputed_tokens,
            reason.value if isinstance(reason, Enum) else str(reason or ""),
            tuple(seq.token_times), seq.error,
        ))

    def record_rejected(
        self, request_id: str, tenant: str, priority: int, arrival_s: float, prompt_tokens: int, error: str
    ) -> None:
        """Record a request that was refused at submission (it never became a running sequence)."""
        self.requests.append(RequestRecord(
            request_id, tenant, priority, arrival_s, None, None, None, None, prompt_tokens, 0, 0, 0, 0,
            REJECTED, (), error,
        ))


# ----------------------------------------------------------------------------------------------
# Summary


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q`-th percentile (0..100) of a non-empty sorted list, interpolated linearly.

    Same definition as numpy's default (`method="linear"`): the value at rank `(n - 1) * q / 100`,
    interpolated between its two neighbours.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty population")
    rank = (n - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    a, b = sorted_values[lo], sorted_values[hi]
    return a + (b - a) * frac


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """`{"mean", "p50", "p90", "p95", "p99", "max"}` of `values`; all None when there are none."""
    xs = sorted(values)
    if not xs:
        return dict.fromkeys(LATENCY_FIELDS)
    return {
        "mean": math.fsum(xs) / len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p95": percentile(xs, 95),
        "p99": percentile(xs, 99),
        "max": xs[-1],
    }


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
    }


def _finite(value: Any) -> Any:
    """`value` with every non-finite float (NaN, ±inf) replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _assemble(record_stats: dict[str, Any], step_stats: dict[str, Any]) -> dict[str, Any]:
    merged = {**record_stats, **step_stats}
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
    """
    return _summarize_groups(records, steps, lambda r: r.tenant, max_num_seqs, kv_peak_blocks, wall_s)


def _summaries(
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


# ----------------------------------------------------------------------------------------------
# Fairness


def _window_index(bounds: list[float], t: float) -> int:
    """The window that holds time `t`: the last `k` with `bounds[k] <= t`, clamped to the windows."""
    return min(max(bisect_right(bounds, t) - 1, 0), len(bounds) - 2)


def _jain(xs: list[float]) -> float | None:
    total, squares = math.fsum(xs), math.fsum(x * x for x in xs)
    return total * total / (len(xs) * squares) if squares > 0 else None


def fairness(
    records: list[RequestRecord],
    *,
    window_s: float = 60.0,
    w_in: float = 1.0,
    w_out: float = 1.0,
    weights: dict[str, float] | None = None,
) -> dict[str, Any]:
    """How the engine's service was shared between tenants, window by window.

    Whole-run totals hide unfairness (a tenant starved for a minute and served later looks fine),
    so the run, from its first arrival to its last finish, is cut into windows of `window_s`
    seconds (the last one may be shorter). The step log carries no tenants, so everything comes
    from the request records (rejected requests count nowhere):

    - `input`: prompt tokens a request computed, i.e. its prompt minus the prefix-cache hit of its
      first admission, all counted at its `first_token_s` (the end of its prefill; the chunks of a
      chunked prefill are not spread) -- recomputation after a preemption is not service;
    - `output`: output tokens, each at its time in `token_times`;
    - `service`: `w_in * input + w_out * output` (what a tenant was served, in weighted tokens).

    A tenant is *backlogged* in a window when one of its requests was waiting in it: it had arrived
    before the window's end and was first scheduled (or ended without running) after its start.
    This is VTC's notion (a tenant with requests in the queue); a tenant whose requests all run is
    served as fast as the engine goes and is not compared. Over the backlogged
    tenants, with `x = service / weight` (`weights`: {tenant: weight}, 1.0 when unlisted):

    - `jain`: Jain's index (sum x)^2 / (n * sum x^2): 1.0 when every backlogged tenant got the same
      weighted service, 1/n when one got everything; None when no tenant was backlogged or none
      was served;
    - `max_service_gap`: the largest difference of `x` between two backlogged tenants (0.0 with
      one, None with none).

    Returns `{"window_s", "w_in", "w_out", "weights", "windows": [{"start_s", "end_s", "input",
    "output", "service", "backlogged", "jain", "max_service_gap"}], "min_jain", "mean_jain",
    "max_service_gap"}`: per-window dicts map every tenant with a non-rejected request to its
    figure, tenants sorted by name; the last three are over the windows that have a value (None
    when none has).
    """
    if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a number > 0, got {window_s!r}")
    for label, w in (("w_in", w_in), ("w_out", w_out)):
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ValueError(f"{label} must be a number >= 0, got {w!r}")
    weights = dict(weights or {})
    for tenant, w in weights.items():
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
            raise ValueError(f"weights[{tenant!r}] must be a number > 0, got {w!r}")

    served = [r for r in records if r.finish_s is not None and r.finish_reason != REJECTED]
    doc: dict[str, Any] = {
        "window_s": float(window_s), "w_in": w_in, "w_out": w_out, "weights": weights,
        "windows": [], "min_jain": None, "mean_jain": None, "max_service_gap": None,
    }
    if not served:
        return doc
    start = min(r.arrival_s for r in served)
    end = max(r.finish_s for r in served)
    n = max(1, math.ceil((end - start) / window_s))
    bounds = [start + k * window_s for k in range(n + 1)]
    tenants = sorted({r.tenant for r in served})
    inputs = [dict.fromkeys(tenants, 0) for _ in range(n)]
    outputs = [dict.fromkeys(tenants, 0) for _ in range(n)]
    backlogged: list[set[str]] = [set() for _ in range(n)]

    for r in served:
        tenant = r.tenant
        admitted = r.first_scheduled_s if r.first_scheduled_s is not None else r.finish_s
        for k in range(_window_index(bounds, r.arrival_s), _window_index(bounds, admitted) + 1):
            backlogged[k].add(tenant)
        if r.first_token_s is not None:
            inputs[_window_index(bounds, r.first_token_s)][tenant] += r.prompt_tokens - r.cached_prompt_tokens
        tt = r.token_times
        if not tt:
            continue
        first, last = _window_index(bounds, tt[0]), _window_index(bounds, tt[-1])
        if first == last:
            outputs[first][tenant] += len(tt)
            continue
        lo = 0
        for k in range(first, last):
            hi = bisect_left(tt, bounds[k + 1], lo)
            outputs[k][tenant] += hi - lo
            lo = hi
        outputs[last][tenant] += len(tt) - lo

    windows, jains, gaps = [], [], []
    for k in range(n):
        service = {t: w_in * inputs[k][t] + w_out * outputs[k][t] for t in tenants}
        active = sorted(backlogged[k])
        xs = [service[t] / weights.get(t, 1.0) for t in active]
        jain = _jain(xs) if xs else None
        gap = max(xs) - min(xs) if xs else None
        if jain is not None:
            jains.append(jain)
        if gap is not None:
            gaps.append(gap)
        windows.append({
            "start_s": bounds[k], "end_s": min(bounds[k + 1], end) if k == n - 1 else bounds[k + 1],
            "input": inputs[k], "output": outputs[k], "service": service, "backlogged": active,
            "jain": jain, "max_service_gap": gap,
        })
    doc.update(
        windows=windows,
        min_jain=min(jains) if jains else None,
        mean_jain=math.fsum(jains) / len(jains) if jains else None,
        max_service_gap=max(gaps) if gaps else None,
    )
    return doc


def _jsonable(value: Any) -> Any:
    """`value` made of JSON types only: containers to dicts and lists, NaN/inf to None, the rest str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Enum):
        return _jsonable(value.value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return _jsonable(value.model_dump(mode="json"))
    return str(value)


def result_document(
    policy: str,
    workload: dict,
    executor: dict,
    config: dict,
    collector: MetricsCollector,
    *,
    kv_peak_blocks: int,
    wall_s: float,
    window_s: float = 60.0,
    service_weights: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result of one run: `{"policy", "workload", "executor", "config", "summary", "tenants",
    "fairness"}`.

    `summary` is `summarize` over the whole run, `tenants` is `summarize_by_tenant`, `fairness` is
    `fairness` over windows of `window_s` seconds, with the token and tenant weights of
    `service_weights` (`{"w_in", "w_out", "weights"}`, each optional: a weighted-fair policy's own
    weights, so that its figures measure what it equalises; default 1, 1 and every tenant 1). The
    document holds JSON types only (`json.dumps` needs no `default`) and never a NaN: what cannot
    be computed is None. `workload` and `executor` should carry a `"name"` for the report's title.
    """
    kw = dict(max_num_seqs=collector.max_num_seqs, kv_peak_blocks=kv_peak_blocks, wall_s=wall_s)
    sw = service_weights or {}
    unknown = set(sw) - {"w_in", "w_out", "weights"}
    if unknown:
        raise ValueError(f"service_weights: unknown key(s) {sorted(unknown)}; valid: w_in, w_out, weights")
    summary, tenants, priorities = _summaries(collector.requests, collector.steps, **kw)
    return _jsonable({
        "policy": policy,
        "workload": workload,
        "executor": executor,
        "config": config,
        "summary": summary,
        "tenants": tenants,
        "priorities": priorities,
        "fairness": fairness(collector.requests, window_s=window_s, **sw),
    })
