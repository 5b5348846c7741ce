"""A cluster in simulation: N engines (each its own KV pool, scheduler and policy stack) behind a
router, on one virtual clock.

Requests arrive in time order; the router (`route` hook) picks a replica at the arrival, and the
replicas step in time order: the replica whose clock is earliest steps next, once every request
that arrived by then is routed. A replica's clock only moves by its own steps and idling, exactly
as in `experiments.runner.replay`, so each replica's result is that of an engine replayed alone
on the requests routed to it (tests/test_cluster.py checks it document for document).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import RequestRefused
from ..experiments.runner import GC_EVERY_STEPS, result_of
from ..results.collector import MetricsCollector
from ..results.summaries import summarize
from ..step.engine import Engine
from ..workloads.build import Workload
from .router import DEFAULT_ROUTER, Router, make_router
from .view import Outstanding, Refuse, ReplicaView, RouteRequest

DEFAULT_POOL = "default"


class Replica:
    """One engine of the cluster with the router's view of it and what was routed to it."""

    __slots__ = ("engine", "executor", "idle", "outstanding", "parked", "routed", "seen", "view")

    def __init__(self, index: int, name: str, pool: str, engine: Engine) -> None:
        self.engine = engine
        self.executor = engine.executor
        self.outstanding = Outstanding()
        policy = "+".join([engine.config.policy, *engine.config.plugins])
        self.view = ReplicaView(index, name, pool, policy, engine, self.outstanding)
        self.seen = 0  # records already read (requests ended)
        self.routed = 0
        self.parked = False  # its last step scheduled nothing: it waits for a wake-up or a request
        self.idle = 0


def replica_names(replicas: int, pools: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """(name, pool) of each replica: `replicas` in the default pool, or `pools` (pool -> count) in
    their order, named `<pool>-<i>` (`r<i>` in the default pool)."""
    if not pools:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        return [(f"r{i}", DEFAULT_POOL) for i in range(replicas)]
    out = []
    for pool, count in pools.items():
        if count < 1:
            raise ValueError(f"pool {pool!r}: replicas must be >= 1, got {count}")
        out += [(f"{pool}-{i}", pool) for i in range(count)]
    return out


def run_cluster(
    workload: Workload,
    config: EngineConfig,
    make_executor: Callable[[], Any],
    *,
    replicas: int = 1,
    pools: dict[str, int] | None = None,
    router: Router | str = DEFAULT_ROUTER,
    router_options: dict[str, Any] | None = None,
    plugins: Callable[[int], list[Any]] | None = None,
    oracle_lengths: bool = False,
    vocab_size: int = 32000,
    window_s: float = 60.0,
    max_idle_steps: int = 1000,
) -> tuple[dict[str, Any], list[Engine]]:
    """Replay `workload` on a simulated cluster; returns the result document and the engines.

    `make_executor()` builds one replica's executor (each has its own clock); `plugins(i)` the
    extra plugin objects of replica `i`. The document is the cluster-wide one of
    `runner.result_of` (every replica's requests and steps pooled; `kv_peak_blocks` is the sum of
    the replicas' peaks), with `cluster` (`replicas`, `router`, `refused`), `replicas` (per
    replica: `index`, `name`, `pool`, `routed` and its `summary`) and, with `pools`, `pools`
    (pool -> summary over its replicas) added. With one replica the rest of the document is the
    one `runner.run_workload` gives."""
    router_name = router if isinstance(router, str) else "+".join(router.names)
    if isinstance(router, str):
        router = make_router(router, router_options)
    reps = [
        Replica(i, name, pool, Engine(config, make_executor(), plugins=plugins(i) if plugins else (),
                                      retain_finished=False))
        for i, (name, pool) in enumerate(replica_names(replicas, pools))
    ]
    refused = MetricsCollector(config.max_num_seqs)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        wall = _loop(workload.items, reps, router, refused, vocab_size, oracle_lengths, max_idle_steps)
    finally:
        if gc_was_enabled:
            gc.enable()
    return cluster_document(reps, refused, workload, wall, router_name, bool(pools), oracle_lengths, window_s), [
        r.engine for r in reps
    ]


def _loop(items: list, reps: list[Replica], router: Router, refused: MetricsCollector, vocab_size: int,
          oracle: bool, max_idle_steps: int) -> float:
    views = tuple(r.view for r in reps)
    total, i, countdown = len(items), 0, GC_EVERY_STEPS
    wall = time.perf_counter()
    while True:
        nxt, t_min = None, math.inf  # the replica that steps next, and its clock
        for r in reps:
            if r.parked:
                t = _wake_time(r.engine)
                if t is None:
                    t = math.inf if i < total else r.executor.now()
            elif r.engine.has_unfinished():
                t = r.executor.now()
            else:
                continue
            if t < t_min:
                nxt, t_min = r, t
        if i < total and items[i].arrival_s <= t_min:
            _arrive(items[i], str(i), reps, views, router, refused, vocab_size, oracle)
            i += 1
            continue
        if nxt is None:
            break
        engine = nxt.engine
        if nxt.parked:
            nxt.parked = False
            engine.idle(None)
        engine.advance()
        records = engine.metrics.requests
        if len(records) > nxt.seen:
            out = nxt.outstanding
            for rec in records[nxt.seen:]:
                out.end(rec.id.partition("#")[0])
            nxt.seen = len(records)
        countdown -= 1
        if not countdown:
            gc.collect(1)
            countdown = GC_EVERY_STEPS
        if engine.last_step_progressed:
            nxt.idle = 0
        else:
            if engine.last_plan_empty:
                nxt.parked = True
            if i == total:
                nxt.idle += 1
                if engine.is_stalled(nxt.idle, max_idle_steps):
                    raise engine.stalled(nxt.idle)
    return time.perf_counter() - wall


def _wake_time(engine: Engine) -> float | None:
    """When a replica whose last step scheduled nothing steps again without a new request: the
    time `Engine.idle` would move its clock to (None: not before a request arrives)."""
    now = engine.executor.now()
    pending = engine._pending[0][0] if engine._pending else None
    ahead = [t for t in (engine.scheduler.ctx.wakeup, pending) if t is not None and t > now]
    return min(ahead) if ahead else None


def _arrive(item: Any, rid: str, reps: list[Replica], views: tuple, router: Router, refused: MetricsCollector,
            vocab_size: int, oracle: bool) -> None:
    """Route one arriving request and submit it to its replica (as `runner.replay` would have)."""
    data = item.request_data(rid, vocab_size=vocab_size, oracle=oracle)
    prompt = data["prompt_token_ids"]
    request = RouteRequest(rid, item.arrival_s, prompt, item.output_len, item.tenant, item.priority)
    choice = router.choose(request, views)
    if isinstance(choice, Refuse):
        refused.record_rejected(rid, item.tenant, item.priority, item.arrival_s, len(prompt),
                                f"router: {choice.reason}")
        return
    r = reps[choice]
    r.routed += 1
    engine = r.engine
    if r.parked:  # as `replay`: an engine whose step scheduled nothing idles to its next arrival
        r.parked = False
        engine.idle(item.arrival_s)
    elif not engine.has_unfinished():
        r.executor.idle_until(item.arrival_s)
    problem = engine.length_problem(item.prompt_len, item.output_len)
    if problem is not None:
        engine.reject({"request_id": rid, "tenant": item.tenant, "priority": item.priority,
                       "arrival_time": item.arrival_s, "prompt_token_ids": range(item.prompt_len)}, problem)
        return
    try:
        engine.add_request(data)
    except (ValidationError, RequestRefused) as exc:
        engine.reject(data, exc)
        return
    r.outstanding.add(rid, item.prompt_len + item.output_len)


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
    return SimpleNamespace(max_num_seqs=first.max_num_seqs, requests=requests, steps=steps,
                           running_by_tenant=running)


def cluster_document(reps: list[Replica], refused: MetricsCollector, workload: Workload, wall_s: float,
                     router: str, with_pools: bool, oracle_lengths: bool, window_s: float) -> dict[str, Any]:
    """The cluster's result document (see `run_cluster`)."""
    engines = [r.engine for r in reps]
    first = engines[0]
    proxy = SimpleNamespace(
        config=first.config, plugins=first.plugins, executor=first.executor, metrics=_pooled(engines, refused),
        pool=SimpleNamespace(peak_used_blocks=sum(e.pool.peak_used_blocks for e in engines)),
    )
    doc = result_of(proxy, workload, wall_s, oracle_lengths=oracle_lengths, window_s=window_s)
    kw = {"max_num_seqs": first.config.max_num_seqs, "wall_s": wall_s}
    doc["cluster"] = {"replicas": len(reps), "router": router, "refused": len(refused.requests)}
    doc["replicas"] = [
        {"index": r.view.index, "name": r.view.name, "pool": r.view.pool, "routed": r.routed,
         "summary": summarize(r.engine.metrics.requests, r.engine.metrics.steps,
                              kv_peak_blocks=r.engine.pool.peak_used_blocks, **kw)}
        for r in reps
    ]
    if with_pools:
        doc["pools"] = {}
        for pool in dict.fromkeys(r.view.pool for r in reps):
            members = [r.engine for r in reps if r.view.pool == pool]
            m = _pooled(members)
            doc["pools"][pool] = summarize(m.requests, m.steps, kv_peak_blocks=sum(
                e.pool.peak_used_blocks for e in members), **kw)
    from ..results.document import _jsonable

    return _jsonable(doc)
