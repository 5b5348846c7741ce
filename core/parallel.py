"""Several replays at once: every config on every workload, in parallel worker processes (forks of
this process, so each replays the very workload object built here)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from .config import EngineConfig
from .errors import NoProgressError, PluginError
from .horizon import MeasurementWindow
from .progress import ProgressBar, ProgressBoard
from .runner import run_workload
from .workloads import Workload


_JOB: dict[str, Any] = {}  # what forked workers inherit: the workload, the configs, the options


def default_jobs() -> int:
    """One worker per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_workloads(
    workload: Workload, configs: list[EngineConfig], make_executor: Callable[[], Any], **options: Any,
) -> list[dict[str, Any]]:
    """Replay `workload` once per config (each on a new engine and a new executor from
    `make_executor()`) and return the result documents in the order of `configs`.

    `jobs` worker processes (default: one per core) run them in parallel. Each worker is a fork of
    this process, so it replays the very workload object built here, with the same interpreter
    state (hash seed included), and a document equals the one a run in this process gives, except
    `wall_s` (the host's time, which no two runs share). `jobs=1` runs them here, one by one.
    `progress` shows one line with each run's share done, labelled by `labels` (default: the
    policies). The `options` are `run_grid`'s: `jobs`, `labels`, `oracle_lengths`, `progress`,
    `window_s`, `vocab_size` and `measure` (the measurement window of every run, `run_workload`)."""
    return run_grid([workload], configs, make_executor, **options)[0]


def run_grid(
    workloads: list[Workload],
    configs: list[EngineConfig],
    make_executor: Callable[[], Any],
    *,
    jobs: int | None = None,
    labels: list[str] | None = None,
    oracle_lengths: bool = False,
    progress: bool | None = False,
    window_s: float = 60.0,
    vocab_size: int | None = None,
    measure: MeasurementWindow | None = None,
) -> list[list[dict[str, Any]]]:
    """Replay every workload under every config, as `run_workloads` does for one workload, all
    runs sharing one pool of `jobs` workers; returns `docs[w][c]` for workload `w` and config `c`.
    With several workloads a run's progress label is its config's label and the workload's index
    (`fcfs#0`)."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs: must be at least 1, got {jobs}")
    labels = labels or ["+".join([c.policy, *c.plugins]) for c in configs]
    grid = [(w, c) for w in range(len(workloads)) for c in range(len(configs))]
    run_labels = [labels[c] if len(workloads) == 1 else f"{labels[c]}#{w}" for w, c in grid]
    jobs = min(jobs or default_jobs(), len(grid))
    options: dict[str, Any] = dict(oracle_lengths=oracle_lengths, window_s=window_s)
    if measure is not None:
        options["measure"] = measure
    if vocab_size is not None:
        options["vocab_size"] = vocab_size  # a real model's: synthetic token ids stay inside it
    docs: list[list[dict[str, Any]]] = [[] for _ in workloads]
    if jobs <= 1:
        for label, (w, c) in zip(run_labels, grid):
            bar = ProgressBar(len(workloads[w].items), enabled=progress, label=label)
            doc, engine = run_workload(workloads[w], configs[c], make_executor(), progress=bar, **options)
            engine.close()
            docs[w].append(doc)
        return docs
    board = ProgressBoard(run_labels, max(len(wl.items) for wl in workloads), enabled=progress)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue() if board.enabled else None
    _JOB.update(workloads=workloads, configs=configs, grid=grid, make_executor=make_executor, options=options,
                queue=queue)
    try:
        with ctx.Pool(jobs) as pool:
            pending = pool.map_async(_run_job, range(len(grid)), chunksize=1)
            while not pending.ready():
                pending.wait(0.1)
                while queue is not None and not queue.empty():
                    board.update(*queue.get())
            results = pending.get()
    finally:
        _JOB.clear()
        board.close()
    for label, (w, _), (doc, error) in zip(run_labels, grid, results):
        if error is not None:
            raise ValueError(f"{label}: {error}")
        docs[w].append(doc)
    return docs


def _run_job(index: int) -> tuple[dict[str, Any] | None, str | None]:
    """One run in a worker: (document, None), or (None, the error's message) for the errors the
    command reports as such (the exception itself may not survive pickling)."""
    job = _JOB
    queue = job["queue"]
    bar = _QueuedProgress(index, queue) if queue is not None else False
    w, c = job["grid"][index]
    try:
        doc, _ = run_workload(job["workloads"][w], job["configs"][c], job["make_executor"](), progress=bar,
                              **job["options"])
    except (ValidationError, ValueError, PluginError, NoProgressError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return doc, None


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
