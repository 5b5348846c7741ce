"""auto_preemption: swap while few requests are swapped out, recompute beyond the cap."""

from __future__ import annotations

from collections import Counter

import pytest

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError
from metroline.core.experiments.runner import replay, run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.preemption import Preempt
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.requests.sequence import SeqState, Sequence
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import SyntheticSpec, Workload, WorkloadItem, generate, segment_tokens
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.auto_preemption import AutoPreemption


class Decisions:
    """An outer wrapper recording each answer of select_victim with the queue lengths it saw."""

    name = "decisions"

    def __init__(self) -> None:
        self.log: list[tuple[int, int, str]] = []

    @hookimpl(wrapper=True)
    def select_victim(self, ctx, requester, reason):
        answer = yield
        if answer is not None:
            self.log.append((len(ctx.swapped), len(ctx.running), answer.mode))
        return answer


def workload() -> Workload:
    spec = SyntheticSpec(num_requests=100, rate=200.0, prompt_len={"dist": "uniform", "low": 16, "high": 300},
                         output_len={"dist": "uniform", "low": 16, "high": 200}, seed=0)
    return Workload("auto", generate(spec, namespace="auto-test"))


def run(share: float, swap_space_blocks: int = 512) -> tuple[AutoPreemption, Decisions, dict]:
    spy = Decisions()
    cfg = EngineConfig(num_blocks=96, max_num_seqs=16, max_num_batched_tokens=256,
                       swap_space_blocks=swap_space_blocks, plugins=["auto_preemption"],
                       plugin_options={"auto_preemption": {"max_swapped_share": share}})
    doc, engine = run_workload(workload(), cfg, SimulatedExecutor(make_cost_model("steps")), plugins=[spy])
    assert doc["summary"]["completed"] == 100
    return engine.plugins.get("auto_preemption"), spy, doc


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 1.0])
def test_each_decision_follows_the_cap_on_a_synthetic_workload(share):
    auto, spy, doc = run(share)
    assert spy.log  # the pool is small enough that requests are preempted
    # each decision: swap exactly when fewer than share x running are swapped out
    assert all((mode == "swap") == (swapped < share * running) for swapped, running, mode in spy.log)
    decided = Counter(mode for *_, mode in spy.log)
    if share == 0.0:
        assert decided["swap"] == 0
    # three accounts agree: the decisions, the plugin's counters (the host space is large: every
    # swap decision ended swapped) and the run's preemptions
    assert (auto.swaps, auto.recomputes) == (decided["swap"], decided["recompute"])
    assert doc["summary"]["preemptions"] == len(spy.log)


class Victims:
    """An outer wrapper recording each answer of select_victim: (step, victim id, mode, swapped,
    running)."""

    name = "victims"

    def __init__(self) -> None:
        self.log: list[tuple[int, str, str, int, int]] = []

    @hookimpl(wrapper=True)
    def select_victim(self, ctx, requester, reason):
        answer = yield
        if answer is not None:
            self.log.append((ctx.step, answer.seq.request_id, answer.mode, len(ctx.swapped), len(ctx.running)))
        return answer


# Four requests at t = 0 (ids "0".."3"), each a 16-token prompt (one block) and 64 outputs, in a
# 10-block pool: all four are admitted at step 1 and decode in lockstep, step k computing
# position 14 + k. At step 18 (position 32) each needs a 3rd block: "0" and "1" take the last two,
# "2" preempts "3" (the last admitted; 0 swapped, 4 running). At step 34 (position 48) "0", "1"
# and "2" hold 9 blocks and need a 4th: "0" takes the last, "1" preempts "2" (1 swapped if "3"
# was swapped, else 0; 3 running). "0" and "1" end at step 64 in 10 blocks; "2" and "3" come back
# at step 65 and fit (2 x 5 blocks). The mode of each decision: swap iff swapped < share x running.
@pytest.mark.parametrize("share, modes", [
    (0.0, ["recompute", "recompute"]),  # 0 < 0 and 0 < 0: never
    (0.25, ["swap", "recompute"]),  # 0 < 1, then 1 < 0.75 fails
    (0.5, ["swap", "swap"]),  # 0 < 2, then 1 < 1.5
    (1.0, ["swap", "swap"]),  # 0 < 4, then 1 < 3
])
def test_swap_and_recompute_counts_follow_the_cap(share, modes):
    victims = Victims()
    cfg = EngineConfig(num_blocks=10, swap_space_blocks=64, plugins=["auto_preemption"],
                       plugin_options={"auto_preemption": {"max_swapped_share": share}})
    engine = Engine(cfg, plugins=[victims])
    replay(engine, Workload("lockstep", [WorkloadItem(0.0, (((k,), 16),), 64) for k in "abcd"]))
    swapped_first = int(modes[0] == "swap")
    assert victims.log == [(18, "3", modes[0], 0, 4), (34, "2", modes[1], swapped_first, 3)]
    auto = engine.plugins.get("auto_preemption")
    assert (auto.swaps, auto.recomputes) == (modes.count("swap"), modes.count("recompute"))
    assert engine.scheduler.total_preemptions == 2
    assert [r.finish_reason for r in engine.metrics.requests] == ["length"] * 4


def test_a_full_host_space_falls_back_to_recompute():
    auto, spy, _ = run(100.0, swap_space_blocks=8)
    decided = Counter(mode for *_, mode in spy.log)
    assert decided["recompute"] == 0 and decided["swap"] == auto.swaps + auto.recomputes
    assert auto.recomputes > 0  # swaps the 8 host blocks could not hold


# --- the answer it gives for each inner answer -----------------------------------------------------


def answer_for(plugin: AutoPreemption, ctx, requester, inner):
    gen = plugin.select_victim(ctx=ctx, requester=requester)
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send(inner)
    return stop.value.value


def test_the_victim_is_the_inner_answer_and_the_mode_is_replaced():
    engine = Engine(EngineConfig(swap_space_blocks=64, num_blocks=64))
    sampling = SamplingParams(max_new_tokens=50, ignore_eos=True, temperature=0.0)
    for i in range(3):
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=segment_tokens(i, 40), sampling=sampling))
    engine.step()
    ctx = engine.scheduler.ctx
    a, b, c = list(ctx.running)
    waiting = Sequence("w", [1, 2, 3], sampling, 0.0)
    swap_all, never = AutoPreemption(max_swapped_share=10.0), AutoPreemption(max_swapped_share=0.0)
    assert answer_for(swap_all, ctx, a, b) == Preempt(b, "swap")
    assert answer_for(never, ctx, a, b) == Preempt(b, "recompute")
    assert answer_for(swap_all, ctx, a, Preempt(c, "recompute")) == Preempt(c, "swap")
    assert answer_for(never, ctx, a, Preempt(c, "swap")) == Preempt(c, "recompute")
    # None: a running requester is preempted itself (as the core would), a waiting one stays
    assert answer_for(swap_all, ctx, a, None) == Preempt(a, "swap")
    assert waiting.state is SeqState.WAITING
    assert answer_for(swap_all, ctx, waiting, None) is None


# --- configuration -----------------------------------------------------------------------------------


@pytest.mark.parametrize("share", [-0.5, float("inf"), "half", True])
def test_bad_share_names_the_option(share):
    with pytest.raises(ValueError, match="plugin 'auto_preemption': option 'max_swapped_share': "):
        AutoPreemption(max_swapped_share=share)


def test_no_swap_space_is_an_error_at_the_first_step():
    engine = Engine(EngineConfig(plugins=["auto_preemption"]))
    engine.add_request(Request(request_id="r", prompt_token_ids=[1, 2, 3],
                               sampling=SamplingParams(max_new_tokens=2)))
    with pytest.raises(PluginError, match=r"auto_preemption.*on_arrival.*swap_space_blocks >= 1"):
        engine.step()
