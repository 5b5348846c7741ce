"""Replaying a workload through an engine: arrivals on the engine's clock, then the result document.
(Several replays in parallel: `core/parallel.py`.)"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import RequestRefused
from ..results.horizon import MeasurementWindow, measured_summaries
from ..results.metrics import result_document
from ..results.progress import ProgressBar
from ..step.engine import Engine
from ..workloads.build import Workload

GC_EVERY_STEPS = 20_000
"""During a replay, the young generations of the garbage collector are collected every this many
steps (and the automatic collector is off)."""


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
    `measure`: a warm-up and horizon (`core/horizon.py`); the replay stops at the horizon."""
    engine = Engine(config, executor, plugins=plugins or (), retain_finished=False)
    until = measure.stop_s if measure is not None else math.inf
    wall_s = replay(engine, workload, oracle_lengths=oracle_lengths, vocab_size=vocab_size, progress=progress,
                    until_s=until)
    doc = result_of(engine, workload, wall_s, oracle_lengths=oracle_lengths, window_s=window_s, measure=measure)
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
    speculation = engine.scheduler.speculation
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
    until all have ended; returns the wall time it took.

    `progress`: a progress bar on stderr (True; None: when stderr is a terminal), or an object
    with `update(requests_done)` and `close()` methods.

    `until_s`: stop once the clock reaches it; requests arriving from then on are not submitted,
    those submitted stay where they are (see `horizon.unfinished_records`).

    Requests that fail validation are recorded as rejected and the replay goes on. Raises
    `NoProgressError` when the plugins schedule nothing for `max_idle_steps` steps while requests
    wait and no arrival is pending.
    """
    items = workload.items
    total = len(items)
    bar = progress if hasattr(progress, "update") else ProgressBar(total, enabled=progress)
    update = bar.update if getattr(bar, "enabled", True) else None
    step, records = engine.advance, engine.metrics.requests
    # The automatic collector's full passes walk every live object (the workload, the prefix
    # index, the records) again and again, for garbage the step does not make (it makes no
    # reference cycles of its own); the replay collects only the young generations, every
    # GC_EVERY_STEPS steps, and cycles that outlived one such pass wait for the end of the replay.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        wall = _replay_loop(engine, items, total, step, update, records, vocab_size, oracle_lengths, max_idle_steps,
                            until_s)
    finally:
        if gc_was_enabled:
            gc.enable()
    bar.close()
    return wall


def _replay_loop(
    engine: Engine, items: list, total: int, step: Callable[[], None], update: Callable[[int], None] | None,
    records: list, vocab_size: int, oracle_lengths: bool, max_idle_steps: int, until_s: float = math.inf,
) -> float:
    executor = engine.executor
    i, idle, gc_countdown = 0, 0, GC_EVERY_STEPS
    wall = time.perf_counter()
    while True:
        now = executor.now()
        while i < total and items[i].arrival_s <= now and items[i].arrival_s < until_s:
            item = items[i]
            problem = engine.length_problem(item.prompt_len, item.output_len)
            if problem is not None:  # refused before its prompt is made
                engine.reject({"request_id": str(i), "tenant": item.tenant, "priority": item.priority,
                               "arrival_time": item.arrival_s, "prompt_token_ids": range(item.prompt_len)}, problem)
                i += 1
                continue
            data = item.request_data(str(i), vocab_size=vocab_size, oracle=oracle_lengths)
            try:
                engine.add_request(data)
            except (ValidationError, RequestRefused) as exc:
                engine.reject(data, exc)
            i += 1
        if now >= until_s:
            break
        if not engine.has_unfinished():
            if i == total:
                break
            executor.idle_until(items[i].arrival_s)
            continue
        step()
        gc_countdown -= 1
        if not gc_countdown:
            gc.collect(1)
            gc_countdown = GC_EVERY_STEPS
        if engine.last_step_progressed:
            idle = 0
        else:
            if engine.last_plan_empty:
                engine.idle(items[i].arrival_s if i < total else None)
            if i == total:  # a wake-up counts too: a plugin that keeps asking one is stuck
                idle += 1
                if engine.is_stalled(idle, max_idle_steps):
                    raise engine.stalled(idle)
        if update is not None:
            update(len(records))
    return time.perf_counter() - wall
