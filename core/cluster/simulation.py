"""A cluster in simulation: N engines (each its own KV pool, scheduler and policy stack) behind a
router, on one virtual clock.

Requests arrive in time order; the router (`route` hook) picks a replica at the arrival, and the
replicas step in time order: the replica whose clock is earliest steps next, once every request
that arrived by then is routed. A replica's clock only moves by its own steps and idling, exactly
as in `experiments.runner.replay`, so each replica's result is that of an engine replayed alone
on the requests routed to it (tests/test_cluster.py checks it document for document).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ..config import EngineConfig
from ..experiments.runner import result_of, submit
from ..results.canary import ArmSamples, compare_arms
from ..results.collector import TIME_S, MetricsCollector
from ..results.horizon import MeasurementWindow, unfinished_records, window_summary
from ..results.summaries import summarize
from ..step.driving import GC_EVERY_STEPS, Driver, drive
from ..step.engine import Engine
from ..workloads.build import Workload
from .router import Router, make_router
from .spec import BASELINE, CANARY, DEFAULT_ROUTER, ClusterSpec, ReplicaPlan, cluster_spec, config_changes
from .targets import RouteTargets, replica_view
from .view import Outstanding, Refuse, RouteRequest


class Replica:
    """One engine of the cluster with what was routed to it; `driver`: the engine under the
    driving loop."""

    __slots__ = ("driver", "engine", "outstanding", "plan", "routed", "seen")

    def __init__(self, plan: ReplicaPlan, engine: Engine, max_idle_steps: int = 1000) -> None:
        self.plan = plan
        self.engine = engine
        self.driver = Driver(engine, max_idle_steps)
        self.outstanding = Outstanding()
        self.seen = 0  # records already read (requests ended)
        self.routed = 0


def spec_of(replicas: int = 1, pools: dict[str, int] | None = None, router: str = DEFAULT_ROUTER,
            router_options: dict[str, Any] | None = None) -> ClusterSpec:
    """The `ClusterSpec` of `replicas` in one pool, or of `pools` (pool -> count), every replica
    with the top-level engine (`spec.cluster_spec`, as the flags give them)."""
    return cluster_spec(None, replicas=None if pools else replicas, pools=pools, router=router,
                        router_options=router_options)


def run_cluster(
    workload: Workload,
    config: EngineConfig,
    make_executor: Callable[[], Any],
    *,
    spec: ClusterSpec | None = None,
    replicas: int = 1,
    pools: dict[str, int] | None = None,
    router: Router | str = DEFAULT_ROUTER,
    router_options: dict[str, Any] | None = None,
    plugins: Callable[[int], list[Any]] | None = None,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    window_s: float = 60.0,
    max_idle_steps: int = 1000,
    measure: MeasurementWindow | None = None,
    executor_of: Callable[[ReplicaPlan], Any] | None = None,
) -> tuple[dict[str, Any], list[Engine]]:
    """Replay `workload` on a simulated cluster; returns the result document and the engines.

    The cluster is `spec` (pools, their engines and canaries, the router; see `spec.py`), or
    `replicas` / `pools` (pool -> count) of the top-level engine behind `router` (a spec or a
    `Router`). `make_executor()` builds one replica's executor (each has its own clock);
    `plugins(i)` the extra plugin objects of replica `i`. `measure`: a warm-up and horizon (as
    `runner.run_workload`'s); the replay stops at the horizon.

    The document is the cluster-wide one of `runner.result_of` (every replica's requests and
    steps pooled; `kv_peak_blocks` is the sum of the replicas' peaks), with `cluster` (`replicas`,
    `router`, `refused`, `spec`), `replicas` (per replica: `index`, `name`, `pool`, `arm`,
    `policy`, `routed` and its `summary`), with pools `pools` (pool -> summary over its
    replicas), and with a canary `canary` (pool -> each arm's summary and `comparison`, see
    `results/canary.py`). With one replica the rest of the document is the one
    `runner.run_workload` gives."""
    if spec is None:
        spec = spec_of(replicas, pools, router if isinstance(router, str) else DEFAULT_ROUTER, router_options)
    if isinstance(router, Router):
        router_name = "+".join(router.names)
    else:
        router_name, router = spec.router, make_router(spec.router, spec.router_options)
    plans = spec.plan(config)
    build = executor_of or (lambda plan: make_executor())
    reps = [Replica(p, Engine(p.config, build(p), plugins=plugins(p.index) if plugins else (),
                              retain_finished=False), max_idle_steps) for p in plans]
    targets = RouteTargets(spec, plans, lambda i, pos: replica_view(plans[i], pos, reps[i].engine,
                                                                    reps[i].outstanding))
    refused = MetricsCollector(config.max_num_seqs)
    until = measure.stop_s if measure is not None else math.inf
    wall = _loop(workload.items, reps, targets, router, refused, vocab_size, oracle_lengths, until)
    doc = cluster_document(reps, refused, workload, wall, router_name, spec, config, oracle_lengths, window_s,
                           measure)
    return doc, [r.engine for r in reps]


def _loop(items: list, reps: list[Replica], targets: RouteTargets, router: Router, refused: MetricsCollector,
          vocab_size: int, oracle: bool, until: float) -> float:
    """Replay `items` on the replicas through the one driving loop; returns the wall time."""
    by_driver = {id(r.driver): r for r in reps}

    def deliver(i: int) -> None:
        _arrive(items[i], str(i), reps, targets, router, refused, vocab_size, oracle)

    wall = time.perf_counter()
    for driver in drive([r.driver for r in reps], [it.arrival_s for it in items], deliver, until=until,
                        gc_every=GC_EVERY_STEPS):
        r = by_driver[id(driver)]
        records = r.engine.metrics.requests
        if len(records) > r.seen:
            out = r.outstanding
            for rec in records[r.seen:]:
                out.end(rec.id.partition("#")[0])
            r.seen = len(records)
    return time.perf_counter() - wall


def _arrive(item: Any, rid: str, reps: list[Replica], targets: RouteTargets, router: Router,
            refused: MetricsCollector, vocab_size: int, oracle: bool) -> None:
    """Route one arriving request and submit it to its replica (as `runner.replay` would have)."""
    data = item.request_data(rid, vocab_size=vocab_size, oracle=oracle)
    prompt = data["prompt_token_ids"]
    request = RouteRequest(rid, item.arrival_s, prompt, item.output_len, item.tenant, item.priority)
    views, indexes = targets.for_request(request)
    choice = router.choose(request, views)
    if isinstance(choice, Refuse):
        refused.record_rejected(rid, item.tenant, item.priority, item.arrival_s, len(prompt),
                                f"router: {choice.reason}")
        return
    r = reps[indexes[choice]]
    r.routed += 1
    r.driver.before_arrival(item.arrival_s)
    if submit(r.engine, item, rid, vocab_size, oracle, data):
        r.outstanding.add(rid, item.prompt_len + item.output_len)


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
    return SimpleNamespace(max_num_seqs=first.max_num_seqs, requests=requests, steps=steps,
                           running_by_tenant=running)


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


def cluster_document(reps: list[Replica], refused: MetricsCollector, workload: Workload, wall_s: float,
                     router: str, spec: ClusterSpec, config: EngineConfig, oracle_lengths: bool, window_s: float,
                     measure: MeasurementWindow | None = None) -> dict[str, Any]:
    """The cluster's result document (see `run_cluster`)."""
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
            samples = {arm: ArmSamples.of_records(_in_window([rec for e in es for rec in e.metrics.requests], measure))
                       for arm, es in arms.items()}
            doc["canary"][pool] = {
                "policy": {arm: next(r.plan.policy for r in reps if r.plan.pool == pool and r.plan.arm == arm)
                           for arm in arms},
                "changes": config_changes(arms[BASELINE][0].config, arms[CANARY][0].config),
                "summary": {arm: _summary(es, arrivals, measure, **kw) for arm, es in arms.items()},
                "comparison": compare_arms(samples[BASELINE], samples[CANARY]),
            }
    from ..results.document import _jsonable

    return _jsonable(doc)


def _in_window(records: list, measure: MeasurementWindow | None) -> list:
    if measure is None or not measure.active:
        return records
    return [r for r in records if measure.warmup_s <= r.arrival_s < measure.stop_s]
