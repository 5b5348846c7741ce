"""The scheduler step on small configs (block_size 4, a few blocks), with exact expectations:
chunked prefill, prefill and decode mixed under the token budget, head-of-line blocking,
preemption by recompute and by swap, static batching."""

from __future__ import annotations

import random

import pytest
from conftest import STEP, assert_pool_drained, live_tables, make_engine, request, run_to_end

from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.sequence import FinishReason, SeqState
from metroline.kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT


def plans(engine):
    return engine.executor.plans


# --- chunked prefill -----------------------------------------------------------------------------


def test_a_request_alone_is_not_capped_by_max_prefill_chunk():
    # vLLM's long_prefill_token_threshold: with one request eligible nobody is starved, so it gets
    # the whole budget (64): 100 prompt tokens in 2 steps, not 4
    engine = make_engine(max_prefill_chunk=32, max_num_batched_tokens=64)
    engine.add_request(request("r", 100, max_new=1))
    run_to_end(engine)
    assert [p.scheduled for p in plans(engine)] == [{"r": 64}, {"r": 36}]


def test_the_chunk_cap_counts_the_requests_once_at_the_start_of_the_step():
    # r and s (waiting, no slot for it) are two at the start of each step: r is capped until it
    # ends; then s, alone, is not
    engine = make_engine(max_prefill_chunk=16, max_num_batched_tokens=64, max_num_seqs=1)
    engine.add_request(request("r", 40, max_new=1))
    engine.add_request(request("s", 40, max_new=1))
    run_to_end(engine)
    assert [p.scheduled for p in plans(engine)] == [{"r": 16}, {"r": 16}, {"r": 8}, {"s": 40}]


@pytest.mark.parametrize("adaptive, chunks", [(False, [16, 16, 8]), (True, [32, 8])])
def test_the_adaptive_chunk_cap_is_at_least_the_budget_over_the_requests(adaptive, chunks):
    # two requests, budget 64: adaptive raises the cap of 16 to 64 // 2 = 32
    engine = make_engine(max_prefill_chunk=16, max_prefill_chunk_adaptive=adaptive, max_num_batched_tokens=64,
                         max_num_seqs=1)
    engine.add_request(request("r", 40, max_new=1))
    engine.add_request(request("s", 4, max_new=1))
    run_to_end(engine)
    assert [p.scheduled["r"] for p in plans(engine) if "r" in p.scheduled] == chunks


def test_chunked_prefill_runs_in_chunks_of_max_prefill_chunk():
    # a second request waits for the one slot: two requests are eligible, so the cap applies
    engine = make_engine(max_prefill_chunk=32, max_num_batched_tokens=64, max_num_seqs=1)
    engine.add_request(request("r", 100, max_new=3))
    engine.add_request(request("s", 8, max_new=1))
    assert run_to_end(engine) == 7
    assert plans(engine)[6].scheduled == {"s": 8}
    got = [(p.scheduled, p.starts, p.sample) for p in plans(engine)[:6]]
    assert got == [
        ({"r": 32}, {"r": 0}, []),
        ({"r": 32}, {"r": 32}, []),
        ({"r": 32}, {"r": 64}, []),
        ({"r": 4}, {"r": 96}, ["r"]),  # the last chunk reaches the end of the prompt: first token
        ({"r": 1}, {"r": 100}, ["r"]),
        ({"r": 1}, {"r": 101}, ["r"]),
    ]
    assert [p.num_prefill_tokens for p in plans(engine)[:6]] == [32, 32, 32, 4, 0, 0]
    assert [p.num_decode_tokens for p in plans(engine)[:6]] == [0, 0, 0, 0, 1, 1]
    seq = engine.sequences("r")[0]
    assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == 3
    # the first token comes with the 4th step, the clock advancing 0.01 s a step
    assert seq.first_scheduled_time == 0.0
    assert seq.first_token_time == pytest.approx(4 * STEP)
    assert seq.finish_time == pytest.approx(6 * STEP)
    assert seq.token_times == pytest.approx([4 * STEP, 5 * STEP, 6 * STEP])
    assert_pool_drained(engine)


def test_prefill_chunk_is_also_capped_by_the_budget():
    # no max_prefill_chunk: a chunk is at most the whole budget (24 tokens)
    engine = make_engine(max_num_batched_tokens=24)
    engine.add_request(request("r", 50, max_new=1))
    run_to_end(engine)
    assert [p.scheduled["r"] for p in plans(engine)] == [24, 24, 2]


# --- prefill and decode mixed in one step under the token budget ---------------------------------


def test_prefills_and_decodes_share_a_step_under_the_budget():
    engine = make_engine(max_num_batched_tokens=16, max_num_seqs=3)
    for rid, prompt, out in (("A", 8, 10), ("B", 30, 4), ("C", 30, 4), ("D", 5, 2)):
        engine.add_request(request(rid, prompt, max_new=out))
    run_to_end(engine)
    got = [(p.scheduled, p.admitted) for p in plans(engine)]
    assert got == [
        # A's whole prompt, then B's first chunk takes the rest of the 16 tokens
        ({"A": 8, "B": 8}, ["A", "B"]),
        # A decodes (1 token), B's next chunk takes the 15 left; no budget left for C
        ({"A": 1, "B": 15}, []),
        ({"A": 1, "B": 7, "C": 8}, ["C"]),
        ({"A": 1, "B": 1, "C": 14}, []),
        ({"A": 1, "B": 1, "C": 8}, []),
        # three running = max_num_seqs: D waits although the budget has room
        ({"A": 1, "B": 1, "C": 1}, []),
        # B finished in step 6: D takes its slot
        ({"A": 1, "C": 1, "D": 5}, ["D"]),
        ({"A": 1, "C": 1, "D": 1}, []),
        ({"A": 1}, []),
        ({"A": 1}, []),
    ]
    assert [(p.num_prefill_tokens, p.num_decode_tokens) for p in plans(engine)] == [
        (16, 0), (15, 1), (15, 1), (14, 2), (8, 2), (0, 3), (5, 2), (0, 3), (0, 1), (0, 1),
    ]
    # the KV tokens each step's attention reads: each scheduled request's tokens computed before
    # the step plus the step's own (A decodes from 8 up, B and C prefill 30, D 5)
    computed, context = {}, []
    for p in plans(engine):
        context.append(sum(computed.get(rid, 0) + n for rid, n in p.scheduled.items()))
        for rid, n in p.scheduled.items():
            computed[rid] = computed.get(rid, 0) + n
    assert [p.num_context_tokens for p in plans(engine)] == context == [16, 32, 48, 64, 74, 77, 51, 54, 16, 17]
    for rid, out in (("A", 10), ("B", 4), ("C", 4), ("D", 2)):
        seq = engine.sequences(rid)[0]
        assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == out
    assert_pool_drained(engine)


def test_budget_and_slots_are_never_exceeded():
    rng = random.Random(7)
    budget, slots = 40, 5
    engine = make_engine(max_num_batched_tokens=budget, max_num_seqs=slots, max_prefill_chunk=16, num_blocks=48)
    for i in range(40):
        engine.add_request(request(f"r{i}", rng.randint(1, 60), max_new=rng.randint(1, 12)))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        rec = plans(engine)[-1]
        assert sum(rec.scheduled.values()) == rec.num_prefill_tokens + rec.num_decode_tokens <= budget
        assert all(n <= 16 for n in rec.scheduled.values())
        assert len(rec.scheduled) <= slots
        assert len(engine.scheduler.running) <= slots
        engine.pool.check_invariants(live_tables(engine))
    # the budget is actually used: some steps are full
    assert max(sum(p.scheduled.values()) for p in plans(engine)) == budget
    assert max(len(p.scheduled) for p in plans(engine)) == slots
    for i in range(40):
        assert engine.sequences(f"r{i}")[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


# --- head-of-line blocking -----------------------------------------------------------------------


def _hol_engine(plugins=()):
    engine = make_engine(num_blocks=8, plugins=plugins)
    engine.add_request(request("A", 20, max_new=4))  # 5 blocks at admission, 6 at the end
    engine.add_request(request("B", 16, max_new=2))  # 4 blocks: does not fit next to A
    engine.add_request(request("C", 3, max_new=1))  # 1 block: would fit
    return engine


def test_fcfs_head_of_line_blocks_a_small_request_behind_a_large_one():
    engine = _hol_engine()
    engine.step()
    assert plans(engine)[0].admitted == ["A"]
    assert engine.sequences("C")[0].state is SeqState.WAITING
    run_to_end(engine)
    admitted = [(p.step, p.admitted) for p in plans(engine) if p.admitted]
    # A finishes in step 4; B and C board together in step 5
    assert admitted == [(1, ["A"]), (5, ["B", "C"])]
    assert_pool_drained(engine)


class NoHeadOfLine:
    """Stacked on fcfs: the same candidates, but a blocked one is skipped."""

    name = "no_hol"

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        result = yield
        return Candidates(iter(result), head_of_line=False)


def test_without_head_of_line_the_small_request_overtakes():
    engine = _hol_engine(plugins=[NoHeadOfLine()])
    run_to_end(engine)
    admitted = [(p.step, p.admitted) for p in plans(engine) if p.admitted]
    assert admitted == [(1, ["A", "C"]), (5, ["B"])]
    assert_pool_drained(engine)


# --- preemption ----------------------------------------------------------------------------------


def _two_growing(**config):
    """A and B each end at 20 tokens (5 blocks); the pool has 8: one must be preempted."""
    engine = make_engine(num_blocks=8, **config)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    return engine


def _outputs(engine):
    return {rid: engine.sequences(rid)[0].output_token_ids for rid in ("A", "B")}


def test_preemption_by_recompute_takes_the_last_admitted_and_recomputes_it():
    engine = _two_growing(enable_prefix_caching=False)
    run_to_end(engine)
    ps = plans(engine)
    preempted = [(p.step, p.preempted) for p in ps if p.preempted]
    # step 10: A needs its 5th block, none is free; B (admitted after A) goes back to waiting
    assert preempted == [(10, [("B", "WAITING")])]
    assert ps[9].scheduled == {"A": 1}
    # B kept its 8 prompt + 9 output tokens; readmitted when A finished (step 12), it recomputes
    # all 17 of them in one chunk, then decodes
    assert ps[12].admitted == ["B"] and ps[12].scheduled == {"B": 17} and ps[12].starts == {"B": 0}
    assert ps[12].sample == ["B"]
    assert [p.scheduled for p in ps[13:]] == [{"B": 1}, {"B": 1}]
    a, b = engine.sequences("A")[0], engine.sequences("B")[0]
    assert (a.num_preemptions, a.recomputed_tokens) == (0, 0)
    assert (b.num_preemptions, b.recomputed_tokens) == (1, 16)
    assert engine.scheduler.total_preemptions == 1
    # the recomputed sequence produced exactly what it would have without preemption
    roomy = make_engine(num_blocks=64, enable_prefix_caching=False)
    roomy.add_request(request("A", 8, max_new=12))
    roomy.add_request(request("B", 8, max_new=12))
    run_to_end(roomy)
    assert all(not p.preempted for p in plans(roomy))
    assert _outputs(engine) == _outputs(roomy)
    assert all(len(t) == 12 for t in _outputs(engine).values())
    assert_pool_drained(engine)


def test_recompute_reuses_the_prefix_cache_for_what_was_not_evicted():
    engine = _two_growing()  # prefix caching on
    run_to_end(engine)
    ps = plans(engine)
    assert [(p.step, p.preempted) for p in ps if p.preempted] == [(10, [("B", "WAITING")])]
    # B's 4 full blocks stayed cached; A's 5th block evicted the least recently used one (B's
    # tail), so 3 blocks = 12 tokens are found again and 17 - 12 = 5 are computed
    assert ps[12].admitted == ["B"] and ps[12].scheduled == {"B": 5} and ps[12].starts == {"B": 12}
    b = engine.sequences("B")[0]
    assert (b.num_preemptions, b.recomputed_tokens) == (1, 16 - 12)
    assert b.num_cached_prompt_tokens == 0  # counted at the first admission only
    summary = engine.metrics.requests
    assert {r.id: (r.preemptions, r.recomputed_tokens) for r in summary} == {"A": (0, 0), "B": (1, 4)}
    assert_pool_drained(engine)


def test_preemption_by_swap_swaps_out_then_in_the_same_blocks():
    engine = _two_growing(preemption_mode="swap", swap_space_blocks=8)
    run_to_end(engine)
    ps = plans(engine)
    assert [(p.step, p.preempted) for p in ps if p.preempted] == [(10, [("B", "SWAPPED")])]
    outs = [(p.step, [op for op in p.block_ops if op[0] == SWAP_OUT]) for p in ps]
    ins = [(p.step, [op for op in p.block_ops if op[0] == SWAP_IN]) for p in ps]
    out_steps = [(s, ops) for s, ops in outs if ops]
    in_steps = [(s, ops) for s, ops in ins if ops]
    assert [s for s, _ in out_steps] == [10] and [s for s, _ in in_steps] == [13]
    swap_out, swap_in = out_steps[0][1], in_steps[0][1]
    assert len(swap_out) == len(swap_in) == 4  # B's 16 computed tokens: 4 blocks
    # the host blocks written by the swap out are the ones read back, in block-table order
    assert [h for _, _, h in swap_out] == [h for _, h, _ in swap_in]
    assert not any(op[0] == COPY for p in ps for op in p.block_ops)
    # back from the host, B goes on decoding where it stopped: nothing recomputed
    assert ps[12].admitted == ["B"] and ps[12].scheduled == {"B": 1} and ps[12].starts == {"B": 16}
    b = engine.sequences("B")[0]
    assert (b.num_preemptions, b.recomputed_tokens) == (1, 0)
    assert _outputs(engine)["B"] == _outputs(_two_growing_run())["B"]
    assert engine.executor.stats.swap_outs == engine.executor.stats.swap_ins == 4
    assert_pool_drained(engine)


def _two_growing_run():
    """A and B of `_two_growing` on a pool where nothing is preempted."""
    engine = make_engine(num_blocks=64)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    run_to_end(engine)
    assert all(not p.preempted for p in plans(engine))
    return engine


def test_swap_falls_back_to_recompute_when_the_swap_space_is_full():
    engine = _two_growing(preemption_mode="swap", swap_space_blocks=2, enable_prefix_caching=False)
    run_to_end(engine)
    ps = plans(engine)
    # 4 blocks do not fit in 2 host blocks: B is recomputed instead
    assert [(p.step, p.preempted) for p in ps if p.preempted] == [(10, [("B", "WAITING")])]
    assert not any(p.block_ops for p in ps)
    assert engine.sequences("B")[0].recomputed_tokens == 16
    assert_pool_drained(engine)


def test_the_victim_is_the_last_admitted_of_three():
    # three requests of 12 tokens (3 blocks each) on 7 blocks
    engine = make_engine(num_blocks=7)
    for rid in "ABC":
        engine.add_request(request(rid, 4, max_new=8))
    run_to_end(engine)
    ps = plans(engine)
    # step 6: A takes the last free block, B finds none and C (admitted last) is preempted
    assert [(p.step, p.preempted) for p in ps if p.preempted] == [(6, [("C", "WAITING")])]
    assert ps[5].scheduled == {"A": 1, "B": 1}
    # C's first (prompt) block is still cached: it recomputes from token 4
    assert ps[8].admitted == ["C"] and ps[8].scheduled == {"C": 5} and ps[8].starts == {"C": 4}
    for rid in "ABC":
        seq = engine.sequences(rid)[0]
        assert seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens == 8
    assert [engine.sequences(r)[0].num_preemptions for r in "ABC"] == [0, 0, 1]
    assert_pool_drained(engine)


def test_the_last_admitted_requester_preempts_itself():
    # 4 blocks: A (1 block) takes the free block in step 2; in step 3 B, admitted last, needs a
    # block and is its own victim
    engine = make_engine(num_blocks=4, enable_prefix_caching=False)
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 7, max_new=6))
    run_to_end(engine)
    got = [(p.scheduled, p.preempted) for p in plans(engine)]
    assert got == [
        ({"A": 4, "B": 7}, []),
        ({"A": 1, "B": 1}, []),
        ({"A": 1}, [("B", "WAITING")]),
        ({"A": 1}, []),
        ({"B": 9}, []),
        ({"B": 1}, []),
        ({"B": 1}, []),
        ({"B": 1}, []),
    ]
    b = engine.sequences("B")[0]
    assert (b.num_preemptions, b.recomputed_tokens, b.num_output_tokens) == (1, 8, 6)
    assert_pool_drained(engine)


# --- static batching -----------------------------------------------------------------------------


def _batch_engine(policy):
    engine = make_engine(policy=policy, max_num_seqs=2)
    for rid, out in (("A", 2), ("B", 6), ("C", 2), ("D", 2)):
        engine.add_request(request(rid, 4, max_new=out))
    run_to_end(engine)
    return [(p.step, p.admitted) for p in plans(engine) if p.admitted], engine


def test_static_batching_admits_a_new_batch_only_when_nothing_runs():
    admitted, engine = _batch_engine("static")
    # A ends in step 2, but C waits until B ended (step 6) to board with D
    assert admitted == [(1, ["A", "B"]), (7, ["C", "D"])]
    ps = plans(engine)
    assert [len(p.scheduled) for p in ps] == [2, 2, 1, 1, 1, 1, 2, 2]
    assert_pool_drained(engine)


def test_static_batching_admits_its_members_in_arrival_order_behind_one_that_does_not_fit():
    # one batch of three on 6 blocks of 4: A takes 3, B's 16 tokens need 4 and wait; C's 4 tokens
    # would fit beside A, but a member is not admitted ahead of an earlier one
    engine = make_engine(policy="static", max_num_seqs=3, num_blocks=6)
    for rid, prompt in (("A", 12), ("B", 16), ("C", 4)):
        engine.add_request(request(rid, prompt, max_new=2))
    run_to_end(engine)
    admitted = [(p.step, p.admitted) for p in plans(engine) if p.admitted]
    # B and C once A ended; C, preempted when both needed a block for their decode (step 4), back after B
    assert admitted == [(1, ["A"]), (3, ["B", "C"]), (5, ["C"])]
    assert [p.preempted for p in plans(engine)][3] == [("C", "WAITING")]
    assert_pool_drained(engine)


def test_fcfs_refills_a_slot_as_soon_as_it_frees():
    admitted, engine = _batch_engine("fcfs")
    assert admitted == [(1, ["A", "B"]), (3, ["C"]), (5, ["D"])]
    assert len(plans(engine)) == 6
    assert_pool_drained(engine)


def test_candidates_filter_skips_and_gate_blocks_under_head_of_line():
    from metroline.core.plugins.candidates import Candidates

    closed = []

    def source():
        try:
            yield from [1, 2, 3, 4]
        finally:
            closed.append(True)

    odd = lambda x: x % 2 == 1  # noqa: E731
    assert list(Candidates(source()).filter(odd)) == [1, 3] and closed == [True]
    assert list(Candidates(source()).gate(lambda x: x < 2)) == [1] and closed == [True, True]
    skipping = Candidates(source(), head_of_line=False).gate(odd)
    assert list(skipping) == [1, 3] and skipping.head_of_line is False
    partial = iter(Candidates(source()).filter(odd))
    assert next(partial) == 1
    partial.close()  # the scheduler closes the answer when it stops pulling
    assert closed == [True, True, True, True]


def test_candidates_tell_a_wrapper_which_candidates_the_scheduler_admitted():
    """`admitted` hears of a let-through candidate that got admitted, before the next is judged."""
    from metroline.core.requests.request import SamplingParams
    from metroline.core.requests.sequence import Sequence

    seqs = [Sequence(f"r{i}", [1, 2], SamplingParams(), 0.0) for i in range(4)]
    heard, judged = [], []

    def keep(s):
        judged.append((s.request_id, list(heard)))
        return s.request_id != "r2"

    it = iter(Candidates(iter(seqs)).filter(keep, admitted=lambda s: heard.append(s.request_id)))
    first = next(it)
    first.state = SeqState.RUNNING  # the scheduler admits r0
    assert next(it).request_id == "r1"  # r1 stays waiting (its blocks did not fit)
    assert next(it).request_id == "r3"  # r2 filtered out
    seqs[3].state = SeqState.RUNNING
    it.close()
    assert heard == ["r0", "r3"]  # r3 reported when the scheduler stops pulling
    assert judged == [("r0", []), ("r1", ["r0"]), ("r2", ["r0"]), ("r3", ["r0"])]


# --- the plan's own counters ---------------------------------------------------------------------


def test_a_step_keeps_its_plan_counters_and_budget_through_schedule_and_drop():
    from metroline.core.requests.request import SamplingParams
    from metroline.core.requests.sequence import Sequence
    from metroline.core.step.context import StepContext
    from metroline.core.step.plan import StepPlan
    from metroline.core.step.step_state import StepState

    def seq(name, prompt, computed):
        s = Sequence(name, list(range(prompt)), SamplingParams(max_new_tokens=4), 0.0)
        s.num_computed_tokens = computed
        return s

    decoding, prefilling, admitted = seq("d", 8, 7), seq("p", 40, 8), seq("a", 12, 0)
    decoding.token_ids.append(1)  # an output token: `decoding` now needs one decode token
    decoding.num_computed_tokens = 8
    plan = StepPlan(1, 4)
    step = StepState(plan, StepContext(None, None, {}, {}, {}), None)  # no prefix caching
    step.set_budget(10, 64, 3)
    step.schedule(decoding, 1, True)
    step.schedule(prefilling, 16, False)
    step.schedule(admitted, 12, False)
    plan.admitted.append(admitted)

    def check(budget):
        decodes = [s for s in plan.scheduled if s in plan.decodes]
        assert plan.num_decode_tokens == len(decodes)
        assert plan.num_prefill_tokens == sum(n for s, n in plan.scheduled.items() if s not in plan.decodes)
        assert plan.num_context_tokens == sum(s.num_computed_tokens + n for s, n in plan.scheduled.items())
        spent_prefills = len(plan.scheduled) - len(decodes)
        assert (step.decode_left, step.prefill_left, step.prefills_left) == (
            budget[0] - plan.num_decode_tokens, budget[1] - plan.num_prefill_tokens, budget[2] - spent_prefills,
        )

    check((10, 64, 3))
    step.drop(admitted)  # preempted after its admission: out of the plan and of `admitted`
    assert admitted not in plan.scheduled and plan.admitted == []
    check((10, 64, 3))
    step.drop(decoding)
    check((10, 64, 3))
    step.drop(decoding)  # not scheduled any more: nothing changes
    check((10, 64, 3))
    assert step.seal() is plan
    assert plan.sample_seqs == []  # `prefilling` computes 24 of its 40 tokens: nothing to sample
    assert (plan.decode_left, plan.prefill_left, plan.prefills_left) == (10, 64 - 16, 3 - 1)  # the budget unused


def test_the_plans_own_bookkeeping_methods_still_work_and_warn():
    import pytest as _pytest

    from metroline.api import MetrolineDeprecationWarning
    from metroline.core.plugins.deprecations import forget_warnings
    from metroline.core.requests.request import SamplingParams
    from metroline.core.requests.sequence import Sequence
    from metroline.core.step.plan import StepPlan

    forget_warnings()
    s = Sequence("a", list(range(12)), SamplingParams(max_new_tokens=4), 0.0)
    plan = StepPlan(1, 4)
    with _pytest.warns(MetrolineDeprecationWarning, match="StepPlan.set_budget is deprecated"):
        plan.set_budget(10, 64, 3)
    with _pytest.warns(MetrolineDeprecationWarning, match="StepPlan.add is deprecated"):
        plan.add(s, 12, False)
    assert (plan.scheduled, plan.num_prefill_tokens, plan.prefill_left, plan.prefills_left) == ({s: 12}, 12, 52, 2)
    with _pytest.warns(MetrolineDeprecationWarning, match="StepPlan.seal is deprecated"):
        plan.seal()
    assert plan.sample_seqs == [s]
    with _pytest.warns(MetrolineDeprecationWarning, match="StepPlan.drop is deprecated"):
        plan.drop(s)
    assert (plan.scheduled, plan.num_prefill_tokens, plan.prefill_left, plan.prefills_left) == ({}, 0, 64, 3)


def test_the_deprecated_seal_samples_completed_prefills_and_drafting_decodes():
    """`StepPlan.seal` (deprecated) with drafts: a prefill that reaches its last token is sampled,
    a partial prefill is not, and a drafting decode is (its newest token's row comes first, though
    its computed + scheduled tokens run past its known ones by the drafts)."""
    import warnings

    from metroline.core.requests.request import SamplingParams
    from metroline.core.requests.sequence import Sequence
    from metroline.core.step.plan import StepPlan

    done = Sequence("done", list(range(12)), SamplingParams(max_new_tokens=4), 0.0)
    part = Sequence("part", list(range(20)), SamplingParams(max_new_tokens=4), 0.0)
    drafting = Sequence("drafting", list(range(5)), SamplingParams(max_new_tokens=4), 0.0)
    drafting.num_computed_tokens = 4  # its newest token, then 2 drafts: positions 4..6
    plan = StepPlan(1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan.set_budget(10, 64, 3)
        plan.add(done, 12, False)
        plan.add(part, 8, False)
        plan.add(drafting, 3, True)
        plan.drafts[drafting] = 2
        plan.seal()
    assert plan.sample_seqs == [done, drafting]
    assert plan.positions(drafting) == range(4, 7) and plan.draft_positions(drafting) == range(5, 7)
    assert list(plan.draft_positions(done)) == []  # no drafts
