"""The one driving loop (`metroline.core.step.driving`): `Engine.stream`, a replay and the cluster
simulation step an engine the same way, find the same stall at the same step, and give the
garbage collector back however they end."""

from __future__ import annotations

import gc

import pytest

from metroline.api import Candidates, NoProgressError, hookimpl
from metroline.core.cluster.simulation import run_cluster
from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import replay
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.step.driving import Driver, drive
from metroline.core.step.engine import Engine
from metroline.core.workloads.items import Workload, WorkloadItem
from metroline.executors.registry import make_executor

MAX_IDLE = 7


class AdmitsNothing:
    """A policy that offers no candidate: nothing is ever served, and the core's rescue does not
    step in (nothing was offered)."""

    name = "admits_nothing"

    @hookimpl
    def admission(self, ctx):
        return Candidates([])


def one_request() -> Workload:
    return Workload("one", [WorkloadItem(0.5, (("p", 16),), 4)])


def test_stream_replay_and_cluster_find_the_same_stall_at_the_same_step():
    config = EngineConfig(policy="fcfs")
    streamed = Engine(config, plugins=[AdmitsNothing()])
    streamed.add_request(Request(request_id="0", prompt_token_ids=list(range(16)), arrival_time=0.5,
                                 sampling=SamplingParams(max_new_tokens=4)))
    with pytest.raises(NoProgressError) as by_stream:
        list(streamed.stream(max_idle_steps=MAX_IDLE))
    replayed = Engine(config, plugins=[AdmitsNothing()], retain_finished=False)
    with pytest.raises(NoProgressError) as by_replay:
        replay(replayed, one_request(), max_idle_steps=MAX_IDLE)
    engines = []

    def plugins(i):
        engines.append(i)
        return [AdmitsNothing()]

    with pytest.raises(NoProgressError) as by_cluster:
        run_cluster(one_request(), config, lambda: make_executor("sim"), replicas=1, plugins=plugins,
                    max_idle_steps=MAX_IDLE)
    assert engines == [0]
    # MAX_IDLE empty steps (the stream's first one, before the request's arrival at 0.5, too: the
    # engine then idles to it, as the replay's clock moves to it before submitting it)
    assert streamed.scheduler.ctx.step == replayed.scheduler.ctx.step == MAX_IDLE
    assert str(by_stream.value) == str(by_replay.value) == str(by_cluster.value)
    assert f"{MAX_IDLE} steps scheduled nothing" in str(by_replay.value)


def test_the_collector_is_back_on_after_a_replay_that_raised():
    assert gc.isenabled()
    engine = Engine(EngineConfig(policy="fcfs"), plugins=[AdmitsNothing()])
    with pytest.raises(NoProgressError):
        replay(engine, one_request(), max_idle_steps=MAX_IDLE)
    assert gc.isenabled()


def test_engines_step_in_the_order_of_their_clocks():
    """Two engines with their own clocks: whichever is earliest steps next (a step of the default
    cost model takes one unit), so their steps interleave by time, never two ahead."""
    engines = []
    for i in range(2):
        e = Engine(EngineConfig(policy="fcfs"))
        e.add_request(Request(request_id=str(i), prompt_token_ids=list(range(8)),
                              sampling=SamplingParams(max_new_tokens=6 + 3 * i)))
        engines.append(e)
    drivers = [Driver(e) for e in engines]
    order = []
    for d in drive(drivers):
        order.append(drivers.index(d))
        clocks = [e.executor.now() for e in engines if e.has_unfinished()]
        assert max(clocks) - min(clocks) <= 1 + 1e-9 if len(clocks) == 2 else True
    assert not any(e.has_unfinished() for e in engines)
    assert order.count(0) == engines[0].scheduler.ctx.step and order.count(1) == engines[1].scheduler.ctx.step
    assert order.count(1) > order.count(0)  # the longer request took more steps


def test_with_gc_every_the_collector_is_off_and_runs_every_that_many_steps(monkeypatch):
    engine = Engine(EngineConfig(policy="fcfs"))
    engine.add_request(Request(request_id="0", prompt_token_ids=list(range(8)),
                               sampling=SamplingParams(max_new_tokens=10)))
    collected = []  # (steps so far, whether automatic collection was on) at each collection
    steps = [0]
    monkeypatch.setattr(gc, "collect", lambda *generation: collected.append((steps[0], gc.isenabled())))
    for _ in drive([Driver(engine)], gc_every=3):
        steps[0] += 1
        assert not gc.isenabled()
    assert gc.isenabled()
    assert steps[0] == engine.scheduler.ctx.step == 10  # one prefill step with the first token, 9 decodes
    # a collection after steps 3, 6 and 9 (before the step is yielded), automatic passes off
    assert collected == [(2, False), (5, False), (8, False)]


def test_a_collector_that_was_off_before_the_loop_stays_off_after_it():
    engine = Engine(EngineConfig(policy="fcfs"))
    engine.add_request(Request(request_id="0", prompt_token_ids=list(range(8)),
                               sampling=SamplingParams(max_new_tokens=2)))
    gc.disable()
    try:
        assert len(list(drive([Driver(engine)], gc_every=3))) == 2
        assert not gc.isenabled()
    finally:
        gc.enable()
