"""One run away from the command's process (a forked worker or a Ray task), and the outcomes of
several gathered back: what `parallel` and `ray_runner` share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import NoProgressError, PluginError
from ..step.engine import Engine
from ..workloads.build import Workload
from .runner import run_workload


def run_remote(
    workload: Workload, config: EngineConfig, make_executor: Callable[[], Any], options: dict[str, Any],
    extract: Callable[[Engine, dict[str, Any]], Any] | None, progress: Any = False, cluster: Any = None,
) -> tuple[dict[str, Any] | None, Any, str | None]:
    """One run away from the command's process: (document, extracted, None), or (None, None, the
    error's message) for the errors the command reports as such (the exception itself may not
    survive pickling). With `cluster` (a `ClusterSpec`), the run is that simulated cluster's
    (`cluster.simulation.run_cluster`), and `extract` reads its engines pooled."""
    try:
        if cluster is None:
            doc, engine = run_workload(workload, config, make_executor(), progress=progress, **options)
        else:
            doc, engine = run_cluster_remote(workload, config, make_executor, options, cluster)
        extracted = extract(engine, doc) if extract is not None else None
    except (ValidationError, ValueError, PluginError, NoProgressError, OSError) as exc:
        return None, None, f"{type(exc).__name__}: {exc}"
    return doc, extracted, None


def run_cluster_remote(workload: Workload, config: EngineConfig, make_executor: Callable[[], Any],
                       options: dict[str, Any], cluster: Any) -> tuple[dict[str, Any], Any]:
    """The document of a simulated cluster's run and its engines pooled (`PooledEngines`)."""
    from ..cluster.document import PooledEngines
    from ..cluster.simulation import run_cluster

    doc, engines = run_cluster(workload, config, make_executor, spec=cluster, **options)
    return doc, PooledEngines(engines, config, total_blocks=True)


def collect_outcomes(labels: list[str], outcomes: list[tuple[Any, Any, str | None]]) -> list[tuple[Any, Any]]:
    """`(document, extracted)` per run from the workers' `run_remote` outcomes, in order; the first
    run that failed raises ValueError naming its label."""
    for label, (_, _, error) in zip(labels, outcomes):
        if error is not None:
            raise ValueError(f"{label}: {error}")
    return [(doc, extracted) for doc, extracted, _ in outcomes]
