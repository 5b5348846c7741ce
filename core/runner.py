"""Replaying a workload through an engine: arrivals on the engine's clock, then the result document."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from .config import EngineConfig
from .engine import Engine
from .metrics import result_document
from .report import ProgressBar
from .workloads import Workload


def run_workload(
    workload: Workload,
    config: EngineConfig,
    executor: Any,
    *,
    plugins: list[Any] | None = None,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    progress: bool | None = False,
    window_s: float = 60.0,
) -> tuple[dict[str, Any], Engine]:
    """Replay `workload` on a new engine (see `replay`) and return the result document (see
    `metrics.result_document`) and the engine. `oracle_lengths` tells policies each request's
    true output length (`expected_output_tokens`); the result says so in its `workload` field."""
    engine = Engine(config, executor, plugins=plugins or (), retain_finished=False)
    wall_s = replay(engine, workload, oracle_lengths=oracle_lengths, vocab_size=vocab_size, progress=progress)
    return result_of(engine, workload, wall_s, oracle_lengths=oracle_lengths, window_s=window_s), engine


def result_of(
    engine: Engine, workload: Workload, wall_s: float, *, oracle_lengths: bool = False, window_s: float = 60.0
) -> dict[str, Any]:
    """The result document of a finished replay; fairness over windows of `window_s` seconds,
    weighted by the service weights of a plugin that has them (`service_weights`, as
    `weighted_fair`), else unweighted."""
    config = engine.config
    plugins = engine.plugins
    service_weights = next(
        (w for n in plugins.names() if (w := getattr(plugins.get(n), "service_weights", None))), None
    )
    workload_info = workload.describe()
    if oracle_lengths:
        workload_info["oracle_lengths"] = True
    return result_document(
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


def replay(
    engine: Engine,
    workload: Workload,
    *,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    progress: bool | None = False,
    max_idle_steps: int = 1000,
) -> float:
    """Submit each request of `workload` when the engine's clock reaches its arrival and step
    until all have ended; returns the wall time it took.

    Requests that fail validation are recorded as rejected and the replay goes on. Raises
    `NoProgressError` when the plugins schedule nothing for `max_idle_steps` steps while requests
    wait and no arrival is pending.
    """
    executor = engine.executor
    items = workload.items
    total, i, idle = len(items), 0, 0
    bar = ProgressBar(total, enabled=progress)
    wall = time.perf_counter()
    while True:
        now = executor.now()
        while i < total and items[i].arrival_s <= now:
            data = items[i].request_data(str(i), vocab_size=vocab_size, oracle=oracle_lengths)
            try:
                engine.add_request(data)
            except ValidationError as exc:
                engine.reject(data, exc)
            i += 1
        if not engine.has_unfinished():
            if i == total:
                break
            executor.idle_until(items[i].arrival_s)
            continue
        engine.step()
        if engine.last_step_progressed:
            idle = 0
        else:
            if engine.last_plan_empty:
                engine.idle(items[i].arrival_s if i < total else None)
            if i == total:  # a wake-up counts too: a plugin that keeps asking one is stuck
                idle += 1
                if engine.is_stalled(idle, max_idle_steps):
                    raise engine.stalled(idle)
        bar.update(len(engine.metrics.requests))
    bar.close()
    return time.perf_counter() - wall
