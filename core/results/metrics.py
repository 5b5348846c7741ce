"""Metrics: what the engine records while it runs, and the summary it gives afterwards.

This module gathers the public names of the modules that do the work:

- `metrics_collector`: `MetricsCollector` (the hot-path recording), `StepRow`, `RequestRecord`
  and the index constants of a step tuple (`STEP` ... `USED_BLOCKS`);
- `summaries`: `summarize`, `summarize_by_tenant`, `summarize_by_priority`, `distribution`,
  `percentile`, `SUMMARY_KEYS`, `LATENCY_FIELDS`;
- `fairness`: `fairness`, per-window Jain's index and service gaps between tenants;
- `result_document`: `result_document`, the JSON document of a run.

Times are seconds on the engine's clock (virtual in the simulator, wall clock on a real model).
"""

from __future__ import annotations

from .collector import (
    CACHED_BLOCKS,
    COMPLETED_REASONS,
    DECODE_TOKENS,
    DECODING,
    DURATION_S,
    FREE_BLOCKS,
    NUM_SEQS,
    PREEMPTIONS,
    PREFILL_TOKENS,
    REJECTED,
    RUNNING,
    STEP,
    SWAPPED,
    TIME_S,
    USED_BLOCKS,
    WAITING,
    MetricsCollector,
    RequestRecord,
    StepRow,
)
from .document import result_document
from .fairness import fairness
from .summaries import (
    LATENCY_FIELDS,
    STEP_LEVEL_KEYS,
    SUMMARY_KEYS,
    distribution,
    percentile,
    summarize,
    summarize_all,
    summarize_by_priority,
    summarize_by_tenant,
)

__all__ = [
    "CACHED_BLOCKS", "COMPLETED_REASONS", "DECODE_TOKENS", "DECODING", "DURATION_S", "FREE_BLOCKS",
    "LATENCY_FIELDS", "NUM_SEQS", "PREEMPTIONS", "PREFILL_TOKENS", "REJECTED", "RUNNING", "STEP",
    "STEP_LEVEL_KEYS", "SUMMARY_KEYS", "SWAPPED", "TIME_S", "USED_BLOCKS", "WAITING", "MetricsCollector",
    "RequestRecord", "StepRow", "distribution", "fairness", "percentile", "result_document", "summarize",
    "summarize_all", "summarize_by_priority", "summarize_by_tenant",
]
