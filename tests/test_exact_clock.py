"""The simulated clock is exact: under `steps` it reads whole multiples of the step time, and no
cost model accumulates float error."""

from __future__ import annotations

import math

from conftest import request

from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.core.step.plan import StepPlan
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor


def one_token_plan() -> StepPlan:
    plan = StepPlan(1, 16)
    plan.num_decode_tokens = 1
    return plan


def test_steps_clock_reads_exact_multiples_of_the_step_time():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.01))
    plan = one_token_plan()
    for n in range(1, 11):
        assert ex.execute(plan).time == n * 0.01
    assert ex.now() == 0.1  # adding 0.01 ten times gives 0.09999999999999999
    for _ in range(1_000_000 - 10):
        ex.execute(plan)
    assert ex.now() == 1_000_000 * 0.01 == 10_000.0
    assert ex.describe()["busy_time"] == 10_000.0


def test_after_an_idle_jump_the_steps_count_from_the_arrival():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.01))
    ex.idle_until(0.1)
    plan = one_token_plan()
    assert [ex.execute(plan).time for _ in range(3)] == [0.1 + 0.01, 0.1 + 2 * 0.01, 0.1 + 3 * 0.01]


class Varying:
    """A cost model whose step times are not representable sums (0.001 x (1 + step % 7))."""

    def __init__(self) -> None:
        self.n = 0

    def step_time(self, plan: StepPlan) -> float:
        self.n += 1
        return 0.001 * (1 + self.n % 7)

    def describe(self) -> dict:
        return {"name": "varying"}


def test_other_cost_models_sum_their_step_times_without_drift():
    ex = SimulatedExecutor(Varying())
    plan = one_token_plan()
    steps = 300_000
    for _ in range(steps):
        ex.execute(plan)
    exact = math.fsum(0.001 * (1 + n % 7) for n in range(1, steps + 1))
    assert ex.now() == exact
    naive = 0.0
    for n in range(1, steps + 1):
        naive += 0.001 * (1 + n % 7)
    assert naive != exact  # what a plain running sum would have read


def test_a_request_arriving_at_a_step_boundary_is_served_by_that_step():
    # a keeps the engine busy from 0; b arrives at 0.1 s, after exactly 10 steps of 0.01 s, and the
    # engine has a free slot and blocks for it: b is scheduled by the step starting at 0.1 s and
    # its first token comes one step later
    from metroline.core.experiments.runner import replay
    from metroline.core.workloads.build import Workload, WorkloadItem

    engine = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps", step_time=0.01)))
    replay(engine, Workload("w", [WorkloadItem(0.0, ((("a",), 8),), 30), WorkloadItem(0.1, ((("b",), 8),), 2)]))
    b = next(r for r in engine.metrics.requests if r.arrival_s == 0.1)
    assert b.first_token_s == 11 * 0.01 == 0.11
    assert b.first_token_s - b.arrival_s == 0.11 - 0.1  # one step: 0.01 s up to float subtraction
    assert round(b.first_token_s - b.arrival_s, 12) == 0.01


def test_a_request_arriving_at_0_1_on_a_free_engine_has_ttft_of_one_step():
    engine = Engine(EngineConfig(), SimulatedExecutor(make_cost_model("steps", step_time=0.01)))
    engine.executor.idle_until(0.1)
    engine.add_request(request("r", 8, max_new=3, arrival_time=0.1))
    engine.run()
    seq = engine.sequences("r")[0]
    assert seq.first_scheduled_time == 0.1 and seq.first_token_time == 0.11
    assert round(seq.first_token_time - seq.arrival_time, 12) == 0.01
    assert [round(t, 12) for t in seq.token_times] == [0.11, 0.12, 0.13]
