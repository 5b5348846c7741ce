"""A cluster in simulation: N engines (each its own KV pool, scheduler and policy stack) behind a
router, on one virtual clock.

Requests arrive in time order; the router (`route` hook) picks a replica at the arrival, and the
replicas step in time order: the replica whose clock is earliest steps next, once every request
that arrived by then is routed. A replica's clock only moves by its own steps and idling, exactly
as in `experiments.runner.replay`, so each replica's result is that of an engine replayed alone
on the requests routed to it (tests/test_cluster.py checks it document for document): both go
through the one driving loop, `metroline.core.step.driving.drive`. The result document:
`metroline.core.cluster.document`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ..config import EngineConfig
from ..experiments.runner import submit
from ..results.collector import MetricsCollector
from ..results.horizon import MeasurementWindow
from ..step.driving import GC_EVERY_STEPS, Driver, drive
from ..step.engine import Engine
from ..workloads.build import Workload
from .document import cluster_document
from .router import Router, make_router
from .spec import CANARY, DEFAULT_ROUTER, ClusterSpec, ReplicaPlan, cluster_spec
from .targets import RouteTargets, cluster_directory, replica_view
from .twins import canary_twins
from .view import Outstanding, Refuse, RouteRequest


class Replica:
    """One engine of the cluster with what was routed to it; `driver`: the engine under the
    driving loop."""

    __slots__ = ("driver", "engine", "outstanding", "plan", "routed", "seen", "served")

    def __init__(self, plan: ReplicaPlan, engine: Engine, max_idle_steps: int = 1000) -> None:
        self.plan = plan
        self.engine = engine
        self.driver = Driver(engine, max_idle_steps)
        self.outstanding = Outstanding()
        self.seen = 0  # records already read (requests ended)
        self.routed = 0
        self.served: list[int] = []  # the workload indexes routed to it (a canary's twin replays them)


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
    replicas), and with a canary `canary` (pool -> each arm's summary and `comparison`: the canary
    against its twins, the baseline engine replayed on the canary's own requests
    (`metroline.core.cluster.twins`; unless the canary sets `twin = false`), and `split_comparison`,
    against the baseline arm's other requests; see `metroline.core.results.canary`). With one replica the rest of the document is the one
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
    directory = cluster_directory(plans)
    targets = RouteTargets(spec, plans, lambda i, pos: replica_view(plans[i], pos, reps[i].engine,
                                                                    reps[i].outstanding, directory))
    refused = MetricsCollector(config.max_num_seqs)
    until = measure.stop_s if measure is not None else math.inf
    wall = _loop(workload.items, reps, targets, router, refused, vocab_size, oracle_lengths, until)
    twins = canary_twins(spec, reps, workload.items, build, plugins, vocab_size, oracle_lengths, until, max_idle_steps)
    doc = cluster_document(reps, refused, workload, wall, router_name, spec, config, oracle_lengths, window_s,
                           measure, twins)
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
    if r.plan.arm == CANARY:
        r.served.append(int(rid))
    r.driver.before_arrival(item.arrival_s)
    if submit(r.engine, item, rid, vocab_size, oracle, data):
        r.outstanding.add(rid, item.prompt_len + item.output_len)
        views[choice].routed(request)
