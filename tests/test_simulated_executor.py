"""The simulated executor: virtual clock, idle jumps, counters, and no heavy imports."""

from __future__ import annotations

import subprocess
import sys

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence
from metroline.core.step.plan import StepPlan, StepResult
from metroline.executors.base import Executor, count_block_ops
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT


def decode_plan(step: int, block_ops=()) -> StepPlan:
    plan = StepPlan(step, 16)
    s = Sequence(f"r{step}", [1, 2, 3], SamplingParams(), 0.0)
    s.num_computed_tokens = 2
    plan.scheduled[s] = 1
    plan.num_prefill_tokens, plan.num_context_tokens = 1, 3
    plan.block_ops = list(block_ops)
    return plan


def test_is_an_executor():
    ex = SimulatedExecutor(make_cost_model("steps"))
    assert isinstance(ex, Executor) and ex.name == "sim"


def test_steps_advance_the_clock_exactly():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.25))
    for i in range(10):
        result = ex.execute(decode_plan(i))
        assert isinstance(result, StepResult) and result.logits is None
        assert result.time == ex.now() == 0.25 * (i + 1)
    assert ex.total_steps == 10 and ex.busy_time == 2.5


def test_empty_step_costs_nothing():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.25), start_time=3.0)
    assert ex.execute(StepPlan(0, 16)).time == 3.0 == ex.now()
    assert ex.busy_time == 0.0


def test_linear_clock_is_the_sum_of_step_times():
    cm = make_cost_model("linear", per_step=0.5, per_prefill_token=0.25, per_kv_token=0.125,
                         per_copy_block=1.0, per_swap_block=2.0)
    ex = SimulatedExecutor(cm, start_time=1.0)
    ex.execute(decode_plan(0))
    assert ex.now() == 1.0 + 0.5 + 0.25 + 0.375
    ex.execute(decode_plan(1, [(COPY, 1, 2), (SWAP_OUT, 3, 0)]))
    assert ex.now() == 1.0 + 2 * 1.125 + 3.0


def test_idle_until_only_moves_forward():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.5))
    ex.idle_until(4.0)
    assert ex.now() == 4.0
    ex.idle_until(2.0)
    assert ex.now() == 4.0
    ex.execute(decode_plan(0))
    ex.idle_until(4.5)
    assert ex.now() == 4.5
    assert ex.stats.idle_time == 4.0 and ex.busy_time == 0.5


def test_block_op_counts_and_describe():
    ex = SimulatedExecutor(make_cost_model("steps", step_time=0.5))
    ops = [(COPY, 1, 2), (SWAP_OUT, 3, 0), (SWAP_OUT, 4, 1), (SWAP_IN, 0, 5)]
    assert count_block_ops(ops) == (1, 2, 1) and count_block_ops([]) == (0, 0, 0)
    ex.execute(decode_plan(0, ops))
    ex.execute(decode_plan(1, [(COPY, 5, 6)]))
    ex.idle_until(2.0)
    assert ex.describe() == {
        "name": "sim",
        "cost_model": {"name": "steps", "step_time": 0.5},
        "start_time": 0.0,
        "total_steps": 2,
        "busy_time": 1.0,
        "idle_time": 1.0,
        "block_ops": {"copy": 2, "swap_out": 2, "swap_in": 1},
    }


def test_simulated_path_imports_no_torch():
    code = (
        "import sys; import metroline.executors.simulated, metroline.executors.cost_models;"
        "bad = [m for m in ('torch', 'transformers', 'numpy', 'triton') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
