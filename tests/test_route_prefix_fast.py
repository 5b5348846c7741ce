"""The fast paths of the router's prefix lookups give the plain answers: `cached_blocks` (its memo
of walked blocks, `at_least`) against the plain walk and the pool's own `lookup`, a workload
prompt's shared chain against hashing it, and `prefix_aware` against its plain loop, on random
workloads through real engines (small pools: evictions, duplicates, preemption)."""

from __future__ import annotations

import random

from metroline.core.cluster.router import make_router
from metroline.core.cluster.view import Outstanding, ReplicaView, RouteRequest
from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.core.workloads.items import PromptTokens, WorkloadItem
from metroline.kv_backends.prefix_index import block_chain
from metroline.kv_backends.prefix_keys import same_prefix


def plain_cached_blocks(pool, chain):
    """`cached_blocks` as it was: walk every block from the root."""
    index, keys = pool._index, pool._keys
    parent, n = None, 0
    for h, tokens in chain:
        b = index.get(h)
        if b is None:
            break
        key = keys[b]
        if key.parent is not parent and not same_prefix(key.parent, parent):
            break
        parent, n = key, n + 1
    while parent is not None and (parent.tokens != chain[n - 1][1] or parent.extra_key is not None):
        parent, n = parent.parent, n - 1
    return n


def plain_prefix_aware(request, replicas, load_bound=8):
    loads = [r.outstanding_requests for r in replicas]
    least = min(range(len(replicas)), key=loads.__getitem__)
    best, best_hit = least, 0
    for r in replicas:
        if loads[r.index] > loads[least] + load_bound:
            continue
        hit = r.prefix_hit(request)
        if hit > best_hit or (hit == best_hit and hit and loads[r.index] < loads[best]):
            best, best_hit = r.index, hit
    return best


def item(rng, t):
    segs = [(f"sys{rng.randrange(3)}", rng.choice([16, 40, 64, 100]))]
    for _ in range(rng.randrange(3)):
        segs.append((f"doc{rng.randrange(4)}", rng.randrange(1, 50)))
    segs.append((f"u{rng.randrange(10**9)}", rng.randrange(1, 40)))
    return WorkloadItem(t, tuple(segs), rng.randrange(1, 12))


def test_prompt_tokens_chain_is_the_hashed_chain():
    rng = random.Random(1)
    for _ in range(300):
        it = item(rng, 0.0)
        p = it.prompt_token_ids()
        assert isinstance(p, PromptTokens) and list(p) == p
        for bs in (1, 4, 16):
            for max_tokens in (len(p) - 1, len(p), rng.randrange(len(p) + 1)):
                assert p.block_chain(bs, max_tokens) == block_chain(list(p), bs, max_tokens)
    p = item(rng, 0.0).prompt_token_ids()
    p[3] += 1  # changed in place: hashed as it is
    assert p.block_chain(4, len(p) - 1) == block_chain(list(p), 4, len(p) - 1)


def test_fast_lookups_and_router_match_the_plain_ones_on_random_workloads():
    rng = random.Random(7)
    fast, plain = make_router("prefix_aware", {"load_bound": 2}), None
    for trial in range(3):
        engines = [Engine(EngineConfig(num_blocks=rng.choice([80, 160]), block_size=rng.choice([4, 8])),
                          "sim", retain_finished=False) for _ in range(4)]
        outs = [Outstanding() for _ in engines]
        views = tuple(ReplicaView(i, f"r{i}", "default", "fcfs", e, o) for i, (e, o) in enumerate(zip(engines, outs)))
        checked = 0
        for k in range(120):
            it = item(rng, 0.0)
            prompt = it.prompt_token_ids()
            request = RouteRequest(f"{trial}-{k}", it.arrival_s, prompt, it.output_len)
            for v in views:
                pool = v._engine.pool
                chain = block_chain(list(prompt), pool.block_size, len(prompt) - 1)
                want = plain_cached_blocks(pool, chain)
                assert pool.cached_blocks(chain) == want
                assert v.prefix_hit(request) == want * pool.block_size
                hit = pool.lookup(prompt, max_tokens=len(prompt) - 1)  # the engine's own, verified
                assert want == hit.num_tokens // pool.block_size
                for at_least in range(len(chain) + 2):
                    assert pool.cached_blocks(chain, at_least) == (want if want >= at_least else 0)
                checked += want > 0
            choice = fast.choose(request, views)
            assert choice == plain_prefix_aware(request, views, 2)
            outs[choice].add(request.request_id, 1)
            if rng.random() < 0.3:
                outs[rng.randrange(4)].clear()
            # every request fits the smallest pool (at most 100 + 2 x 49 + 39 prompt tokens and 11
            # output tokens, of 80 x 4): the routed engine must take it; an error fails the test
            engines[choice].add_request(it.request_data(request.request_id))
            assert engines[choice].has_unfinished()
            for e in engines:
                for _ in range(rng.randrange(4)):
                    if e.has_unfinished():
                        e.step()
        assert checked > 20
        assert sum(e.pool._unindexed > 0 for e in engines) >= 2  # evictions happened


def test_a_view_with_its_own_prefix_hit_answers_at_least_through_it():
    class Estimated(ReplicaView):
        __slots__ = ()

        def prefix_hit(self, request):
            return 48

    view = Estimated(0, "r0", "default", "?", None, Outstanding())
    request = RouteRequest("a", 0.0, list(range(100)), 4)
    assert [view.prefix_hit_at_least(request, t) for t in (0, 1, 48, 49)] == [48, 48, 48, 0]
    fixed = ReplicaView.of(0, prefix_hit=32)
    assert fixed.prefix_hit_at_least(request, 33) == 0 and fixed.prefix_hit_at_least(request, 32) == 32
