"""The result document of a simulated cluster (`metroline.core.cluster.simulation.run_cluster`):
the cluster-wide document of its engines read as one (`PooledEngines`), with per-replica, per-pool
and canary sections."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..config import EngineConfig
from ..experiments.runner import result_of
from ..results.canary import ArmSamples, compare_arms
from ..results.collector import TIME_S, MetricsCollector
from ..results.horizon import MeasurementWindow, unfinished_records, window_summary
from ..results.summaries import summarize
from ..step.engine import Engine
from ..workloads.build import Workload
from .spec import BASELINE, CANARY, ClusterSpec, config_changes

class PooledEngines:
    """Several engines read as one by `runner.result_of` and `run_series.series_of`: their records
    and steps pooled (in time order), `config` the cluster's top-level one (with `total_blocks`,
    `num_blocks` their sum), the pool's peak the sum of their peaks; `sequences(request_id)` finds
    a request on any of them."""

    def __init__(self, engines: list[Engine], config: EngineConfig, extra: MetricsCollector | None = None,
                 total_blocks: bool = False) -> None:
        self.engines = engines
        first = engines[0]
        if total_blocks:
            config = config.model_copy(update={"num_blocks": sum(e.config.num_blocks for e in engines)})
        self.config = config
        self.plugins, self.executor = first.plugins, first.executor
        self.metrics = _pooled(engines, extra)
        self.pool = SimpleNamespace(peak_used_blocks=sum(e.pool.peak_used_blocks for e in engines))

    def sequences(self, request_id: str) -> Any:
        for e in self.engines:
            try:
                return e.sequences(request_id)
            except KeyError:
                continue
        raise KeyError(request_id)


def _pooled(engines: list[Engine], extra: MetricsCollector | None = None) -> SimpleNamespace:
    """The metrics of several engines as one collector (records and steps concatenated)."""
    first = engines[0].metrics
    requests, steps, running = list(first.requests), list(first.steps), list(first.running_by_tenant)
    for e in engines[1:]:
        requests += e.metrics.requests
        steps += e.metrics.steps
        running += e.metrics.running_by_tenant
    if extra is not None:
        requests += extra.requests
    if len(engines) > 1:  # in time order, as one engine's log is
        order = sorted(range(len(steps)), key=lambda k: steps[k][TIME_S])
        steps = [steps[k] for k in order]
        running = [running[k] for k in order] if len(running) == len(order) else running
    deadlines = {k: v for e in engines for k, v in getattr(e.metrics, "deadlines", {}).items()}
    return SimpleNamespace(max_num_seqs=first.max_num_seqs, requests=requests, steps=steps,
                           running_by_tenant=running, deadlines=deadlines)


def _records(engine: Engine, arrivals: list[float], measure: MeasurementWindow | None) -> list:
    """An engine's records, with those of its requests unfinished at the horizon when measured."""
    if measure is None or not measure.active:
        return list(engine.metrics.requests)
    return [*engine.metrics.requests, *unfinished_records(engine, arrivals)]


def _summary(engines: list[Engine], arrivals: list[float], measure: MeasurementWindow | None,
             **kw: Any) -> dict[str, Any]:
    records = [r for e in engines for r in _records(e, arrivals, measure)]
    steps = _pooled(engines).steps
    peak = sum(e.pool.peak_used_blocks for e in engines)
    if measure is None or not measure.active:
        return summarize(records, steps, kv_peak_blocks=peak, **kw)
    return window_summary(records, steps, measure, kv_peak_blocks=peak, **kw)


def cluster_document(reps: list[Any], refused: MetricsCollector, workload: Workload, wall_s: float,
                     router: str, spec: ClusterSpec, config: EngineConfig, oracle_lengths: bool, window_s: float,
                     measure: MeasurementWindow | None = None,
                     twins: dict[str, list[Engine]] | None = None) -> dict[str, Any]:
    """The cluster's result document (see `run_cluster`); `reps`: its replicas
    (`metroline.core.cluster.simulation.Replica`: `plan`, `engine`, `routed`); `twins`: pool -> its
    canary's twins (`metroline.core.cluster.twins`), whose comparison with the canary is the
    canary's `comparison` (`split_comparison` the one against the baseline arm's requests)."""
    engines = [r.engine for r in reps]
    proxy = PooledEngines(engines, engines[0].config if len(engines) == 1 else config, refused)
    doc = result_of(proxy, workload, wall_s, oracle_lengths=oracle_lengths, window_s=window_s, measure=measure)
    arrivals = [it.arrival_s for it in workload.items]
    if measure is not None:
        arrivals = [t for t in arrivals if t < measure.stop_s]
    kw = {"max_num_seqs": config.max_num_seqs, "wall_s": wall_s}
    doc["cluster"] = {"replicas": len(reps), "router": router, "refused": len(refused.requests),
                      "spec": spec.describe()}
    doc["replicas"] = [
        {"index": r.plan.index, "name": r.plan.name, "pool": r.plan.pool, "arm": r.plan.arm, "policy": r.plan.policy,
         "routed": r.routed, "summary": _summary([r.engine], arrivals, measure, **kw)}
        for r in reps
    ]
    pools = list(dict.fromkeys(r.plan.pool for r in reps))
    if spec.pools:
        doc["pools"] = {pool: _summary([r.engine for r in reps if r.plan.pool == pool], arrivals, measure, **kw)
                        for pool in pools}
    if spec.has_canary:
        doc["canary"] = {}
        for pool in pools:
            arms = {arm: [r.engine for r in reps if r.plan.pool == pool and r.plan.arm == arm]
                    for arm in (BASELINE, CANARY)}
            if not arms[CANARY]:
                continue
            samples = {arm: _samples(es, measure) for arm, es in arms.items()}
            split = compare_arms(samples[BASELINE], samples[CANARY])
            split["pairing"] = "split"
            paired = None
            if twins and twins.get(pool):
                paired = compare_arms(_samples(twins[pool], measure), samples[CANARY], split=False)
                paired["pairing"] = "twin"
            doc["canary"][pool] = {
                "policy": {arm: next(r.plan.policy for r in reps if r.plan.pool == pool and r.plan.arm == arm)
                           for arm in arms},
                "changes": config_changes(arms[BASELINE][0].config, arms[CANARY][0].config),
                "summary": {arm: _summary(es, arrivals, measure, **kw) for arm, es in arms.items()},
                "comparison": paired or split,
                "split_comparison": split,
            }
    from ..results.document import _jsonable

    return _jsonable(doc)


def _samples(engines: list[Engine], measure: MeasurementWindow | None) -> ArmSamples:
    return ArmSamples.of_records(_in_window([rec for e in engines for rec in e.metrics.requests], measure))


def _in_window(records: list, measure: MeasurementWindow | None) -> list:
    if measure is None or not measure.active:
        return records
    return [r for r in records if measure.warmup_s <= r.arrival_s < measure.stop_s]
