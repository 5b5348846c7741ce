"""The engine loop: continuous batching against static batching, prefix sharing, cancellation in
every state, parallel sampling with copy-on-write, stop conditions, timestamps, streaming, and a
failing executor."""

from __future__ import annotations

import pytest
from conftest import (
    STEP,
    RecordingExecutor,
    assert_pool_drained,
    live_tables,
    make_engine,
    request,
    run_to_end,
    tokens,
)

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.sequence import FinishReason, SeqState
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import build_workload
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.kv_backends.block_ops import COPY


def steps_executor():
    return SimulatedExecutor(make_cost_model("steps"))


# --- continuous batching vs static batching ------------------------------------------------------


def test_continuous_batching_beats_static_batching_on_mixed_64():
    # 10 groups of 64 requests (54 of 20 tokens, 10 of 2000) on 64 slots. Static batching runs
    # each group as one batch that lasts as long as its longest member: 10 x 2000 steps.
    # Continuous batching refills the slots of the short ones: the 100 long requests need two
    # waves of 2000 steps on 64 slots, so the true cap on the ratio is 5.
    workload = build_workload("mixed-64")
    docs = {}
    for policy in ("fcfs", "static"):
        config = EngineConfig(max_num_seqs=64, policy=policy)
        docs[policy], _ = run_workload(workload, config, steps_executor())
    fcfs, static = docs["fcfs"]["summary"], docs["static"]["summary"]
    assert fcfs["completed"] == static["completed"] == 640
    assert fcfs["output_tokens"] == static["output_tokens"] == 10 * (54 * 20 + 10 * 2000)
    assert 10 * 2000 <= static["steps"] <= 10 * 2000 + 100
    assert 4000 <= fcfs["steps"] <= 4500
    ratio = fcfs["output_throughput_tok_s"] / static["output_throughput_tok_s"]
    assert 4.5 < ratio <= 5.0
    assert fcfs["preemptions"] == static["preemptions"] == 0


# --- prefix sharing ------------------------------------------------------------------------------


def test_shared_prefix_needs_a_fifth_of_the_blocks_with_prefix_caching():
    workload = build_workload("shared-prefix")
    summaries = {}
    for caching in (True, False):
        config = EngineConfig(enable_prefix_caching=caching)
        doc, engine = run_workload(workload, config, steps_executor())
        summaries[caching] = doc["summary"]
        assert_pool_drained(engine)
    on, off = summaries[True], summaries[False]
    assert on["completed"] == off["completed"] == 200
    assert on["kv_peak_blocks"] * 5 <= off["kv_peak_blocks"]
    assert on["prefix_hit_rate"] > 0.9
    assert off["prefix_hit_rate"] == 0.0


def test_a_shared_prefix_is_computed_once():
    engine = make_engine(max_num_seqs=4)
    system = tokens(1, 16)  # 4 full blocks
    engine.add_request(request("first", system + tokens(2, 3), max_new=2))
    run_to_end(engine)
    engine.add_request(request("second", system + tokens(3, 3), max_new=2))
    engine.add_request(request("salted", system + tokens(4, 3), max_new=2, cache_salt="other"))
    run_to_end(engine)
    second = [p for p in engine.executor.plans if "second" in p.scheduled][0]
    # the 16 shared tokens come from the cache; only the 3 unique ones are computed
    assert second.starts["second"] == 16 and second.scheduled["second"] == 3
    assert second.starts["salted"] == 0 and second.scheduled["salted"] == 19
    cached = {r.id: r.cached_prompt_tokens for r in engine.metrics.requests}
    assert cached == {"first": 0, "second": 16, "salted": 0}
    assert_pool_drained(engine)


# --- cancellation --------------------------------------------------------------------------------


def _used_by(engine, rid):
    return {b for s in engine.sequences(rid) for b in s.block_table}


def _used_without(engine, rid):
    """Blocks referenced by the live sequences other than those of `rid`."""
    return {b for s in engine.scheduler.running if s.request_id != rid for b in s.block_table}


def _cancel_and_check(engine, rid):
    """Abort `rid`: its blocks are freed at once (the other requests keep theirs), and the next
    step reports its end."""
    seqs = engine.sequences(rid)
    others = _used_without(engine, rid)
    assert engine.abort(rid) is True
    assert all(s.finish_reason is FinishReason.CANCELLED for s in seqs)
    assert all(s.block_table == [] and s.host_table == [] for s in seqs)
    sched = engine.scheduler
    assert not any(s in sched.running or s in sched.waiting or s in sched.swapped for s in seqs)
    # the ref counts match the live tables: the cancelled sequences hold nothing any more
    engine.pool.check_invariants(live_tables(engine))
    assert _used_without(engine, rid) == others
    outputs = engine.step()
    ended = [o for o in outputs if o.request_id == rid]
    assert len(ended) == len(seqs)
    assert all(o.finished and o.new_token_ids == [] and o.finish_reason is FinishReason.CANCELLED for o in ended)
    assert engine.abort(rid) is False  # already ended


def test_cancel_a_waiting_request():
    engine = make_engine(max_num_seqs=1)
    engine.add_request(request("run", 4, max_new=3))
    engine.add_request(request("wait", 4, max_new=3))
    engine.step()
    assert engine.sequences("wait")[0].state is SeqState.WAITING
    _cancel_and_check(engine, "wait")
    run_to_end(engine)
    assert engine.sequences("run")[0].finish_reason is FinishReason.LENGTH
    assert engine.sequences("wait")[0].num_output_tokens == 0
    assert all(p.scheduled.keys() == {"run"} for p in engine.executor.plans)
    assert_pool_drained(engine)


def test_cancel_a_prefilling_request_frees_its_blocks_at_once():
    engine = make_engine(max_prefill_chunk=16, enable_prefix_caching=False)
    engine.add_request(request("long", 40, max_new=3))
    engine.add_request(request("other", 4, max_new=3))
    engine.step()
    seq = engine.sequences("long")[0]
    assert seq.state is SeqState.RUNNING and not seq.is_decoding and seq.num_computed_tokens == 16
    assert len(seq.block_table) == 4
    assert engine.pool.num_used_blocks() == 4 + len(_used_without(engine, "long"))
    _cancel_and_check(engine, "long")
    # its 4 blocks are free again: only the other request's blocks are used
    assert engine.pool.num_used_blocks() == len(_used_without(engine, "long")) == 2
    run_to_end(engine)
    assert engine.sequences("other")[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


def test_cancel_a_decoding_request():
    engine = make_engine()
    engine.add_request(request("a", 6, max_new=10))
    engine.add_request(request("b", 6, max_new=3))
    engine.step()
    engine.step()
    seq = engine.sequences("a")[0]
    assert seq.is_decoding and seq.num_output_tokens == 2
    _cancel_and_check(engine, "a")
    assert seq.num_output_tokens == 2  # nothing generated after the cancellation
    run_to_end(engine)
    assert engine.sequences("b")[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


def test_cancel_a_swapped_request_frees_its_host_blocks():
    engine = make_engine(num_blocks=8, preemption_mode="swap", swap_space_blocks=8)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    for _ in range(10):
        engine.step()
    b = engine.sequences("B")[0]
    assert b.state is SeqState.SWAPPED and len(b.host_table) == 4
    swap = engine.scheduler.swap
    assert swap.num_free_blocks() == 4
    _cancel_and_check(engine, "B")
    assert swap.num_free_blocks() == 8
    run_to_end(engine)
    assert engine.sequences("A")[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


def test_cancel_a_request_whose_arrival_time_has_not_come():
    """The only pending request, aborted before its arrival time: it leaves the pending heap, ends
    as cancelled (reported by the next step) and is never scheduled."""
    engine = make_engine()
    engine.add_request(request("now", 4, max_new=3))
    engine.add_request(request("later", 4, max_new=3, arrival_time=5.0))
    (later,) = engine.sequences("later")
    assert engine.intake.pending == [(5.0, later.arrival_no, later)]
    assert engine.abort("later") is True
    assert engine.intake.pending == []
    assert later.finish_reason is FinishReason.CANCELLED
    outputs = engine.step()
    assert [(o.request_id, o.finished, o.new_token_ids) for o in outputs if o.request_id == "later"] == [
        ("later", True, [])]
    run_to_end(engine)
    assert engine.sequences("now")[0].finish_reason is FinishReason.LENGTH
    assert later.num_output_tokens == 0 and later.first_scheduled_time is None
    assert all(set(p.scheduled) == {engine.sequences("now")[0].seq_id} for p in engine.executor.plans)
    assert engine.executor.now() < 5.0  # nothing waited for the aborted arrival
    assert_pool_drained(engine)


def test_cancel_an_arrived_request_leaves_a_pending_one_pending():
    """Aborting a request that has arrived touches neither the pending heap nor the queues
    beyond that request: the pending one arrives at its time and runs."""
    engine = make_engine()
    engine.add_request(request("a", 4, max_new=6))
    engine.add_request(request("later", 4, max_new=2, arrival_time=5.0))
    engine.step()
    (later,) = engine.sequences("later")
    _cancel_and_check(engine, "a")
    assert engine.intake.pending == [(5.0, later.arrival_no, later)]
    engine.executor.idle_until(5.0)  # `step` does not move the clock: `run` and `stream` do
    run_to_end(engine)
    assert engine.sequences("a")[0].num_output_tokens == 1
    assert later.finish_reason is FinishReason.LENGTH and later.first_scheduled_time >= 5.0
    assert_pool_drained(engine)


def test_cancel_a_finished_or_unknown_request_returns_false():
    engine = make_engine()
    engine.add_request(request("done", 4, max_new=2))
    run_to_end(engine)
    assert engine.abort("done") is False
    assert engine.sequences("done")[0].finish_reason is FinishReason.LENGTH
    assert engine.abort("never-submitted") is False


def test_a_request_id_cannot_be_reused():
    engine = make_engine()
    engine.add_request(request("x", 4))
    with pytest.raises(ValueError, match="'x' is already in use"):
        engine.add_request(request("x", 4))


# --- parallel sampling ---------------------------------------------------------------------------


def test_parallel_sampling_shares_the_prompt_blocks_and_copies_on_write():
    engine = make_engine()
    engine.add_request(request("p", 6, max_new=3, n=2))  # 6 tokens: one full block, one partial
    engine.step()
    parent, child = engine.sequences("p")
    assert (parent.seq_id, child.seq_id) == ("p", "p#1")
    assert (parent.index, child.index) == (0, 1)
    # the child shares every prompt block, the partial one included
    assert child.block_table == parent.block_table and len(parent.block_table) == 2
    assert [engine.pool.ref_count(b) for b in parent.block_table] == [2, 2]
    assert parent.num_output_tokens == child.num_output_tokens == 1
    assert parent.output_token_ids != child.output_token_ids
    shared_full, shared_partial = parent.block_table

    engine.step()
    plan = engine.executor.plans[1]
    assert plan.scheduled == {"p": 1, "p#1": 1}
    # the first write into the shared partial block copies it; the other sample keeps the original
    assert plan.block_ops == [(COPY, shared_partial, parent.block_table[1])]
    assert parent.block_table[0] == child.block_table[0] == shared_full
    assert child.block_table[1] == shared_partial != parent.block_table[1]
    assert engine.pool.ref_count(shared_full) == 2
    assert engine.pool.ref_count(shared_partial) == engine.pool.ref_count(parent.block_table[1]) == 1

    run_to_end(engine)
    assert [s.finish_reason for s in (parent, child)] == [FinishReason.LENGTH] * 2
    assert parent.num_output_tokens == child.num_output_tokens == 3
    assert sum(len(p.block_ops) for p in engine.executor.plans) == 1
    assert sorted(r.id for r in engine.metrics.requests) == ["p", "p#1"]
    assert_pool_drained(engine)


def test_parallel_sampling_takes_n_slots():
    engine = make_engine(max_num_seqs=2)
    engine.add_request(request("pair", 4, max_new=2, n=2))
    engine.add_request(request("single", 4, max_new=2))
    run_to_end(engine)
    admitted = [(p.step, p.admitted) for p in engine.executor.plans if p.admitted]
    assert admitted == [(1, ["pair"]), (3, ["single"])]
    assert [len(p.scheduled) for p in engine.executor.plans] == [1, 2, 1, 1]


def test_the_slot_of_an_unforked_sample_is_held_until_its_parent_ends():
    engine = make_engine(max_num_seqs=2, max_prefill_chunk=8)
    engine.add_request(request("pair", 100, max_new=2, n=2))
    engine.step()  # the pair's prompt is being computed (64 tokens: alone, it is not capped): its
    # second sample will need a slot
    engine.add_request(request("x", 4, max_new=2))
    engine.add_request(request("y", 4, max_new=2))
    engine.step()
    assert engine.executor.plans[-1].admitted == [] and len(engine.scheduler.running) == 1
    assert engine.abort("pair") is True
    engine.step()  # cancelled before it forked: both slots are free again
    assert engine.executor.plans[-1].admitted == ["x", "y"]
    run_to_end(engine)
    assert [engine.sequences(r)[0].finish_reason for r in ("x", "y")] == [FinishReason.LENGTH] * 2
    assert_pool_drained(engine)


def test_a_preempted_unforked_parent_forks_after_readmission():
    # 5 blocks: the pair (n=2, admitted last) runs out of blocks in the middle of its prompt
    engine = make_engine(num_blocks=5, max_num_seqs=3, max_prefill_chunk=4, enable_prefix_caching=False,
                         admission_gate="first_chunk")
    engine.add_request(request("big", 4, max_new=16))
    engine.add_request(request("pair", 16, max_new=3, n=2))
    engine.add_request(request("z", 3, max_new=1))
    while engine.has_unfinished():
        engine.step()
        assert len(engine.scheduler.running) <= 3
        engine.pool.check_invariants(live_tables(engine))
    ps = engine.executor.plans
    # (first-chunk admission: the scenario this test needs)
    # readmitted as soon as its first chunk fits, the pair is preempted again while big grows;
    # once big ended (step 16) its prompt is computed (4 tokens at step 17 beside z, the other 12
    # at step 18, alone, when max_prefill_chunk does not apply), it forks (step 18), and its
    # second sample, admitted last, finds no block for its first decode and waits for the first
    preempted = [(p.step, p.preempted) for p in ps if p.preempted]
    assert preempted == [
        (4, [("pair", "WAITING")]), (7, [("pair", "WAITING")]), (10, [("pair", "WAITING")]),
        (12, [("pair", "WAITING")]), (14, [("pair", "WAITING")]), (19, [("pair#1", "WAITING")]),
    ]
    assert min(p.step for p in ps if "pair#1" in p.scheduled) == 21
    pair = engine.sequences("pair")
    assert [s.seq_id for s in pair] == ["pair", "pair#1"]
    assert [s.num_preemptions for s in pair] == [5, 1]
    assert all(s.finish_reason is FinishReason.LENGTH and s.num_output_tokens == 3 for s in pair)
    assert engine.sequences("z")[0].finish_reason is FinishReason.LENGTH
    assert_pool_drained(engine)


def test_cancel_a_parallel_request_cancels_every_sample():
    engine = make_engine()
    engine.add_request(request("p", 6, max_new=5, n=2))
    engine.step()
    assert len(engine.sequences("p")) == 2
    _cancel_and_check(engine, "p")
    assert_pool_drained(engine)


# --- stop conditions -----------------------------------------------------------------------------


class Scripted:
    """A sampler that emits, for each sequence, the tokens of its script in order."""

    name = "scripted"

    def __init__(self, scripts):
        self.scripts = scripts

    @hookimpl
    def sample(self, seqs):
        return [self.scripts[s.seq_id][s.num_output_tokens] for s in seqs]


EOS = 2


def test_eos_and_stop_tokens_end_a_request_with_the_right_reason():
    scripts = {
        "eos": [5, 6, EOS, 7, 8],
        "stop": [5, 9, 7, 8],
        "ignore": [EOS, EOS, EOS],
        "length": [5, 6, 7, 8],
        "stop-eos": [5, EOS, 7],
        "max-len": [5, 6, 7, 8, 9, 10],
    }
    engine = make_engine(plugins=[Scripted(scripts)], eos_token_id=EOS, max_model_len=12)
    engine.add_request(request("eos", 4, max_new=5))
    engine.add_request(request("stop", 4, max_new=4, stop_token_ids=[9]))
    engine.add_request(request("ignore", 4, max_new=3, ignore_eos=True))
    engine.add_request(request("length", 4, max_new=4))
    engine.add_request(request("stop-eos", 4, max_new=3, stop_token_ids=[EOS], ignore_eos=True))
    engine.add_request(request("max-len", 6, max_new=6))  # ends at max_model_len = 12 tokens
    run_to_end(engine)
    got = {
        rid: (engine.sequences(rid)[0].finish_reason, engine.sequences(rid)[0].output_token_ids)
        for rid in scripts
    }
    assert got == {
        "eos": (FinishReason.EOS, [5, 6, EOS]),
        "stop": (FinishReason.STOP, [5, 9]),
        "ignore": (FinishReason.LENGTH, [EOS, EOS, EOS]),
        "length": (FinishReason.LENGTH, [5, 6, 7, 8]),
        "stop-eos": (FinishReason.STOP, [5, EOS]),
        "max-len": (FinishReason.LENGTH, [5, 6, 7, 8, 9, 10]),
    }
    reasons = {r.id: r.finish_reason for r in engine.metrics.requests}
    assert reasons == {"eos": "eos", "stop": "stop", "ignore": "length", "length": "length",
                       "stop-eos": "stop", "max-len": "length"}
    assert_pool_drained(engine)


def test_eos_token_comes_from_the_executor_when_not_given():
    executor = RecordingExecutor()
    executor.eos_token_id = 7
    engine = make_engine(plugins=[Scripted({"r": [3, 7, 4]})], executor=executor)
    assert engine.eos_token_id == 7
    engine.add_request(request("r", 4, max_new=3))
    run_to_end(engine)
    seq = engine.sequences("r")[0]
    assert (seq.finish_reason, seq.output_token_ids) == (FinishReason.EOS, [3, 7])


def test_without_an_eos_token_only_length_ends_a_request():
    engine = make_engine(plugins=[Scripted({"r": [EOS, EOS, EOS]})])
    engine.add_request(request("r", 4, max_new=3))
    run_to_end(engine)
    seq = engine.sequences("r")[0]
    assert (seq.finish_reason, seq.output_token_ids) == (FinishReason.LENGTH, [EOS, EOS, EOS])


# --- timestamps and streaming --------------------------------------------------------------------


def test_metrics_timestamps_are_ordered():
    engine = make_engine(max_num_seqs=3, max_num_batched_tokens=16, max_prefill_chunk=8, num_blocks=16)
    for i in range(12):
        engine.add_request(request(f"r{i}", 3 + 5 * i % 23, max_new=1 + i % 5))
    run_to_end(engine)
    records = engine.metrics.requests
    assert len(records) == 12
    for r in records:
        assert r.finish_reason == "length"
        assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
        assert r.first_scheduled_s < r.first_token_s  # a step runs between the two
        assert len(r.token_times) == r.output_tokens
        assert r.token_times[0] == r.first_token_s and r.token_times[-1] == r.finish_s
        assert list(r.token_times) == sorted(r.token_times)
        assert r.prefill_done_s == r.first_token_s
    # some requests queued: their first schedule is after their arrival
    assert any(r.first_scheduled_s > r.arrival_s for r in records)
    # one step is 0.01 s: the last finish is at (number of steps) x 0.01
    assert max(r.finish_s for r in records) == pytest.approx(len(engine.executor.plans) * STEP)


def test_stream_yields_one_output_per_token_per_sequence_then_a_finished_one():
    engine = make_engine(max_num_seqs=4)
    engine.add_request(request("pair", 5, max_new=3, n=2))
    engine.add_request(request("one", 9, max_new=4))
    engine.add_request(request("cut", 4, max_new=50))
    outputs = []
    for out in engine.stream():
        outputs.append(out)
        if out.request_id == "cut" and len(out.token_ids) == 2 and not out.finished:
            assert engine.abort("cut") is True
    by_seq = {}
    for out in outputs:
        by_seq.setdefault(out.seq.seq_id, []).append(out)
    assert set(by_seq) == {"pair", "pair#1", "one", "cut"}
    for sid, max_new in (("pair", 3), ("pair#1", 3), ("one", 4)):
        outs = by_seq[sid]
        assert len(outs) == max_new
        assert all(len(o.new_token_ids) == 1 for o in outs)
        assert [o.finished for o in outs] == [False] * (max_new - 1) + [True]
        assert [t for o in outs for t in o.new_token_ids] == outs[-1].seq.output_token_ids
        assert outs[-1].finish_reason is FinishReason.LENGTH
    assert by_seq["pair"][0].index == 0 and by_seq["pair#1"][0].index == 1
    cut = by_seq["cut"]
    assert [o.new_token_ids != [] for o in cut] == [True, True, False]
    assert [o.finished for o in cut] == [False, False, True]
    assert cut[-1].finish_reason is FinishReason.CANCELLED and cut[-1].token_ids == cut[-1].seq.output_token_ids
    assert len(cut[-1].token_ids) == 2
    assert not engine.has_unfinished()
    assert_pool_drained(engine)


def test_generate_runs_requests_to_completion():
    engine = Engine(EngineConfig(block_size=4, num_blocks=32))
    result = engine.generate([request("a", 5, max_new=3), request("b", 7, max_new=2, n=2)])
    assert {rid: [s.num_output_tokens for s in seqs] for rid, seqs in result.items()} == {"a": [3], "b": [2, 2]}
    assert_pool_drained(engine)


# --- a failing executor --------------------------------------------------------------------------


def test_an_executor_that_raises_fails_the_step_requests_and_the_engine_goes_on():
    def boom(plan):
        if plan.step == 3:
            raise RuntimeError("device lost")

    engine = make_engine(max_num_seqs=2, executor=RecordingExecutor(on_execute=boom))
    engine.add_request(request("A", 4, max_new=5))
    engine.add_request(request("B", 6, max_new=5))
    engine.add_request(request("C", 4, max_new=3))
    engine.step()
    engine.step()
    outputs = engine.step()
    assert sorted((o.request_id, o.finished, o.new_token_ids) for o in outputs) == [
        ("A", True, []), ("B", True, []),
    ]
    for rid in "AB":
        seq = engine.sequences(rid)[0]
        assert seq.finish_reason is FinishReason.FAILED
        assert seq.error == "RuntimeError: device lost"
        assert seq.num_output_tokens == 2 and seq.block_table == []
    assert engine.pool.num_used_blocks() == 0
    engine.pool.check_invariants([])
    run_to_end(engine)
    c = engine.sequences("C")[0]
    assert c.finish_reason is FinishReason.LENGTH and c.num_output_tokens == 3
    records = {r.id: (r.finish_reason, r.error) for r in engine.metrics.requests}
    assert records == {
        "A": ("failed", "RuntimeError: device lost"),
        "B": ("failed", "RuntimeError: device lost"),
        "C": ("length", None),
    }
    assert_pool_drained(engine)


def test_a_failed_step_fails_the_requests_it_swapped_out():
    def boom(plan):
        if plan.swap_outs():
            raise RuntimeError("swap failed")

    executor = RecordingExecutor(on_execute=boom)
    engine = make_engine(num_blocks=8, preemption_mode="swap", swap_space_blocks=8, executor=executor)
    engine.add_request(request("A", 8, max_new=12))
    engine.add_request(request("B", 8, max_new=12))
    run_to_end(engine)
    # step 10 swapped B out and scheduled A: both fail, and B's host blocks are freed
    assert executor.plans[-1].step == 10
    assert {r.id: r.finish_reason for r in engine.metrics.requests} == {"A": "failed", "B": "failed"}
    assert_pool_drained(engine)


def test_run_on_a_simulated_clock_waits_for_a_plugin_that_holds_requests_back():
    """A token bucket that is empty holds every request back; `Engine.run` idles the virtual clock
    to the time the plugin asked to be woken up, instead of spinning on empty steps."""
    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.step.engine import Engine

    config = EngineConfig(policy="fcfs", plugins=["tenant_quota"], num_blocks=64, block_size=16,
                          plugin_options={"tenant_quota": {"default_token_rate": 100.0, "burst": 100.0}})
    engine = Engine(config)
    for i in range(4):
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=list(range(1, 81)), arrival_time=0.0,
                                   sampling=SamplingParams(max_new_tokens=20, ignore_eos=True)))
    done = engine.run()
    seqs = [done[f"r{i}"][0] for i in range(4)]
    assert all(s.num_output_tokens == 20 for s in seqs)
    starts = sorted(s.first_scheduled_time for s in seqs)
    # each request costs 80 + 20 tokens of a 100-token/s bucket: one admission per second or so
    assert starts[0] == 0.0 and all(b - a >= 0.8 for a, b in zip(starts, starts[1:]))


def test_run_raises_when_plugins_never_schedule_anything():
    from metroline.core.config import EngineConfig
    from metroline.core.errors import NoProgressError
    from metroline.core.plugins.hookspecs import hookimpl
    from metroline.core.requests.request import Request
    from metroline.core.step.engine import Engine

    class Nobody:
        name = "nobody"

        @hookimpl
        def admission(self):
            return ()

    engine = Engine(EngineConfig(), plugins=[Nobody()])
    engine.add_request(Request(prompt_token_ids=[1, 2, 3]))
    with pytest.raises(NoProgressError, match="1000 steps scheduled nothing with 0 running, 1 waiting"):
        engine.run()


def test_debug_logs_one_structlog_event_per_lifecycle_transition():
    import structlog

    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.step.engine import Engine

    engine = Engine(EngineConfig(debug=True, num_blocks=4, block_size=4, max_num_seqs=2))
    with structlog.testing.capture_logs() as logs:
        for i in range(2):
            engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3, 4, 5], arrival_time=0.0,
                                       sampling=SamplingParams(max_new_tokens=6)))
        engine.run()
    events = [(e["event"], e["request_id"]) for e in logs]
    # 2 requests x 11 tokens need 6 blocks of a 4-block pool: r1 (admitted last) is preempted once
    assert events.count(("request.arrived", "r0")) == events.count(("request.arrived", "r1")) == 1
    assert events.count(("request.finished", "r0")) == events.count(("request.finished", "r1")) == 1
    assert events.count(("request.preempted", "r1")) >= 1
    assert events.count(("request.admitted", "r1")) == 1 + events.count(("request.preempted", "r1"))
    assert all(e["reason"] == "length" for e in logs if e["event"] == "request.finished")
    assert not any("error" in e for e in logs if e["event"] == "request.finished")  # only a failed one has it


def test_no_logging_without_debug():
    import structlog

    from metroline.core.requests.request import Request
    from metroline.core.step.engine import Engine

    engine = Engine()
    with structlog.testing.capture_logs() as logs:
        engine.add_request(Request(prompt_token_ids=[1, 2, 3]))
        engine.run()
    assert logs == []


def test_a_replay_forgets_ended_requests_but_keeps_their_metrics():
    from metroline.core.config import EngineConfig
    from metroline.core.experiments.runner import run_workload
    from metroline.core.workloads.build import build_workload
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor

    workload = build_workload("shared-prefix", max_requests=20)
    doc, engine = run_workload(workload, EngineConfig(), SimulatedExecutor(make_cost_model("steps")))
    assert doc["summary"]["completed"] == 20 and len(engine.metrics.requests) == 20
    assert engine.intake.requests == {}  # nothing ended is held: a long trace replay stays small
    kept = engine_with_one_request(retain=True)
    assert len(kept.intake.requests) == 1 and engine_with_one_request(retain=False).intake.requests == {}


def engine_with_one_request(retain):
    from metroline.core.requests.request import Request
    from metroline.core.step.engine import Engine

    engine = Engine(retain_finished=retain)
    engine.add_request(Request(prompt_token_ids=[1, 2, 3]))
    engine.run()
    return engine


def test_advance_ends_aborted_and_failed_requests_without_making_outputs():
    """`Engine.advance` (a replay's step: no outputs made) reports an abort's end and a failing
    step's ends into the metrics only: the cancelled and the failed requests end as in `step`."""
    def boom(plan):
        if plan.step == 2:
            raise RuntimeError("device lost")

    engine = make_engine(executor=RecordingExecutor(on_execute=boom))
    engine.add_request(request("A", 4, max_new=5))
    engine.add_request(request("B", 4, max_new=5))
    assert engine.advance() is None
    assert engine.abort("B") is True
    assert engine.advance() is None  # B's end reported, then A's step fails
    assert not engine.has_unfinished()
    (a,), (b,) = engine.sequences("A"), engine.sequences("B")
    assert (a.finish_reason, a.error, a.num_output_tokens) == (FinishReason.FAILED, "RuntimeError: device lost", 1)
    assert (b.finish_reason, b.num_output_tokens) == (FinishReason.CANCELLED, 1)
    assert {r.id: r.finish_reason for r in engine.metrics.requests} == {"A": "failed", "B": "cancelled"}
    assert_pool_drained(engine)
