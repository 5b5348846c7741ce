"""The simulated cluster and the `route` hook (core/cluster/, policies/routing/)."""

from __future__ import annotations

import pytest
from test_routing import Nonsense  # a router that answers what it is given

from metroline.api import PluginError, Refuse
from metroline.core.cluster.router import Router
from metroline.core.cluster.simulation import run_cluster
from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.loader import ROUTERS
from metroline.core.workloads.build import build_workload
from metroline.core.workloads.items import Workload, WorkloadItem
from metroline.executors.registry import make_executor

CLUSTER_KEYS = ("wall_s", "cluster", "replicas", "pools")


def sim():
    return make_executor("sim")


def strip(doc):
    """The document without its wall-clock fields and the cluster's own sections."""
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in CLUSTER_KEYS}
    if isinstance(doc, list):
        return [strip(v) for v in doc]
    return doc


# --- one replica behind any router is today's engine (golden) ---------------------------------


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("workload,policy", [
    ("chat", "fcfs"), ("shared-prefix", "srpt"), ("mixed-64", "priority"), ("long-burst", "fcfs"),
])
def test_one_replica_behind_any_router_is_the_single_engine(router, workload, policy):
    wl = build_workload(workload, seed=3, max_requests=150)
    config = EngineConfig(policy=policy, num_blocks=384)
    single, _ = run_workload(wl, config, sim())
    doc, _ = run_cluster(wl, config, sim, replicas=1, router=router)
    assert strip(doc) == strip(single)
    assert {k: doc["cluster"][k] for k in ("replicas", "router", "refused")} == {
        "replicas": 1, "router": router, "refused": 0}
    assert doc["replicas"][0]["routed"] == len(wl)


# --- N replicas with round robin are N independent engines -----------------------------------


@pytest.mark.parametrize("policy", ["fcfs", "srpt"])
def test_round_robin_replicas_are_independent_engines(policy):
    wl = build_workload("chat", seed=5, max_requests=240, rate_scale=0.5)
    config = EngineConfig(policy=policy, num_blocks=128)
    n = 3
    doc, _ = run_cluster(wl, config, sim, replicas=n, router="round_robin")
    for j in range(n):
        share = Workload(wl.name, wl.items[j::n], wl.description, wl.params)
        alone, _ = run_workload(share, config, sim())
        assert strip(doc["replicas"][j]["summary"]) == strip(alone["summary"]), j
        assert doc["replicas"][j]["routed"] == len(share)
    assert doc["summary"]["requests"] == len(wl)




def test_a_router_that_raises_is_a_plugin_error_and_the_cluster_stops_with_it():
    wl = build_workload("chat", seed=1, max_requests=20)
    with pytest.raises(PluginError, match="route"):
        run_cluster(wl, EngineConfig(), sim, replicas=2, router=Router([("boom", Nonsense(KeyError("x")))]))


def test_refusals_are_rejected_requests():
    wl = build_workload("chat", seed=1, max_requests=30)
    doc, _ = run_cluster(wl, EngineConfig(), sim, replicas=2, router=Router([("no", Nonsense(Refuse("full")))]))
    assert doc["cluster"]["refused"] == 30 and doc["summary"]["rejected"] == 30


# --- prefix-aware routing finds the caches; progress holds on every replica -------------------------


def shared_prefix_workload(prefixes=12, per_prefix=25, prefix_len=1024, seed=0):
    import random

    rng = random.Random(seed)
    items = []
    for k in range(prefixes * per_prefix):
        p = rng.randrange(prefixes)
        items.append(WorkloadItem(k * 0.02, ((f"sys{p}", prefix_len), (f"user{k}", 64)), 32))
    return Workload("prefixes", items)


def test_prefix_aware_hits_the_prefix_cache_more_than_round_robin():
    wl = shared_prefix_workload()
    config = EngineConfig(policy="fcfs", num_blocks=400)  # about 5 prefixes per replica's pool
    rates = {}
    for router in ("round_robin", "prefix_aware"):
        doc, _ = run_cluster(wl, config, sim, replicas=4, router=router)
        rates[router] = doc["summary"]["prefix_hit_rate"]
        assert doc["summary"]["completed"] == len(wl)
    assert rates["prefix_aware"] > rates["round_robin"] + 0.05, rates


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_request_finishes_on_every_replica_under_memory_pressure(router):
    wl = build_workload("chat", seed=2, max_requests=300)
    config = EngineConfig(policy="srpt", num_blocks=96)
    doc, engines = run_cluster(wl, config, sim, pools={"default": 2, "long": 1}, router=router)
    assert sum(r["routed"] for r in doc["replicas"]) == len(wl)
    for r, engine in zip(doc["replicas"], engines):
        s = r["summary"]
        assert s["completed"] + s["rejected"] == r["routed"], r["name"]
        assert not engine.has_unfinished()
        assert engine.pool.num_used_blocks() == 0
    assert set(doc["pools"]) == {"default", "long"}
    assert doc["summary"]["completed"] + doc["summary"]["rejected"] == len(wl)


def test_an_unknown_router_is_named_with_the_shipped_ones():
    from metroline.core.cluster.router import load_router
    from metroline.core.errors import PluginLoadError

    with pytest.raises(PluginLoadError, match="unknown router 'round_robbin'; did you mean 'round_robin'"):
        load_router("round_robbin")
