"""Several runs as tasks of a Ray cluster (`--ray [ADDRESS]`; `pip install 'metroline[ray]'`).

Each run is one Ray task of one CPU that replays its workload on a new engine and a new executor,
exactly as a worker of the local process pool does (`remote.run_remote`), so a result document
equals the one a local run gives except `wall_s`. A workload shared by several runs goes to the
object store once. Ray is imported only here, and only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..results.progress import ProgressBoard
from ..workloads.build import Workload
from .remote import collect_outcomes, run_remote


def connect(address: str) -> Any:
    """The `ray` module, connected: to the cluster at `address`, or with "" to the one
    `RAY_ADDRESS` names, else a new local one. A connection already made is kept. The cluster's
    workers must import the same metroline (and the plugins the configs name) as this process."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray: Ray is not installed (pip install 'metroline[ray]')") from None
    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    return ray


def run_on_ray(
    runs: list[tuple[Workload, EngineConfig]],
    make_executor: Callable[[], Any],
    labels: list[str],
    options: dict[str, Any],
    *,
    extract: Callable[[Any, dict[str, Any]], Any] | None = None,
    address: str = "",
    progress: bool | str | None = False,
) -> list[tuple[dict[str, Any], Any]]:
    """`parallel.run_many` on Ray: `(document, extract(engine, document))` per run, in the order of
    `runs`; `options` are `run_workload`'s. The progress board marks each run done as it ends."""
    ray = connect(address)
    task = ray.remote(num_cpus=1, max_retries=0)(run_remote)
    stored: dict[int, Any] = {}
    for workload, *_ in runs:
        if id(workload) not in stored:
            stored[id(workload)] = ray.put(workload)
    maker = ray.put(make_executor)
    pending = {
        task.remote(stored[id(workload)], config, maker, options, extract, False, cluster[0] if cluster else None): i
        for i, (workload, config, *cluster) in enumerate(runs)
    }
    refs = list(pending)
    board = ProgressBoard(labels, max((len(run[0].items) for run in runs), default=0), enabled=progress)
    try:
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            board.update(pending[done[0]], None)
        outcomes = ray.get(refs)
    finally:
        board.close()
    return collect_outcomes(labels, outcomes)
