"""reserve: admission that keeps KV blocks in reserve, as a wrapper over any ordering policy."""

from __future__ import annotations

import pytest

from metroline.core.candidates import Candidates
from metroline.core.config import EngineConfig
from metroline.core.engine import Engine
from metroline.core.hookspecs import hookimpl
from metroline.core.request import Request, SamplingParams
from metroline.core.runner import replay, run_workload
from metroline.core.workloads import SyntheticSpec, Workload, WorkloadItem, generate, segment_tokens
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.reserve import ReserveBlocks


def sim():
    return SimulatedExecutor(make_cost_model("steps"))


def chunked_workload() -> Workload:
    """Prompts of 100..900 tokens (several chunks at a 256-token budget), 16..128 outputs."""
    spec = SyntheticSpec(num_requests=80, rate=100.0, prompt_len={"dist": "uniform", "low": 100, "high": 900},
                         output_len={"dist": "uniform", "low": 16, "high": 128}, seed=0)
    return Workload("reserve-chunked", generate(spec, namespace="reserve-chunked"))


POOL = dict(num_blocks=160, max_num_seqs=32, max_num_batched_tokens=256, admission_gate="first_chunk")
"""160 blocks of 16 tokens: about 3 of the workload's requests at their full length. Admission
checks only the first chunk's blocks (the engine's full-prompt gate would do part of the reserve's
work)."""


def preemptions(plugins: list, options: dict | None = None, extra: list = (), **config) -> tuple[int, int]:
    cfg = EngineConfig(**POOL, plugins=plugins, plugin_options=options or {}, **config)
    doc, _ = run_workload(chunked_workload(), cfg, sim(), plugins=list(extra))
    assert doc["summary"]["completed"] == 80
    return doc["summary"]["preemptions"], doc["summary"]["steps"]


# --- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, option", [
    ({"watermark": -0.1}, "watermark"),
    ({"watermark": 1.0}, "watermark"),
    ({"watermark": "0.1"}, "watermark"),
    ({"watermark": True}, "watermark"),
    ({"new_token_ratio": 0}, "new_token_ratio"),
    ({"new_token_ratio": 1.5}, "new_token_ratio"),
])
def test_bad_options_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=f"reserve: option {option}"):
        ReserveBlocks(**kwargs)


# --- fewer preemptions -------------------------------------------------------------------------------


def test_reserve_reduces_preemptions_on_a_pool_constrained_workload():
    assert preemptions([]) == (61, 1494)
    assert preemptions(["reserve"]) == (6, 1518)  # the 1 % watermark, whole prompts
    assert preemptions(["reserve"], {"reserve": {"new_token_ratio": 0.4}}) == (2, 1532)
    # reserving every remaining output token: no preemption here, at the cost of more steps
    assert preemptions(["reserve"], {"reserve": {"new_token_ratio": 1.0}}) == (0, 1625)


class NoInFlight(ReserveBlocks):
    """`reserve` without the reservation of the running partial prefills' remaining prompt blocks."""

    name = "reserve_without_in_flight"

    def _in_flight_prompt_blocks(self, block_size: int) -> int:
        return 0


def test_prompts_in_flight_are_reserved():
    # With a 64-token chunk cap several prompts are prefilled chunk by chunk at once: their
    # remaining blocks must be counted, or later admissions take them and preempt.
    chunked = {"decode_first": {"max_chunk": 64}}
    assert preemptions(["decode_first"], chunked)[0] == 190
    assert preemptions(["decode_first"], chunked, [NoInFlight()])[0] == 63
    assert preemptions(["decode_first"], chunked, [ReserveBlocks()])[0] == 6
    assert preemptions(["decode_first"], chunked, [NoInFlight(new_token_ratio=1.0)])[0] == 22
    assert preemptions(["decode_first"], chunked, [ReserveBlocks(new_token_ratio=1.0)])[0] == 0


# --- head-of-line, laziness, liveness ------------------------------------------------------------


class Admitted:
    name = "admitted_log"

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []

    @hookimpl
    def on_admitted(self, ctx, seqs):
        self.log.extend((ctx.step, s.request_id) for s in seqs)


class SkipOrder:
    """Arrival order, skipping a candidate that does not fit."""

    name = "skip_order"

    @hookimpl
    def admission(self, ctx):
        return Candidates(list(ctx.waiting), head_of_line=False)


def hol_scenario(policy_plugins: list) -> Admitted:
    # R (32-token prompt, 200 outputs) runs; X (96-token prompt) then Y (16 tokens) arrive.
    # Pool 20 blocks; with every remaining output reserved (ratio 1), X does not pass while R has
    # many tokens to go, Y (1 block) does.
    log = Admitted()
    cfg = EngineConfig(num_blocks=20, max_num_batched_tokens=256)
    engine = Engine(cfg, plugins=[*policy_plugins, ReserveBlocks(watermark=0.0, new_token_ratio=1.0), log])
    replay(engine, Workload("hol", [
        WorkloadItem(0.0, ((("R",), 32),), 200),
        WorkloadItem(0.01, ((("X",), 96),), 8),
        WorkloadItem(0.01, ((("Y",), 16),), 8),
    ]))
    return log


def test_a_refused_head_stops_a_head_of_line_policy():
    # fcfs is head-of-line: X is refused until R ends (R's 15 blocks + X's 7 exceed the pool), and
    # Y waits behind it
    assert hol_scenario([]).log == [(1, "0"), (201, "1"), (201, "2")]


def test_a_refused_candidate_is_skipped_under_a_skipping_policy():
    assert hol_scenario([SkipOrder()]).log == [(1, "0"), (2, "2"), (201, "1")]


def test_the_inner_head_of_line_flag_is_kept():
    for plugins, expected in (([], True), ([SkipOrder()], False)):
        engine = Engine(EngineConfig(), plugins=[*plugins, ReserveBlocks()])
        answer = engine.plugins.hook.admission(ctx=engine.scheduler.ctx)
        assert isinstance(answer, Candidates) and answer.head_of_line is expected


class CountingOrder:
    """Arrival order, counting the candidates pulled and whether the answer was closed."""

    name = "counting_order"

    def __init__(self) -> None:
        self.pulled: list[int] = []
        self.closed = 0

    @hookimpl
    def admission(self, ctx):
        self.pulled.append(0)

        def gen():
            try:
                for s in list(ctx.waiting):
                    self.pulled[-1] += 1
                    yield s
            finally:
                self.closed += 1

        return gen()


def test_candidates_are_pulled_lazily():
    counter = CountingOrder()
    engine = Engine(EngineConfig(max_num_seqs=2), plugins=[counter, ReserveBlocks(new_token_ratio=0.4)])
    sampling = SamplingParams(max_new_tokens=4, ignore_eos=True, temperature=0.0)
    for i in range(50):
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=segment_tokens(i, 20), sampling=sampling))
    engine.step()
    # two admitted, the third refused for slots: the scheduler stops, 47 never looked at
    assert counter.pulled == [3] and counter.closed == 1
    engine.run()
    assert max(counter.pulled) <= 3 and counter.closed == len(counter.pulled)


def test_the_first_candidate_passes_when_nothing_runs():
    # watermark 0.5 of 20 blocks = 10; each prompt needs 13 blocks: refused while another runs,
    # admitted when nothing does (else the engine would never make progress).
    log = Admitted()
    engine = Engine(EngineConfig(num_blocks=20), plugins=[ReserveBlocks(watermark=0.5), log])
    replay(engine, Workload("big", [WorkloadItem(0.0, (((k,), 200),), 5) for k in "ab"]))
    assert log.log == [(1, "0"), (6, "1")]
    assert [r.finish_reason for r in engine.metrics.requests] == ["length", "length"]


# --- the reservation's bookkeeping -----------------------------------------------------------------


class CheckRemaining:
    """After every step: the reserve's running total equals a recount over the running sequences."""

    name = "check_remaining"

    def __init__(self, reserve: ReserveBlocks) -> None:
        self.reserve = reserve
        self.checked = 0

    @hookimpl
    def on_step_end(self, ctx):
        recount = sum(ReserveBlocks._remaining(s) for s in ctx.running)
        assert self.reserve._remaining_outputs == recount, ctx.step
        assert self.reserve._running == set(ctx.running)
        self.checked += 1


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_remaining_outputs_are_tracked_exactly(mode):
    # a small ratio and a small pool, so that preemption (and, in swap mode, swapping) happens
    reserve = ReserveBlocks(watermark=0.0, new_token_ratio=0.05)
    check = CheckRemaining(reserve)
    engine = Engine(EngineConfig(num_blocks=32, max_num_seqs=8, max_num_batched_tokens=128,
                                 preemption_mode=mode, swap_space_blocks=64), plugins=[reserve, check])
    for i in range(30):
        sampling = SamplingParams(max_new_tokens=20 + 11 * (i % 9), n=2 if i % 5 == 0 else 1,
                                  ignore_eos=True, temperature=0.0)
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=segment_tokens(i, 20 + 13 * (i % 7)),
                                   sampling=sampling))
    engine.abort("r7")
    engine.run()
    assert engine.scheduler.total_preemptions > 0
    assert check.checked > 50
    assert reserve._remaining_outputs == 0 and not reserve._running
