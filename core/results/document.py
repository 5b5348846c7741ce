"""The result document of a run: its policy, workload, executor and config, the summaries
(whole run, per tenant, per priority class) and the fairness figures, in JSON types only."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from .collector import MetricsCollector
from .fairness import fairness
from .summaries import running_by_tenant, summarize_all


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

    `summary` is `summarize` over the whole run, `tenants` is `summarize_by_tenant` with each
    tenant's `running_mean` and `running_max` added (`summaries.running_by_tenant`), `fairness` is
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
    summary, tenants, priorities = summarize_all(collector.requests, collector.steps, **kw)
    running = running_by_tenant(collector.running_by_tenant, tenants)
    tenants = {t: {**tenants[t], **running[t]} for t in tenants}
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
