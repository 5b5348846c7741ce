"""reserve: admission that keeps KV blocks in reserve, as a wrapper over any ordering policy."""

from __future__ import annotations

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import replay, run_workload
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import SyntheticSpec, Workload, WorkloadItem, generate, segment_tokens
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.policies.budget_split import DecodeFirst
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
    with pytest.raises(ValueError, match=f"plugin 'reserve': option '{option}': "):
        ReserveBlocks(**kwargs)


# --- fewer preemptions -------------------------------------------------------------------------------


def test_reserve_reduces_preemptions_on_a_pool_constrained_workload():
    # the synthetic workload: every reserve setting preempts less than no reserve at all
    none, _ = preemptions([])
    assert none > 0  # the pool is the limit: 160 blocks hold about 3 requests at their full length
    assert preemptions(["reserve"])[0] < none  # the 1 % watermark, whole prompts
    assert preemptions(["reserve"], {"reserve": {"new_token_ratio": 0.4}})[0] < none
    assert preemptions(["reserve"], {"reserve": {"new_token_ratio": 1.0}})[0] < none


# Four requests arrive at t = 0, each a 16-token prompt (one block) and 64 output tokens: the KV
# of 16 + 64 - 1 = 79 tokens (the last sampled token is never computed) = 5 blocks at the end.
# The pool has 10 blocks: two requests at their full length.
LOCKSTEP = Workload("lockstep", [WorkloadItem(0.0, (((k,), 16),), 64) for k in "abcd"])


class Demand:
    """After every step: how many requests run, and the blocks the running ones still need to
    reach their full length beyond the free blocks (> 0: some decode will have to preempt)."""

    name = "demand"

    def __init__(self) -> None:
        self.max_running = 0
        self.max_shortfall = -(10**9)

    @hookimpl
    def on_step_end(self, ctx):
        bs = ctx.block_size
        still = sum(-(-(s.num_prompt_tokens + s.sampling.max_new_tokens - 1) // bs) - len(s.block_table)
                    for s in ctx.running)
        self.max_running = max(self.max_running, len(ctx.running))
        self.max_shortfall = max(self.max_shortfall, still - ctx.num_free_blocks())


def lockstep(plugins: list) -> tuple[Engine, Demand]:
    demand = Demand()
    engine = Engine(EngineConfig(num_blocks=10), plugins=[*plugins, demand])
    replay(engine, LOCKSTEP)
    assert [r.finish_reason for r in engine.metrics.requests] == ["length"] * 4
    return engine, demand


@pytest.mark.parametrize("ratio, running, preempted", [
    # no reserve: all four run (4 prompt blocks); in lockstep they need 8 blocks at token 17, 12 at
    # token 33: the 3rd block of "c" preempts "d" (the last admitted); at token 49 a, b, c hold 9
    # and need 3 more: "b" preempts "c"; a and b end in 10 blocks, then c and d rerun together
    (None, 4, 2),
    # ratio 0.5 reserves ceil(0.5 x 64 x k / 16) = 2k blocks for k admitted: "b" passes (free 9 - 1
    # >= 4), "c" passes (8 - 1 >= 6), "d" does not (7 - 1 < 8); three run, need 15 > 10 blocks: at
    # token 49 "b" preempts "c" as above (one preemption), then c and d run together
    (0.5, 3, 1),
    # ratio 1 reserves 4k blocks: "b" passes (9 - 1 >= 8), "c" does not (8 - 1 < 12): two run at
    # a time, 2 x 5 = 10 blocks, never a preemption
    (1.0, 2, 0),
])
def test_reserved_outputs_bound_the_running_set_and_the_preemptions(ratio, running, preempted):
    plugins = [] if ratio is None else [ReserveBlocks(watermark=0.0, new_token_ratio=ratio)]
    engine, demand = lockstep(plugins)
    assert demand.max_running == running
    assert engine.scheduler.total_preemptions == preempted
    if ratio == 1.0:
        # reserving every remaining output: the running requests' growth always fits in the free blocks
        assert demand.max_shortfall <= 0


class NoInFlight(ReserveBlocks):
    """`reserve` without the reservation of the running partial prefills' remaining prompt blocks."""

    name = "reserve_without_in_flight"

    def _in_flight_prompt_blocks(self, block_size: int) -> int:
        return 0


class Admitted:
    name = "admitted_log"

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []

    @hookimpl
    def on_admitted(self, ctx, seqs):
        self.log.extend((ctx.step, s.request_id) for s in seqs)


def in_flight_run(plugins: list) -> tuple[Engine, Admitted]:
    # A: a 64-token prompt (4 blocks) prefilled 16 tokens a step (steps 1-4), 1 output (it ends at
    # step 4); C arrives at step 2 with a 48-token prompt (3 blocks), 1 output. Pool 5 blocks,
    # admission checks the first chunk only. (Chunks of 16 by decode_first's own cap: the engine's
    # max_prefill_chunk would let A, alone at step 1, take its whole prompt.)
    log = Admitted()
    cfg = EngineConfig(num_blocks=5, admission_gate="first_chunk")
    engine = Engine(cfg, plugins=[DecodeFirst(max_chunk=16), *plugins, log])
    replay(engine, Workload("in-flight", [
        WorkloadItem(0.0, ((("A",), 64),), 1),
        WorkloadItem(0.01, ((("C",), 48),), 1),
    ]))
    return engine, log


def test_prompts_in_flight_are_reserved():
    # At step 2 A holds 2 blocks and needs 2 more: C (3 blocks) leaves 3 - 3 = 0 free. Counting
    # A's 2 blocks to come, C is refused until A ends: admitted at step 5, no preemption.
    reserve = ReserveBlocks(watermark=0.0)
    engine, log = in_flight_run([reserve])
    assert log.log == [(1, "0"), (5, "1")]
    assert reserve.refused == 3  # C, offered once a step, at steps 2, 3 and 4
    assert engine.scheduler.total_preemptions == 0
    # Without them C is admitted at step 2; at step 4 A's last chunk finds no free block and
    # preempts C (the last admitted), which is admitted again at step 5.
    for plugins in ([NoInFlight(watermark=0.0)], []):
        engine, log = in_flight_run(plugins)
        assert log.log == [(1, "0"), (2, "1"), (5, "1")]
        assert engine.scheduler.total_preemptions == 1


def test_prompts_in_flight_are_reserved_on_a_chunked_workload():
    # With a 64-token chunk cap several prompts are prefilled chunk by chunk at once: counting
    # their remaining blocks preempts less than leaving them out, and less than no reserve
    chunked = {"decode_first": {"max_chunk": 64}}
    none = preemptions(["decode_first"], chunked)[0]
    without = preemptions(["decode_first"], chunked, [NoInFlight()])[0]
    with_in_flight = preemptions(["decode_first"], chunked, [ReserveBlocks()])[0]
    assert with_in_flight < without and with_in_flight < none
    assert (preemptions(["decode_first"], chunked, [ReserveBlocks(new_token_ratio=1.0)])[0]
            < preemptions(["decode_first"], chunked, [NoInFlight(new_token_ratio=1.0)])[0])


# --- head-of-line, laziness, liveness ------------------------------------------------------------


class SkipOrder:
    """Arrival order, skipping a candidate that does not fit."""

    name = "skip_order"

    @hookimpl
    def admission(self, ctx):
        return Candidates(list(ctx.waiting), head_of_line=False)


# R is admitted at step 1 (its prompt and first token) and makes its 199 other tokens in steps
# 2..200: it ends at step 200, and the first step after it is 201 = 1 + R_OUT.
R_OUT = 200
# X is refused while R runs: with r of R's outputs to come (1 <= r <= 199) R's KV holds at least
# 231 - r tokens, and X passes only if 20 - ceil((231 - r) / 16) - 6 (X's prompt) >=
# ceil((r + 8) / 16) (R's and X's outputs to come): the two ceilings add up to at least
# 239 / 16 > 14 = 20 - 6 blocks, never. Y (1 block) passes at step 2, its arrival: R holds
# ceil(33 / 16) = 3 blocks, 20 - 3 - 1 = 16 >= ceil((199 + 8) / 16) = 13.


def hol_scenario(policy_plugins: list) -> Admitted:
    # R (32-token prompt, 200 outputs) runs; X (96-token prompt) then Y (16 tokens) arrive.
    # Pool 20 blocks; with every remaining output reserved (ratio 1), X does not pass while R has
    # many tokens to go, Y (1 block) does.
    log = Admitted()
    cfg = EngineConfig(num_blocks=20, max_num_batched_tokens=256)
    engine = Engine(cfg, plugins=[*policy_plugins, ReserveBlocks(watermark=0.0, new_token_ratio=1.0), log])
    replay(engine, Workload("hol", [
        WorkloadItem(0.0, ((("R",), 32),), R_OUT),
        WorkloadItem(0.01, ((("X",), 96),), 8),
        WorkloadItem(0.01, ((("Y",), 16),), 8),
    ]))
    return log


def test_a_refused_head_stops_a_head_of_line_policy():
    # fcfs is head-of-line: X is refused until R ends, and Y waits behind it
    assert hol_scenario([]).log == [(1, "0"), (1 + R_OUT, "1"), (1 + R_OUT, "2")]


def test_a_refused_candidate_is_skipped_under_a_skipping_policy():
    assert hol_scenario([SkipOrder()]).log == [(1, "0"), (2, "2"), (1 + R_OUT, "1")]


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
    # admitted when nothing does (else the engine would never make progress). "a" runs steps 1-5
    # (its prompt and first token, then 4 decodes), "b" is admitted at step 6.
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
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert engine.scheduler.total_preemptions > 0
    assert check.checked == steps  # the recount ran at every step
    assert reserve._remaining_outputs == 0 and not reserve._running
