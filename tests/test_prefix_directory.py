"""The cluster's prefix directory (`metroline.core.cluster.prefix_directory`) and `prefix_aware`
over it: its binary search against a plain walk of what it holds, through rotations; the router
against the per-replica walk over the same estimates; what the estimate promises (a repeated
prompt goes where it went while within the load bound, another tenant's copy learns nothing, the
load bound holds); the simulated cluster records what it routes."""

from __future__ import annotations

import random

import pytest
from test_route_prefix_fast import plain_prefix_aware  # the per-replica walk, as the router was

from metroline.api import PrefixDirectory, ReplicaView, RouteRequest
from metroline.core.cluster.router import make_router
from metroline.core.cluster.simulation import run_cluster
from metroline.core.cluster.view import Outstanding
from metroline.core.config import EngineConfig
from metroline.core.serving.remote_view import RemoteView, SaltedPrompt
from metroline.core.workloads.build import Workload
from metroline.core.workloads.items import WorkloadItem
from metroline.executors.registry import make_executor
from metroline.kv_backends.prefix_index import block_chain


def plain_hit(directory, chain, bit):
    """Blocks of `chain` held for `bit`, walked one by one from the first."""
    n = 0
    for h, _ in chain[:directory.max_blocks]:
        if not (directory._young.get(h, 0) | directory._old.get(h, 0)) & bit:
            break
        n += 1
    return n


def plain_longest(directory, chain, bits):
    hits = {b: plain_hit(directory, chain, b) for b in bits}
    top = max(hits.values(), default=0)
    return (top, sum(b for b, h in hits.items() if h == top)) if top else (0, 0)


def prompts(rng, count, vocab=50):
    """Prompts that share prefixes of varied lengths (a few roots, branches off each)."""
    roots = [[rng.randrange(vocab) for _ in range(rng.randrange(8, 90))] for _ in range(4)]
    out = []
    for _ in range(count):
        root = rng.choice(roots)
        out.append(root[:rng.randrange(len(root) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))])
    return out


@pytest.mark.parametrize("capacity", [64, 1 << 20])
def test_longest_is_the_plain_walk_through_rotations(capacity):
    rng = random.Random(capacity)
    d = PrefixDirectory(capacity, block_size=4, max_blocks=16)
    bits = [d.new_bit() for _ in range(5)]
    rotations_seen = set()
    for tokens in prompts(rng, 600):
        chain = block_chain(tokens, 4, len(tokens) - 1)
        among = sum(b for b in bits if rng.random() < 0.7)
        assert d.longest(chain, among) == plain_longest(d, chain, [b for b in bits if b & among])
        for b in bits:
            assert d.hit_blocks(chain, b) == plain_hit(d, chain, b)
        bit = rng.choice(bits)
        d.record(chain, bit)
        assert d.hit_blocks(chain, bit) == min(len(chain), 16)  # just routed: all of it held
        assert len(d) <= capacity + 2 * 16
        rotations_seen.add(d._rotations)
    assert (len(rotations_seen) > 5) == (capacity == 64)


def test_a_block_is_kept_for_a_generation_after_its_own():
    d = PrefixDirectory(capacity=16, block_size=1, max_blocks=64)  # a new generation every 8 blocks
    bit = d.new_bit()
    chains = [block_chain(list(range(100 * k, 100 * k + 5)), 1, 4) for k in range(4)]  # 4 blocks each
    d.record(chains[0], bit)
    d.record(chains[1], bit)  # 8 blocks: they become the old generation
    d.record(chains[2], bit)
    assert [d.hit_blocks(c, bit) for c in chains] == [4, 4, 4, 0]
    d.record(chains[0], bit)  # routed again: young again, which holds 8: a new generation
    assert [d.hit_blocks(c, bit) for c in chains] == [4, 0, 4, 0]  # chains[1] dropped
    d.record(chains[3], bit)
    assert [d.hit_blocks(c, bit) for c in chains] == [4, 0, 4, 4] and len(d) == 8 + 4


def test_a_retired_bit_comes_back_only_once_its_blocks_are_gone():
    d = PrefixDirectory(capacity=4, block_size=1)
    a, b = d.new_bit(), d.new_bit()
    chain = block_chain([1, 2, 3], 1, 2)
    d.record(chain, a)
    d.retire(a)
    assert d.new_bit() not in (a, b)
    for k in range(2):
        d.record(block_chain([50 + k, 60 + k, 70 + k], 1, 2), b)
    assert d.new_bit() == a and d.hit_blocks(chain, a) == 0


def front_views(n, directory=None):
    directory = directory or PrefixDirectory(1 << 16)
    views = tuple(RemoteView(i, f"r{i}", "default", prefix_directory=directory) for i in range(n))
    for v in views:
        v.update({"block_size": 4})
    return views


def test_the_router_over_the_directory_is_the_walk_over_each_views_estimate():
    rng = random.Random(3)
    views = front_views(6)
    for load_bound in (0, 2, 8):
        fast = make_router("prefix_aware", {"load_bound": load_bound})
        for k, tokens in enumerate(prompts(rng, 300)):
            # the live replicas in varied sets, indexed by their place (as the front shows them)
            live = tuple(v for v in views if rng.random() < 0.8) or views[:1]
            for i, v in enumerate(live):
                v.index = i
            request = RouteRequest(str(k), 0.0, SaltedPrompt(tokens, rng.choice(["alpha", "beta"])), 4)
            choice = fast.choose(request, live)
            assert choice == plain_prefix_aware(request, live, load_bound)
            loads = [v.outstanding_requests for v in live]
            hit = live[choice].prefix_hit(request)
            assert loads[choice] <= min(loads) + load_bound or not hit
            live[choice].routed(request)
            live[choice].outstanding.add(str(k), 1)
            for v in views:
                if v.outstanding and rng.random() < 0.3:
                    v.outstanding.end(next(iter(v.outstanding)))


def test_a_repeated_prompt_stays_while_within_the_bound_and_another_tenant_learns_nothing():
    views = front_views(4)
    router = make_router("prefix_aware", {"load_bound": 2})
    secret = list(range(1000, 1100))

    def route(tenant, tokens, rid):
        request = RouteRequest(rid, 0.0, SaltedPrompt(tokens, tenant), 8)
        choice = router.choose(request, views)
        views[choice].routed(request)
        views[choice].outstanding.add(rid, 1)
        return choice

    views[0].outstanding.add("busy", 1)  # alpha's prompt goes to the least loaded: r1
    assert route("alpha", secret, "a0") == 1
    # alpha again: r1, while its load is at most the least loaded's (r2, r3: 0) + 2
    assert [route("alpha", secret, f"a{k}") for k in range(1, 3)] == [1, 1]
    assert route("alpha", secret, "a3") == 2  # r1 has 3 > 0 + 2: the least loaded, lower index
    # beta's copy of alpha's prompt finds none of it: it goes where any new prompt of beta's would
    directory = views[0].prefix_directory
    chain = RouteRequest("b", 0.0, SaltedPrompt(secret, "beta"), 8).block_chain(4, directory.max_blocks)
    assert directory.longest(chain, 0b1111) == (0, 0)
    other = make_router("prefix_aware", {"load_bound": 2}).choose(
        RouteRequest("c", 0.0, SaltedPrompt(list(range(5000, 5100)), "beta"), 8), views)
    assert route("beta", secret, "b0") == other == 3


def test_views_without_one_shared_directory_are_asked_one_by_one():
    shared = front_views(2)
    alone = RemoteView(2, "r2", "default")  # its own directory
    alone.update({"block_size": 4})
    request = RouteRequest("x", 0.0, list(range(40)), 4)
    alone.routed(request)
    views = (*shared, alone)
    assert make_router("prefix_aware").choose(request, views) == 2
    fixed = (ReplicaView.of(0, prefix_hit=0), ReplicaView.of(1, prefix_hit=32))
    assert make_router("prefix_aware").choose(request, fixed) == 1
    # a view of an engine with the cluster's directory: `ask_replicas` asks its exact cache
    directory = PrefixDirectory(1024)
    engines = [ReplicaView(i, f"r{i}", "default", "fcfs", None, Outstanding(), directory, 1 << i) for i in range(2)]
    engines[1].routed(request)
    assert make_router("prefix_aware").choose(request, tuple(engines)) == 1
    # views of one directory without a distinct bit each: asked one by one, not misread
    same = tuple(RemoteView(i, f"r{i}", "default", prefix_directory=directory) for i in range(2))
    for v in same:
        v.prefix_bit = 1
    same[0].outstanding.add("q", 1)
    assert make_router("prefix_aware").choose(request, same) == plain_prefix_aware(request, same, 8)


def test_the_simulated_cluster_records_what_it_routes_and_keeps_a_prefix_on_its_replica():
    items = []
    for k in range(60):
        p = k % 3
        items.append(WorkloadItem(k * 0.05, ((f"sys{p}", 256), (f"user{k}", 32)), 8))
    wl = Workload("three-prefixes", items)
    config = EngineConfig(policy="fcfs", num_blocks=512)
    doc, engines = run_cluster(wl, config, lambda: make_executor("sim"), replicas=3, router="prefix_aware")
    assert doc["summary"]["completed"] == len(items)
    # each system prompt's requests stay on the replica its first went to (the loads stay within
    # the bound): the replicas' caches then hold each prefix once
    where = {}
    for i, engine in enumerate(engines):
        for rec in engine.metrics.requests:
            where.setdefault(int(rec.id.partition("#")[0]) % 3, set()).add(i)
    assert sorted(where) == [0, 1, 2] and all(len(replicas) == 1 for replicas in where.values()), where
    # so every request but the first of each prefix finds its 256 tokens cached (of 288)
    assert doc["summary"]["prefix_hit_rate"] == pytest.approx((len(items) - 3) * 256 / (len(items) * 288))
