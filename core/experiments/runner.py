"""Replaying a workload through an engine: arrivals on the engine's clock, then the result document.
(Several replays in parallel: `metroline.core.experiments.parallel`.)"""

from __future__ import annotations

import math
import time
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import RequestRefused
from ..results.deadlines import deadline_figures
from ..results.horizon import MeasurementWindow, measured_summaries
from ..results.metrics import result_document
from ..results.progress import ProgressBar
from ..step.driving import GC_EVERY_STEPS, Driver, drive
from ..step.engine import Engine
from ..workloads.build import Workload
from ..workloads.items import WorkloadItem

__all__ = ["GC_EVERY_STEPS", "replay", "result_of", "run_workload", "submit"]


def run_workload(
    workload: Workload,
    config: EngineConfig,
    executor: Any,
    *,
    plugins: list[Any] | None = None,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    progress: Any = False,
    window_s: float = 60.0,
    measure: MeasurementWindow | None = None,
) -> tuple[dict[str, Any], Engine]:
    """Replay `workload` on a new engine (see `replay`) and return the result document (see
    `metrics.result_document`) and the engine. `progress`: as `replay`'s. `oracle_lengths` tells policies each request's
    true output length (`expected_output_tokens`); the result says so in its `workload` field.
    `measure`: a warm-up and horizon (`metroline.core.results.horizon`); the replay stops at the horizon."""
    digests = None
    if config.deterministic and hasattr(executor, "kv_bytes_per_token"):  # a real executor's outputs
        from .output_digests import OutputDigests

        digests = OutputDigests()
        plugins = [*(plugins or ()), digests]
    engine = Engine(config, executor, plugins=plugins or (), retain_finished=False)
    until = measure.stop_s if measure is not None else math.inf
    wall_s = replay(engine, workload, oracle_lengths=oracle_lengths, vocab_size=vocab_size, progress=progress,
                    until_s=until)
    doc = result_of(engine, workload, wall_s, oracle_lengths=oracle_lengths, window_s=window_s, measure=measure)
    if digests is not None:
        doc["output_digests"] = digests.digests
    return doc, engine


def result_of(
    engine: Engine, workload: Workload, wall_s: float, *, oracle_lengths: bool = False, window_s: float = 60.0,
    measure: MeasurementWindow | None = None,
) -> dict[str, Any]:
    """The result document of a finished replay; fairness over windows of `window_s` seconds,
    weighted by the service weights of a plugin that has them (`service_weights`, as
    `weighted_fair`), else unweighted. With an active `measure`, the summaries (whole run, per
    tenant, per priority) are those of its window (`horizon.window_summary`, which adds
    `unfinished`), and the document gets a `measurement` entry; fairness stays over the run."""
    config = engine.config
    plugins = engine.plugins
    service_weights = next(
        (w for n in plugins.names() if (w := getattr(plugins.get(n), "service_weights", None))), None
    )
    workload_info = workload.describe()
    if oracle_lengths:
        workload_info["oracle_lengths"] = True
    doc = result_document(
        "+".join([config.policy, *config.plugins]),
        workload_info,
        engine.executor.describe(),
        config.model_dump(mode="json"),
        engine.metrics,
        kv_peak_blocks=engine.pool.peak_used_blocks,
        wall_s=wall_s,
        window_s=window_s,
        service_weights=service_weights,
    )
    if measure is not None and measure.active:
        measured_summaries(doc, engine, [it.arrival_s for it in workload.items], measure, wall_s)
    deadlines = deadline_figures(engine.metrics.requests, getattr(engine.metrics, "deadlines", {}))
    if deadlines is not None:
        doc["deadlines"] = deadlines
    speculation = getattr(getattr(engine, "scheduler", None), "speculation", None)  # none on a cluster's pooled engines
    if speculation is not None:  # vLLM's counters, and the figures the summary shows
        doc["speculation"] = figures = speculation.counters.as_dict()
        for key in SPECULATION_FIGURES:
            doc["summary"][key] = figures[key]
    return doc


SPECULATION_FIGURES = ("acceptance_rate", "mean_acceptance_length", "tokens_per_request_step", "draft_tokens_thrown_away")
"""The speculation figures a run's summary gets (under speculative decoding)."""


def replay(
    engine: Engine,
    workload: Workload,
    *,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    progress: Any = False,
    max_idle_steps: int = 1000,
    until_s: float = math.inf,
) -> float:
    """Submit each request of `workload` when the engine's clock reaches its arrival and step
    until all have ended (through the one driving loop, `metroline.core.step.driving.drive`);
    returns the wall time it took.

    `progress`: progress on stderr in a mode of `results.progress.progress_mode` (True or None:
    a bar on a terminal, plain lines elsewhere; False: none), or an object with
    `update(requests_done)` and `close()` methods.

    `until_s`: stop once the clock reaches it; requests arriving from then on are not submitted,
    those submitted stay where they are (see `horizon.unfinished_records`).

    Requests that fail validation are recorded as rejected and the replay goes on. Raises
    `NoProgressError` when the plugins schedule nothing for `max_idle_steps` steps while requests
    wait and no arrival is pending.
    """
    items = workload.items
    bar = progress if hasattr(progress, "update") else ProgressBar(len(items), enabled=progress)
    update = bar.update if getattr(bar, "enabled", True) else None
    records = engine.metrics.requests
    driver = Driver(engine, max_idle_steps)

    def deliver(i: int) -> None:
        item = items[i]
        driver.before_arrival(item.arrival_s)
        submit(engine, item, str(i), vocab_size, oracle_lengths)

    wall = time.perf_counter()
    for _ in drive([driver], [it.arrival_s for it in items], deliver, until=until_s, gc_every=GC_EVERY_STEPS):
        if update is not None:
            update(len(records))
    wall = time.perf_counter() - wall
    bar.close()
    return wall


def submit(engine: Engine, item: WorkloadItem, rid: str, vocab_size: int, oracle: bool,
           data: dict[str, Any] | None = None) -> bool:
    """Submit workload `item` as request `rid` to `engine` (`data`: its request, when made
    already); one the engine refuses (its lengths, validation, a plugin's `check_request`) is
    recorded as rejected. Whether it was accepted."""
    problem = engine.length_problem(item.prompt_len, item.output_len)
    if problem is not None:  # refused before its prompt is made
        engine.reject({"request_id": rid, "tenant": item.tenant, "priority": item.priority,
                       "arrival_time": item.arrival_s, "prompt_token_ids": range(item.prompt_len)}, problem)
        return False
    if data is None:
        data = item.request_data(rid, vocab_size=vocab_size, oracle=oracle)
    try:
        engine.add_request(data)
    except (ValidationError, RequestRefused) as exc:
        engine.reject(data, exc)
        return False
    return True
