"""A simulated canary's twins: the baseline engine replayed on exactly the requests each canary
replica served, so that a canary is compared with the baseline request by request.

Compared with the baseline replicas, a canary's arm meets other requests: which requests each arm
got (their sizes, and the queues a few large ones build on one replica) moves its latencies as much
as a policy does, and a comparison of the two arms' own requests (what a serving front can do,
`metroline.core.results.canary.compare_arms` on its rows) follows the split as well as the engine
(issue 26: an A/A canary of identical engines was called different in 12.9% of its per-metric
verdicts at 5% nominal). In simulation the split can be taken out: each canary replica gets a twin,
an engine with the baseline arm's config, policy stack and executor, that replays the requests
routed to that replica at their arrival times (a replica's result is that of its engine replayed
alone on what was routed to it: `metroline.core.cluster.simulation`). The canary and its twin then
differ only in their engines, and the comparison's window bootstrap resamples the same requests
for both.

With several canary replicas each twin replays its replica's share: the routing among them, which
the canary's own state steered, is held fixed. A twin's requests keep their cluster ids, so the
pairing is by request id. Twins serve nothing in the cluster: they appear only in the canary's
comparison (`cluster_document`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..experiments.runner import submit
from ..step.driving import GC_EVERY_STEPS, Driver, drive
from ..step.engine import Engine
from .spec import BASELINE, CANARY, ClusterSpec, ReplicaPlan


def canary_twins(spec: ClusterSpec, reps: list[Any], items: list[Any], build: Callable[[ReplicaPlan], Any],
                 plugins: Callable[[int], list[Any]] | None, vocab_size: int, oracle: bool,
                 until: float = math.inf, max_idle_steps: int = 1000) -> dict[str, list[Engine]]:
    """pool -> the twin engines of its canary replicas (see the module docstring), for the pools of
    `spec` whose canary has `twin` set; `reps` are the cluster's replicas after the run
    (`metroline.core.cluster.simulation.Replica`, with `served`: the indexes in `items` routed to
    each), `build(plan)` makes an executor, `plugins(i)` replica i's extra plugins."""
    twins: dict[str, list[Engine]] = {}
    for rep in reps:
        if rep.plan.arm != CANARY or not spec.pool_specs[rep.plan.pool].canary.twin:
            continue
        base = next(r.plan for r in reps if r.plan.pool == rep.plan.pool and r.plan.arm == BASELINE)
        engine = Engine(base.config, build(base), plugins=plugins(base.index) if plugins else (), retain_finished=False)
        replay_share(engine, [items[i] for i in rep.served], [str(i) for i in rep.served], vocab_size, oracle, until,
                     max_idle_steps)
        twins.setdefault(rep.plan.pool, []).append(engine)
    return twins


def replay_share(engine: Engine, items: list[Any], ids: list[str], vocab_size: int, oracle: bool, until: float,
                 max_idle_steps: int) -> None:
    """Replay `items` (in arrival order) on `engine` under their request `ids`, through the one
    driving loop, as the cluster submitted them."""
    driver = Driver(engine, max_idle_steps)

    def deliver(j: int) -> None:
        driver.before_arrival(items[j].arrival_s)
        submit(engine, items[j], ids[j], vocab_size, oracle)

    for _ in drive([driver], [it.arrival_s for it in items], deliver, until=until, gc_every=GC_EVERY_STEPS):
        pass
