"""Several replays at once: runs (a workload and a config each) in parallel worker processes
(forks of this process, so each replays the very workload object built here), or on Ray."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..results.horizon import MeasurementWindow
from ..results.progress import ProgressBar, ProgressBoard
from ..step.engine import Engine
from ..workloads.build import Workload
from .remote import collect_outcomes, run_remote
from .runner import run_workload

_JOB: dict[str, Any] = {}  # what forked workers inherit: the workload, the configs, the options


def default_jobs() -> int:
    """One worker per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_workloads(
    workload: Workload, configs: list[EngineConfig], make_executor: Callable[[], Any], **options: Any
) -> list[dict[str, Any]]:
    """Replay `workload` once per config (each on a new engine and a new executor from
    `make_executor()`) and return the result documents in the order of `configs`.

    `options` are `run_many`'s (but `extract`): `jobs` worker processes (default: one per core)
    run them in parallel. Each worker is a fork of this process, so it replays the very workload
    object built here, with the same interpreter state (hash seed included), and a document equals
    the one a run in this process gives, except `wall_s` (the host's time, which no two runs
    share). `jobs=1` runs them here, one by one. `progress` shows one line with each run's share
    done, labelled by `labels` (default: the policies)."""
    return [doc for doc, _ in run_many([(workload, c) for c in configs], make_executor, **options)]


def run_many(
    runs: list[tuple[Workload, EngineConfig] | tuple[Workload, EngineConfig, Any]],
    make_executor: Callable[[], Any] | list[Callable[[], Any]],
    *,
    extract: Callable[[Engine, dict[str, Any]], Any] | None = None,
    jobs: int | None = None,
    labels: list[str] | None = None,
    oracle_lengths: bool = False,
    progress: bool | str | None = False,
    window_s: float = 60.0,
    vocab_size: int | None = None,
    ray: str | None = None,
    measure: MeasurementWindow | None = None,
) -> list[tuple[dict[str, Any], Any]]:
    """`run_workloads` for runs that may each replay their own workload (a load sweep replays one
    workload at several rates): `(document, extract(engine, document))` per run, in the order of
    `runs` (`None` for the second without `extract`). A run `(workload, config, cluster)` is that
    simulated cluster's (a `ClusterSpec`; `extract` then reads its engines pooled). `extract` runs where the run ran (in its
    worker), so what it returns, not the engine, crosses back: keep it small and picklable.
    `ray`: run them as tasks of a Ray cluster instead (its address; "" for a local one or the
    one `RAY_ADDRESS` names; see `ray_runner.run_on_ray`), `jobs` then unused. `measure`: the
    measurement window of every run (`run_workload`). `make_executor` may be a list, one factory
    per run (arms that differ in their executor or cost model: `compare --arms`)."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    labels = labels or ["+".join([c.policy, *c.plugins]) for _, c in runs]
    jobs = min(jobs or default_jobs(), len(runs))
    options: dict[str, Any] = dict(oracle_lengths=oracle_lengths, window_s=window_s)
    if measure is not None:
        options["measure"] = measure
    if vocab_size is not None:
        options["vocab_size"] = vocab_size  # a real model's: synthetic token ids stay inside it
    per_run = isinstance(make_executor, list)
    if per_run and len(make_executor) != len(runs):
        raise ValueError(f"run_many: {len(make_executor)} executor factories for {len(runs)} runs")
    if ray is not None:
        if per_run:
            raise ValueError("--ray: arms with their own executors run in local processes (leave out --ray)")
        from .ray_runner import run_on_ray

        return run_on_ray(runs, make_executor, labels, options, extract=extract, address=ray, progress=progress)
    total = max((len(run[0].items) for run in runs), default=0)
    if jobs <= 1:
        results = []
        for i, (label, (workload, config, *cluster)) in enumerate(zip(labels, runs)):
            factory = make_executor[i] if per_run else make_executor
            if cluster and cluster[0] is not None:
                results.append(collect_outcomes([label], [run_remote(workload, config, factory, options, extract,
                                                                     cluster=cluster[0])])[0])
                continue
            bar = ProgressBar(len(workload.items), enabled=progress, label=label)
            doc, engine = run_workload(workload, config, factory(), progress=bar, **options)
            results.append((doc, extract(engine, doc) if extract is not None else None))
            engine.close()
        return results
    board = ProgressBoard(labels, total, enabled=progress)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue() if board.enabled else None
    _JOB.update(runs=runs, make_executor=make_executor, options=options, queue=queue, extract=extract)
    try:
        with ctx.Pool(jobs) as pool:
            pending = pool.map_async(_run_job, range(len(runs)), chunksize=1)
            while not pending.ready():
                pending.wait(0.1)
                while queue is not None and not queue.empty():
                    board.update(*queue.get())
            outcomes = pending.get()
    finally:
        _JOB.clear()
        board.close()
    return collect_outcomes(labels, outcomes)


def _run_job(index: int) -> tuple[dict[str, Any] | None, Any, str | None]:
    """One run in a forked worker (what `_JOB` holds), as `run_remote`."""
    job = _JOB
    queue = job["queue"]
    bar = _QueuedProgress(index, queue) if queue is not None else False
    workload, config, *cluster = job["runs"][index]
    factory = job["make_executor"][index] if isinstance(job["make_executor"], list) else job["make_executor"]
    return run_remote(workload, config, factory, job["options"], job["extract"], bar,
                      cluster=cluster[0] if cluster else None)


class _QueuedProgress:
    """A worker's progress: `(run index, done)` on the parent's queue, at most ~10 times a second."""

    __slots__ = ("index", "queue", "_countdown", "_last")

    def __init__(self, index: int, queue: Any) -> None:
        self.index, self.queue = index, queue
        self._countdown = 256
        self._last = 0.0

    def update(self, done: int) -> None:
        self._countdown -= 1
        if self._countdown > 0:
            return
        self._countdown = 256
        now = time.monotonic()
        if now - self._last >= 0.1:
            self._last = now
            self.queue.put((self.index, done))

    def close(self) -> None:
        self.queue.put((self.index, None))
