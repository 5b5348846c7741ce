"""Blocks scheduled in a step are in the prefix index for requests admitted later in the same step
(the executor writes a step's KV before attention reads it); a registrant preempted in the step
takes them out again; a request admitted on a hit of them and preempted in the same step is
recomputed, never swapped out (the swap-out would copy KV the forward has yet to write)."""

from __future__ import annotations

from pathlib import Path

from conftest import RecordingExecutor, assert_pool_drained, live_tables, make_engine, request, run_to_end

from metroline.core.conformance.kv_chaos import Scenario, run_scenario
from metroline.core.conformance.kv_shadow import KVShadow
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.sequence import SeqState
from metroline.kv_backends.block_ops import SWAP_OUT

WEIGHTED_FAIR_SWAP = Path(__file__).parent / "data" / "kv_chaos_weighted_fair_swap.json"

PREFIX = [7, 8, 9, 10, 11, 12, 13, 14]  # two blocks of 4 tokens


def test_a_request_admitted_later_in_the_step_shares_the_blocks_scheduled_before_it():
    engine = make_engine(max_num_batched_tokens=64)
    for i in range(3):
        engine.add_request(request(f"r{i}", PREFIX + [100 + i], max_new=2))
    engine.step()
    plan = engine.executor.plans[0]
    # r0 computes its 9 tokens; r1 and r2 share r0's two full prefix blocks and compute 1 token each
    assert plan.admitted == ["r0", "r1", "r2"]
    assert plan.scheduled == {"r0": 9, "r1": 1, "r2": 1}
    assert plan.starts == {"r0": 0, "r1": 8, "r2": 8}
    r0, r1, r2 = (engine.sequences(f"r{i}")[0] for i in range(3))
    assert r1.block_table[:2] == r2.block_table[:2] == r0.block_table[:2]
    assert r1.num_cached_prompt_tokens == r2.num_cached_prompt_tokens == 8
    assert engine.pool.peak_used_blocks == 3 + 1 + 1
    run_to_end(engine)
    assert_pool_drained(engine)


def test_block_granular_matching_never_shares_a_partly_matching_block():
    engine = make_engine(max_num_batched_tokens=64)
    engine.add_request(request("a", PREFIX + [1, 2, 3, 4, 5], max_new=1))
    run_to_end(engine)
    engine.add_request(request("b", PREFIX + [1, 2, 9, 9, 9], max_new=1))  # 2 of the third block match
    engine.step()
    assert engine.executor.plans[-1].starts == {"b": 8} and engine.executor.plans[-1].block_ops == []
    run_to_end(engine)
    token = make_engine(max_num_batched_tokens=64, prefix_match="token")
    token.add_request(request("a", PREFIX + [1, 2, 3, 4, 5], max_new=1))
    run_to_end(token)
    token.add_request(request("b", PREFIX + [1, 2, 9, 9, 9], max_new=1))
    token.step()
    last = token.executor.plans[-1]
    assert last.starts == {"b": 10} and len(last.block_ops) == 1  # the shared part, copied on write
    run_to_end(token)
    assert_pool_drained(token)


class PreemptTheFirst:
    """Makes room for `c` by preempting `a`, admitted earlier in the same step."""

    name = "preempt_the_first"

    @hookimpl
    def select_victim(self, ctx, requester):
        if requester.request_id == "c":
            return next(s for s in ctx.running if s.request_id == "a")
        return None


def test_a_registrant_preempted_in_its_step_takes_its_blocks_out_and_its_hitters_back():
    engine = make_engine(max_num_seqs=2, max_num_batched_tokens=64, plugins=[PreemptTheFirst()])
    engine.add_request(request("a", PREFIX + [1], max_new=2))
    engine.add_request(request("b", PREFIX + [2], max_new=2))
    engine.add_request(request("c", 5, max_new=2))
    engine.step()
    plan = engine.executor.plans[0]
    # b hit a's two prefix blocks, whose KV a would have written in this very step: with a
    # preempted they hold nothing, so b goes back to waiting too and c runs alone
    assert plan.preempted == [("a", "WAITING"), ("b", "WAITING")]
    assert plan.admitted == ["c"] and plan.scheduled == {"c": 5}
    assert engine.pool.lookup(PREFIX + [1], None, 8).num_tokens == 0  # nothing left in the index
    engine.pool.check_invariants(live_tables(engine))
    run_to_end(engine)
    for rid in "abc":
        seq = engine.sequences(rid)[0]
        assert seq.state is SeqState.FINISHED and seq.num_output_tokens == 2
    assert_pool_drained(engine)


def test_a_failed_step_leaves_no_block_of_it_in_the_prefix_index():
    from conftest import RecordingExecutor

    def fail_first(plan):
        if plan.step == 1:
            raise RuntimeError("device lost")

    engine = make_engine(max_num_batched_tokens=64, executor=RecordingExecutor(on_execute=fail_first))
    engine.add_request(request("a", PREFIX + [1], max_new=2))
    engine.add_request(request("b", PREFIX + [2], max_new=2))
    engine.step()
    assert [engine.sequences(r)[0].finish_reason.value for r in "ab"] == ["failed", "failed"]
    assert engine.pool.lookup(PREFIX + [3], None, 8).num_tokens == 0  # the KV was never written
    assert_pool_drained(engine)
    engine.add_request(request("c", PREFIX + [3], max_new=2))
    run_to_end(engine)
    assert engine.sequences("c")[0].num_cached_prompt_tokens == 0
    assert_pool_drained(engine)


def test_a_block_filled_in_this_step_is_shared_whole_never_copied_in_part():
    # token-granular: b matches 2 tokens of a's third block, which a writes in this very step; a
    # copy would run before the forward, so b shares the two full blocks only
    engine = make_engine(max_num_batched_tokens=64, prefix_match="token")
    engine.add_request(request("a", PREFIX + [1, 2, 3, 4, 5], max_new=1))
    engine.add_request(request("b", PREFIX + [1, 2, 9, 9, 9], max_new=1))
    engine.step()
    plan = engine.executor.plans[0]
    assert plan.starts == {"a": 0, "b": 8} and plan.block_ops == []
    run_to_end(engine)
    assert_pool_drained(engine)


class PreemptTheHitter:
    """Makes room for `c` by naming `b`, admitted earlier in the same step on a hit of the prefix
    blocks `a` fills in that step (the hook's contract allows any running request)."""

    name = "preempt_the_hitter"

    @hookimpl
    def select_victim(self, ctx, requester):
        if requester.request_id == "c":
            return next(s for s in ctx.running if s.request_id == "b")
        return None


def same_step_swap_engine(executor, plugins=(), **sampling):
    """Issue 35's reproducer: block size 4, 16 blocks, 2 sequences, prefix caching, swap, fcfs;
    a and b share two prefix blocks, which a computes in step 1 and b hits in that step; c needs
    b's slot. `plugins` stack under the victim plugin; `sampling` goes to every request."""
    engine = make_engine(
        executor=executor, num_blocks=16, max_num_seqs=2, preemption_mode="swap", swap_space_blocks=16,
        plugins=[*plugins, PreemptTheHitter()],
    )
    engine.add_request(request("a", PREFIX + [1], max_new=2, **sampling))
    engine.add_request(request("b", PREFIX + [2], max_new=2, **sampling))
    engine.add_request(request("c", [50, 51, 52, 53, 54], max_new=2, **sampling))
    return engine


def test_a_request_preempted_in_the_step_of_its_same_step_hit_is_recomputed_and_reads_its_own_kv():
    shadow = KVShadow(RecordingExecutor())
    engine = shadow.attach(same_step_swap_engine(shadow))
    engine.step()
    plan = shadow.plans[0]
    # b's hit holds a's two prefix blocks, written by this step's forward, which runs after the
    # block ops: a swap-out would copy them unwritten. The pool refuses it: b is recomputed
    assert plan.preempted == [("b", "WAITING")]
    assert plan.admitted == ["a", "c"] and plan.scheduled == {"a": 9, "c": 5}
    assert [op for op in plan.block_ops if op[0] == SWAP_OUT] == []
    assert engine.scheduler.swap.num_free_blocks() == 16
    a, b = engine.sequences("a")[0], engine.sequences("b")[0]
    prefix_blocks = a.block_table[:2]
    while "b" not in shadow.plans[-1].scheduled:
        engine.step()
    # b runs again on a hit of a's prefix blocks, now written: what it reads at positions 0..7 is
    # a's prefix KV, which is b's own (the same tokens), and position 8 its own token's
    last = shadow.plans[-1]
    assert last.starts["b"] == 8 and last.scheduled["b"] == 1
    assert b.block_table[:2] == prefix_blocks
    bs = 4
    held = [shadow.device[b.block_table[p // bs]][p % bs] for p in range(9)]
    assert held == shadow.keys(b)[:9] and shadow.keys(b)[:8] == shadow.keys(a)[:8]
    assert shadow.reads_by_seq["b"] == 9
    run_to_end(engine)
    shadow.check_drained()
    assert shadow.errors == []
    assert [engine.sequences(r)[0].num_output_tokens for r in "abc"] == [2, 2, 2]
    assert_pool_drained(engine)


def test_the_shipped_policy_random_configuration_swaps_out_only_written_kv():
    # tests/data/README.md: weighted_fair + slo_classes, blocks of 3, swap, a request with n = 3.
    # In step 19 r4 computes the block [42, 2, 30] and r16 is admitted on a hit of it; the
    # policy then preempts r16 in that step: recomputed, not swapped out with the unwritten block
    executor = RecordingExecutor()
    outcome = run_scenario(Scenario.from_json(WEIGHTED_FAIR_SWAP.read_text()), inner=executor)
    assert outcome.errors == []
    step19 = executor.plans[18]
    assert step19.step == 19 and "r4" in step19.admitted and step19.starts["r4"] == 0
    assert ("r16", "WAITING") in step19.preempted
    r4, r16 = (outcome.engine.sequences(r)[0] for r in ("r4", "r16"))
    assert r16.num_cached_prompt_tokens == 3  # readmitted later on the same block, written by then
    assert outcome.engine.scheduler.total_preemptions == sum(len(p.preempted) for p in executor.plans)


def test_a_victim_taken_while_a_candidate_grows_sends_it_back_to_match_again():
    """vLLM's speculative scheduling pads an admission that is one token short of decoding with
    `num_speculative_tokens` (2) drafts, and `num_lookahead_tokens` (4) slots beyond: its growth
    takes more blocks than its admission check counted. Block size 4, 5 blocks. Step 1: `a`
    prefills its 7 tokens (block 0 full, registered). Step 2: `a` decodes position 7 with 2
    drafts and 4 lookahead slots (blocks 0-3; it fills and registers block 1 in this step); `c`,
    whose 9 tokens are a's 8 and one more, hits blocks 0 and 1 (one short of decoding: padded,
    1 + 2 tokens, positions 8..14 with the lookahead: 2 blocks more, 1 free). Growing it preempts
    `a` (the plugin's victim), whose block 1 leaves the index unwritten: `c` matches again, on
    block 0 only, and prefills positions 4..8 (5 tokens, unpadded) instead of reading block 1."""
    engine = make_engine(
        num_blocks=5, speculative_scheduling="vllm", plugins=[PreemptTheFirst()],
        speculative_config={"num_speculative_tokens": 2, "num_lookahead_tokens": 4},
    )
    engine.add_request(request("a", [61, 62, 63, 64, 65, 66, 67], max_new=8))
    engine.step()
    (a,) = engine.sequences("a")
    assert (len(a.token_ids), a.num_computed_tokens, a.num_cached_blocks) == (8, 7, 1)
    engine.add_request(request("c", a.token_ids[:8] + [99], max_new=2))
    engine.step()
    plan = engine.executor.plans[1]
    assert ("a", "WAITING") in plan.preempted
    assert plan.scheduled["c"] == 5 and plan.starts["c"] == 4
    run_to_end(engine)
    assert [engine.sequences(r)[0].num_output_tokens for r in "ac"] == [8, 2]
    assert_pool_drained(engine)
