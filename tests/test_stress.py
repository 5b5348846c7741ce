"""Stress: 2,000 requests (random prompt lengths, shared prefixes, random output lengths, some
with n=2) on a pool small enough to force preemption, with random cancellations in every state,
driven step by step. Once with preemption by recompute, once by swap (with a swap space small
enough that swapping sometimes falls back to recompute)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from conftest import assert_pool_drained, tokens

from metroline.core.config import EngineConfig
from metroline.core.requests.sequence import FinishReason, SeqState
from metroline.core.step.engine import Engine
from metroline.core.step.plan import StepPlan, StepResult
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

NUM_REQUESTS = 2000
BUDGET = 96
SLOTS = 16
CHUNK = 24


class CountingExecutor(SimulatedExecutor):
    """Counts the state each preempted sequence went to, and checks each plan's size."""

    def __init__(self) -> None:
        super().__init__(make_cost_model("steps"))
        self.preempted_to: Counter = Counter()
        self.max_tokens = 0
        self.max_seqs = 0

    def execute(self, plan: StepPlan) -> StepResult:
        for seq in plan.preempted:
            self.preempted_to[seq.state] += 1
        self.max_tokens = max(self.max_tokens, plan.num_tokens)
        self.max_seqs = max(self.max_seqs, len(plan.scheduled))
        assert plan.num_tokens == sum(plan.scheduled.values()) <= BUDGET
        assert all(n <= CHUNK for n in plan.scheduled.values())
        return super().execute(plan)


def _category(seq) -> str:
    state = seq.state
    if state is SeqState.WAITING:
        return "waiting"
    if state is SeqState.SWAPPED:
        return "swapped"
    if state is SeqState.FINISHED:
        return "finished"
    return "decoding" if seq.is_decoding else "prefilling"


def _requests(rng: random.Random) -> list[dict]:
    prefixes = [tokens(90_000 + k, rng.randint(16, 40)) for k in range(4)]
    out = []
    for i in range(NUM_REQUESTS):
        prompt = list(prefixes[rng.randrange(4)]) if rng.random() < 0.5 else []
        prompt += tokens(i + 1, rng.randint(1, 64))
        out.append({
            "request_id": f"r{i}",
            "prompt_token_ids": prompt,
            "sampling": {"max_new_tokens": rng.randint(1, 24), "n": 2 if rng.random() < 0.1 else 1},
        })
    return out


def run_stress(mode: str, seed: int):
    rng = random.Random(seed)
    config = EngineConfig(
        block_size=8, num_blocks=72, max_num_seqs=SLOTS, max_num_batched_tokens=BUDGET,
        max_prefill_chunk=CHUNK, preemption_mode=mode, swap_space_blocks=24 if mode == "swap" else 0,
    )
    executor = CountingExecutor()
    engine = Engine(config, executor)
    pending = _requests(rng)
    pending.reverse()
    submitted: dict[str, dict] = {}
    cancelled: dict[str, str] = {}  # request id -> its state when cancelled
    refused: Counter = Counter()  # state category -> aborts that returned False
    scheduler, pool = engine.scheduler, engine.pool
    steps = max_running = 0
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 3)):
            if pending:
                data = pending.pop()
                submitted[engine.add_request(data)] = data
        engine.step()
        steps += 1
        assert steps < 100_000
        assert len(scheduler.running) <= SLOTS
        max_running = max(max_running, len(scheduler.running))
        pool.check_invariants([s.block_table for s in scheduler.running])
        if rng.random() < 0.25 and submitted:
            # cancel one request, drawing the state first so that every state is hit
            by_state: dict[str, list[str]] = {}
            for rid in rng.sample(sorted(submitted), min(40, len(submitted))):
                for seq in engine.sequences(rid):
                    by_state.setdefault(_category(seq), []).append(rid)
            cat = rng.choice(sorted(by_state))
            rid = rng.choice(by_state[cat])
            if cat == "finished" and all(s.is_finished for s in engine.sequences(rid)):
                assert engine.abort(rid) is False
                refused[cat] += 1
            elif rid not in cancelled:
                states = [_category(s) for s in engine.sequences(rid)]
                assert engine.abort(rid) is True
                cancelled[rid] = cat if cat in states else states[0]
                assert engine.abort(rid) is False  # already ended now
    executor.max_running = max_running
    return engine, executor, submitted, cancelled, refused


@pytest.mark.parametrize("seed", [2024, 7])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_stress_random_cancellations_and_preemptions(mode, seed):
    engine, executor, submitted, cancelled, refused = run_stress(mode, seed)
    assert len(submitted) == NUM_REQUESTS

    # every request ended: cancelled ones CANCELLED, the others generated exactly max_new_tokens
    for rid, data in submitted.items():
        seqs = engine.sequences(rid)
        max_new, n = data["sampling"]["max_new_tokens"], data["sampling"]["n"]
        assert all(s.finish_reason is not None and s.is_finished for s in seqs), rid
        if rid in cancelled:
            assert any(s.finish_reason is FinishReason.CANCELLED for s in seqs), rid
            for s in seqs:  # a sample that had finished before the cancellation keeps its reason
                assert s.finish_reason is FinishReason.CANCELLED or (
                    s.finish_reason is FinishReason.LENGTH and s.num_output_tokens == max_new
                )
                assert s.num_output_tokens <= max_new
        else:
            assert len(seqs) == n, rid
            for s in seqs:
                assert s.finish_reason is FinishReason.LENGTH, (rid, s.finish_reason)
                assert s.num_output_tokens == max_new, rid
                assert s.token_ids[: s.num_prompt_tokens] == data["prompt_token_ids"]
    records = engine.metrics.requests
    num_seqs = sum(len(engine.sequences(rid)) for rid in submitted)
    assert len(records) == num_seqs and len({r.id for r in records}) == num_seqs

    # cancellations hit every state, and aborting a finished request was refused
    states = Counter(cancelled.values())
    expected = {"waiting", "prefilling", "decoding"} | ({"swapped"} if mode == "swap" else set())
    assert expected <= set(states), states
    assert refused["finished"] > 0
    assert 50 < len(cancelled) < NUM_REQUESTS // 2

    # preemption happened, of each kind the mode allows
    preempted = [s for rid in submitted for s in engine.sequences(rid) if s.num_preemptions]
    assert len(preempted) > 20
    assert sum(s.num_preemptions for s in preempted) == sum(executor.preempted_to.values())
    assert sum(r.preemptions for r in records) == engine.scheduler.total_preemptions
    if mode == "swap":
        # mostly swapped, sometimes falling back to recompute when the swap space is full
        assert executor.preempted_to[SeqState.SWAPPED] > 0
        assert executor.preempted_to[SeqState.WAITING] > 0
        assert executor.stats.swap_outs > 0 and executor.stats.swap_ins > 0
    else:
        assert set(executor.preempted_to) == {SeqState.WAITING}
        assert executor.stats.swap_outs == executor.stats.swap_ins == 0
    assert sum(s.recomputed_tokens for s in preempted) > 0
    assert any(len(engine.sequences(rid)) == 2 for rid in submitted)  # parallel sampling ran
    # the limits bind: some step used the whole token budget, some had every slot taken
    assert executor.max_tokens == BUDGET and executor.max_running == SLOTS

    # the pool is back to its initial state: nothing referenced, everything free or evictable
    assert_pool_drained(engine)
    assert not engine.has_unfinished()
