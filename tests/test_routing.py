"""The `route` hook and the shipped routers (core/cluster/router.py, policies/routing/)."""

from __future__ import annotations

import pytest
from metroline.api import PluginError, Refuse, ReplicaView, RouteRequest, hookimpl
from metroline.core.cluster.router import Router, load_router, make_router

# --- each shipped router's choice on hand-built views ----------------------------------------


def req(prompt_len=100, rid="x"):
    return RouteRequest(rid, 0.0, list(range(prompt_len)), 10)


def views(*loads, hits=None, pools=None):
    return tuple(
        ReplicaView.of(i, outstanding={f"q{k}": t for k, t in enumerate(load)},
                       prefix_hit=(hits or [0] * len(loads))[i], pool=(pools or ["default"] * len(loads))[i])
        for i, load in enumerate(loads)
    )


def test_round_robin_cycles():
    r = make_router("round_robin")
    vs = views([], [], [])
    assert [r.choose(req(), vs) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_tokens_picks_the_least_loaded_lowest_index_on_ties():
    r = make_router("least_outstanding_tokens")
    assert r.choose(req(), views([50], [10, 10], [5], [30])) == 2
    assert r.choose(req(), views([5], [5], [5])) == 0


def test_power_of_two_is_seeded_and_picks_the_lighter_of_its_two():
    vs = views([100], [0], [50], [10])
    a = [make_router("power_of_two", {"seed": 7}).choose(req(), vs) for _ in range(3)]
    r1, r2 = make_router("power_of_two", {"seed": 7}), make_router("power_of_two", {"seed": 7})
    assert [r1.choose(req(), vs) for _ in range(20)] == [r2.choose(req(), vs) for _ in range(20)]
    assert a == [a[0]] * 3
    assert all(make_router("power_of_two", {"seed": s}).choose(req(), vs) != 0 for s in range(30))
    assert make_router("power_of_two").choose(req(), views([1])) == 0


def test_prefix_aware_longest_hit_within_the_load_bound():
    r = make_router("prefix_aware", {"load_bound": 2})
    # longest hit on replica 1, its load 3 <= least (1) + bound (2): it wins
    assert r.choose(req(), views([1, 1, 1], [1, 1, 1], [1], hits=[16, 64, 32])) == 1
    # replica 1 is 4 requests above the least loaded: the longest hit among the others (2)
    assert r.choose(req(), views([1] * 2, [1] * 6, [1], hits=[16, 64, 32])) == 2
    # no hit anywhere: the least loaded
    assert r.choose(req(), views([1] * 2, [1], [1] * 3)) == 1
    # equal hits: the lower load
    assert r.choose(req(), views([1] * 2, [1], hits=[32, 32])) == 1


def test_prefix_aware_with_a_load_bound_of_zero_follows_hits_only_among_the_least_loaded():
    """`load_bound` 0 is valid: the longest hit wins only on a replica as lightly loaded as the
    least loaded one; a negative bound is refused."""
    r = make_router("prefix_aware", {"load_bound": 0})
    assert r.choose(req(), views([1], [1], hits=[16, 64])) == 1  # equal loads: the longer hit
    assert r.choose(req(), views([1], [1, 1], hits=[16, 64])) == 0  # one more request: over the bound
    with pytest.raises(ValueError, match="load_bound must be >= 0"):
        make_router("prefix_aware", {"load_bound": -1})


def test_length_pools_sends_long_prompts_to_the_long_pool():
    r = make_router("length_pools", {"threshold": 1000})
    vs = views([5], [1], [9], [0], pools=["short", "short", "long", "long"])
    assert r.choose(req(200), vs) == 1
    assert r.choose(req(1001), vs) == 3
    assert r.choose(req(1000), vs) == 1
    # the first replica of the pool stays the choice when it is the least loaded, and on a tie
    assert r.choose(req(200), views([0], [5], [0], pools=["short", "short", "long"])) == 0
    assert r.choose(req(200), views([9], [3], [3], [0], pools=["short", "short", "short", "long"])) == 1
    # no long pool: the least loaded of all; strict: refused with a reason
    flat = views([5], [1])
    assert r.choose(req(5000), flat) == 1
    assert r.choose(req(5000), views([1], [5], [3])) == 0
    assert r.choose(req(5000), views([5], [2], [2])) == 1
    refusal = make_router("length_pools", {"threshold": 1000, "strict": True}).choose(req(5000), flat)
    assert isinstance(refusal, Refuse) and "long" in refusal.reason


# --- bad answers name the plugin and the hook -----------------------------------------------------


class Nonsense:
    name = "nonsense"

    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def route(self, request, replicas):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer", [4, -1, 1.0, True, "nowhere", [0], Refuse("")])
def test_a_nonsense_answer_is_a_plugin_error_naming_plugin_and_route(answer):
    router = Router([("nonsense", Nonsense(answer))])
    with pytest.raises(PluginError) as info:
        router.choose(req(), views([], [], []))
    assert info.value.plugin == "nonsense" and info.value.hook == "route"
    assert "'nonsense'" in str(info.value) and "'route'" in str(info.value)


def test_load_router_refuses_a_plugin_without_route():
    from metroline.core.errors import PluginLoadError

    with pytest.raises(PluginLoadError, match="route"):
        load_router("fcfs")


def test_a_router_may_answer_a_replica_name():
    assert Router([("n", Nonsense("r1"))]).choose(req(), views([], [])) == 1
