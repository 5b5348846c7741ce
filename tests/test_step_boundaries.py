"""Boundary and referee cases of one scheduler step (`metroline.core.step`) and of the core's
no-livelock rule (`metroline.core.plugins.preemption`), each pinning one behaviour exactly: a
change of one comparison, count or guard in those modules fails one of them (bench/mutate.py,
bench/mutation.toml)."""

from __future__ import annotations

import pytest
from conftest import assert_pool_drained, make_engine, request, run_to_end, tokens

from metroline.core.errors import NoProgressError, PluginError
from metroline.core.plugins.budget import Split
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.preemption import Preempt, is_protected, older, substitute
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import RUNNING, WAITING, Sequence
from metroline.core.step.plan import StepPlan
from metroline.core.step.scheduler import Scheduler
from metroline.core.step.stall import is_stalled
from metroline.core.step.step_state import Reserves, StepState


class Twice:
    """`order_running` listing the first running sequence twice."""

    name = "twice"

    @hookimpl
    def order_running(self, running):
        return [running[0], *running]


def test_an_order_running_answer_listing_a_sequence_twice_is_refused():
    # the hook's answer is a permutation or subset of `running`: a sequence listed twice would be
    # served twice in one step (its tokens scheduled twice, its blocks grown twice)
    engine = make_engine(plugins=[Twice()])
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 4, max_new=4))
    engine.step()  # admission; order_running is asked once something runs
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("twice", "order_running")
    assert "is listed twice" in info.value.problem


# --- the no-livelock rule: is_protected, older, substitute (metroline.core.plugins.preemption) ---


def _seq(rid, arrival_no, *, index=0, stalls=0, mark=-1, computed=0, running=True):
    seq = Sequence(rid, [1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(), 0.0,
                   arrival_no=arrival_no, index=index, seq_id=f"{rid}-{index}")
    seq.stalls, seq.stall_mark, seq.num_computed_tokens = stalls, mark, computed
    seq.state = RUNNING if running else WAITING
    return seq


def test_protection_starts_at_the_second_stall_and_holds_up_to_the_mark_itself():
    # docs/architecture.md, "The progress guarantee": preempted twice in a row without computing
    # past its mark, a request is protected until it computes past the mark
    assert not is_protected(_seq("a", 0, stalls=1, mark=8, computed=0))
    assert is_protected(_seq("a", 0, stalls=2, mark=8, computed=0))
    assert is_protected(_seq("a", 0, stalls=2, mark=8, computed=8))  # at the mark: not past it
    assert not is_protected(_seq("a", 0, stalls=2, mark=8, computed=9))
    assert not is_protected(_seq("a", 0, stalls=0, mark=-1, computed=0))


def test_older_is_strict_and_orders_samples_of_one_request_by_index():
    a0, a1, b = _seq("a", 3, index=0), _seq("a", 3, index=1), _seq("b", 4)
    assert older(a0, a1) and older(a1, b) and older(a0, b)
    assert not older(a1, a0) and not older(b, a0)
    assert not older(a0, a0)


def test_substitute_prefers_an_unprotected_victim_to_a_younger_protected_one():
    requester = _seq("r", 0)
    unprotected = _seq("u", 1)
    protected = _seq("p", 2, stalls=2, mark=8, computed=8)  # the youngest, but protected
    assert substitute([requester, unprotected, protected], requester) is unprotected
    # past its mark it is protected no more, and the youngest goes
    protected.num_computed_tokens = 9
    assert substitute([requester, unprotected, protected], requester) is protected


def test_substitute_takes_the_youngest_unprotected_never_the_requester_itself():
    requester = _seq("r", 5)  # the youngest of all
    old, mid0, mid1 = _seq("o", 1), _seq("m", 2, index=0), _seq("m", 2, index=1)
    # an unprotected request may be displaced even by a younger one; the youngest such goes, and
    # of two samples of one request the later index is the younger
    assert substitute([old, requester, mid0, mid1], requester) is mid1
    assert substitute([mid1, mid0, old, requester], requester) is mid1


def test_substitute_never_takes_an_older_protected_request_and_then_the_requester_yields():
    guarded = _seq("g", 1, stalls=2, mark=8, computed=4)
    requester = _seq("r", 2)
    assert substitute([guarded, requester], requester) is requester  # running: it yields itself
    waiting = _seq("w", 3, running=False)
    assert substitute([guarded], waiting) is None  # waiting: it stays where it is


def test_substitute_for_a_protected_requester_only_takes_younger_requests():
    requester = _seq("r", 2, stalls=2, mark=8, computed=4)
    older_one, younger_one = _seq("o", 1), _seq("y", 3)
    assert substitute([older_one, requester, younger_one], requester, younger_only=True) is younger_one
    assert substitute([older_one, requester], requester, younger_only=True) is requester
    assert substitute([older_one, requester], requester) is older_one  # without younger_only


# --- progress: a recompute that only reaches its high-water mark (metroline.core.step.scheduler) ---


def test_a_recompute_that_only_reaches_its_high_water_mark_is_not_progress():
    seq = _seq("a", 0, computed=4)
    seq.max_computed = 8  # it had computed 8 tokens before a preemption
    plan = StepPlan(1, 4)
    plan.scheduled[seq] = 4  # back to 8: recomputation only
    assert not Scheduler.progresses(plan)
    plan.scheduled[seq] = 5  # token 9 is new
    assert Scheduler.progresses(plan)
    plan.scheduled[seq] = 4
    plan.sample_seqs.append(seq)  # a sampled token is progress
    assert Scheduler.progresses(plan)


# --- the step's budget bookkeeping (metroline.core.step.step_state) -----------------------------


def test_dropping_a_scheduled_sequence_gives_back_exactly_its_tokens_drafts_and_chunk():
    engine = make_engine()
    for rid in ("plain", "drafting", "prefill"):
        engine.add_request(request(rid, 4, max_new=4))
    plain, drafting, prefill = (engine.sequences(r)[0] for r in ("plain", "drafting", "prefill"))
    state = StepState(StepPlan(1, 4), engine.scheduler.ctx, None)
    state.set_budget(16, 16, 2)
    plan = state.plan
    state.schedule(plain, 1, True)  # a decode without drafts
    state.schedule(drafting, 3, True, drafts=2)  # a decode carrying 2 drafts
    state.schedule(prefill, 4, False)
    plan.admitted.append(prefill)
    assert (plan.num_decode_tokens, plan.num_draft_tokens, plan.num_prefill_tokens) == (4, 2, 4)
    assert (state.decode_left, state.prefill_left, state.prefills_left) == (12, 12, 1)
    state.drop(plain)  # carried no drafts: the drafts of the step stay as they are
    assert (plan.num_decode_tokens, plan.num_draft_tokens, plan.drafts) == (3, 2, {drafting: 2})
    assert state.decode_left == 13
    state.drop(drafting)
    assert (plan.num_decode_tokens, plan.num_draft_tokens, plan.drafts) == (0, 0, {})
    assert state.decode_left == 16
    state.drop(prefill)  # its chunk, its tokens and its admission go back
    assert (plan.num_prefill_tokens, state.prefill_left, state.prefills_left) == (0, 16, 2)
    assert plan.admitted == [] and plan.scheduled == {} and plan.num_context_tokens == 0
    state.drop(prefill)  # not scheduled (any more): nothing changes
    assert (state.decode_left, state.prefill_left, state.prefills_left) == (16, 16, 2)


def test_one_budget_charges_both_views_and_a_victim_gives_its_tokens_back_to_both():
    # budget_mode "one" (vLLM's one token budget): a prefill spends the decodes' tokens too, and
    # the other way round; a dropped victim's tokens return to the one budget
    engine = make_engine()
    for rid in ("decode", "prefill"):
        engine.add_request(request(rid, 4, max_new=4))
    decode, prefill = (engine.sequences(r)[0] for r in ("decode", "prefill"))
    state = StepState(StepPlan(1, 4), engine.scheduler.ctx, None, one_budget=True)
    state.set_budget(16, 16, 2)  # one budget of 16 (the split phase sums the shares), seen by both views
    state.schedule(prefill, 10, False)
    assert (state.decode_left, state.prefill_left, state.prefills_left, state.tokens_left()) == (6, 6, 1, 6)
    state.schedule(decode, 3, True, drafts=2)
    assert (state.decode_left, state.prefill_left, state.tokens_left()) == (3, 3, 3)
    state.drop(prefill)
    assert (state.decode_left, state.prefill_left, state.prefills_left) == (13, 13, 2)
    state.drop(decode)
    assert (state.decode_left, state.prefill_left, state.tokens_left()) == (16, 16, 16)


# --- max_prefills on running prefills (metroline.core.step.running) -----------------------------


class OnePrefillAfterTheFirstStep:
    """`split_budget`: the default split, but from the second step on at most one prefill chunk."""

    name = "one_prefill"

    @hookimpl
    def split_budget(self, ctx, budget, num_decoding):
        decode = min(budget, num_decoding)
        return Split(decode, budget - decode, 4, None if ctx.step == 1 else 1)


def test_max_prefills_caps_the_chunks_of_running_prefills_too():
    engine = make_engine(plugins=[OnePrefillAfterTheFirstStep()], enable_prefix_caching=False)
    engine.add_request(request("A", 16, max_new=2))
    engine.add_request(request("B", 16, max_new=2))
    run_to_end(engine)
    got = [p.scheduled for p in engine.executor.plans]
    # both start in step 1; then one chunk a step: A's prompt to its end, then B's alongside A's
    # decodes (a decode is no prefill chunk)
    assert got == [
        {"A": 4, "B": 4}, {"A": 4}, {"A": 4}, {"A": 4},
        {"A": 1, "B": 4}, {"B": 4}, {"B": 4}, {"B": 1},
    ]
    assert_pool_drained(engine)


# --- a block filled exactly at the end of the step (metroline.core.step.step_state) -------------


def test_a_block_filled_exactly_at_the_end_of_the_step_is_shared_in_that_step():
    prefix = [7, 8, 9, 10, 11, 12, 13, 14]  # two blocks of 4
    engine = make_engine()
    engine.add_request(request("r0", prefix, max_new=2))  # its prompt ends on a block boundary
    engine.add_request(request("r1", prefix + [100], max_new=2))
    engine.step()
    plan = engine.executor.plans[0]
    assert plan.scheduled == {"r0": 8, "r1": 1} and plan.starts == {"r0": 0, "r1": 8}
    r0, r1 = engine.sequences("r0")[0], engine.sequences("r1")[0]
    assert r1.block_table[:2] == r0.block_table[:2]
    assert r0.num_cached_blocks == 2
    run_to_end(engine)
    assert_pool_drained(engine)


# --- the victim the core substitutes for a plugin's (metroline.core.step.victim_loop) ------------


class OldestVictim:
    """`select_victim`: always the oldest running request, whoever asks."""

    name = "oldest_victim"

    @hookimpl
    def select_victim(self, ctx, requester):
        return min(ctx.running, key=lambda s: s.arrival_no) if ctx.running else None


def _old_and_young(**config):
    engine = make_engine(plugins=[OldestVictim()], **config)
    engine.add_request(request("old", 8, max_new=8))
    engine.add_request(request("young", 8, max_new=8))
    engine.step()
    old, young = engine.sequences("old")[0], engine.sequences("young")[0]
    assert old.state is RUNNING and young.state is RUNNING
    return engine.scheduler.room, old, young


def _stall(seq, stalls):
    seq.stalls, seq.stall_mark = stalls, seq.num_computed_tokens


def test_a_protected_victim_is_replaced_from_the_second_stall_on():
    room, old, young = _old_and_young()
    _stall(old, 1)  # one stall: not protected, the plugin's victim stands
    assert room.victim(young, "blocks") == Preempt(old, "recompute")
    _stall(old, 2)  # protected: the younger requester yields instead
    assert room.victim(young, "blocks") == Preempt(young, "recompute")
    old.num_computed_tokens += 1  # past its mark: no longer protected
    assert room.victim(young, "blocks") == Preempt(old, "recompute")


def test_a_protected_requester_named_as_its_own_victim_takes_a_younger_one():
    room, old, young = _old_and_young()
    _stall(old, 2)
    assert room.victim(old, "blocks") == Preempt(young, "recompute")
    _stall(old, 1)
    assert room.victim(old, "blocks") == Preempt(old, "recompute")


def test_without_protect_stalled_the_plugins_victim_stands():
    room, old, young = _old_and_young(protect_stalled=False)
    _stall(old, 2)
    assert room.victim(young, "blocks") == Preempt(old, "recompute")
    assert room.victim(old, "blocks") == Preempt(old, "recompute")


# --- admission: the blocks a prefix hit needs, at the exact boundary (metroline.core.step.admission)


def _after(a_prompt, b_prompt, b_new, **config):
    """A runs to its end alone; then B (sharing a prefix with A's prompt) is added; B's engine."""
    engine = make_engine(**config)
    engine.add_request(request("A", a_prompt, max_new=9))
    run_to_end(engine)
    engine.add_request(request("B", b_prompt, max_new=b_new))
    return engine


def test_a_full_block_hit_is_admitted_when_its_blocks_fill_the_pool_exactly():
    # A's 32 prompt tokens + 8 outputs: 3 blocks of 16, all cached once it ends; B = A's 2 prompt
    # blocks + 15 tokens + 1 output: its 2 hit blocks and 1 new one are exactly the pool
    a = tokens(1, 32)
    engine = _after(a, a + tokens(2, 15), 1, num_blocks=3, block_size=16)
    engine.step()
    plan = engine.executor.plans[-1]
    assert plan.admitted == ["B"] and plan.scheduled == {"B": 15} and plan.starts == {"B": 32}
    assert engine.sequences("B")[0].num_cached_prompt_tokens == 32
    run_to_end(engine)
    assert_pool_drained(engine)


@pytest.mark.parametrize("num_blocks, cached", [(4, 32), (5, 40)])
def test_a_partial_hit_is_shared_exactly_when_its_copy_still_fits(num_blocks, cached):
    # B = A's 40 prompt tokens + 10, 14 out (64 tokens: 4 blocks of 16). A's third block matches
    # B in its first 8 tokens; sharing it holds it and copies it at B's first write: 5 blocks.
    # On 5 blocks that fits and B starts at token 40; on 4 the part-match is dropped (start 32).
    a = tokens(1, 40)
    engine = _after(a, a + tokens(2, 10), 14, num_blocks=num_blocks, block_size=16, prefix_match="token")
    engine.step()
    plan = engine.executor.plans[-1]
    assert plan.admitted == ["B"] and plan.starts == {"B": cached} and plan.scheduled == {"B": 50 - cached}
    assert engine.sequences("B")[0].num_cached_prompt_tokens == cached
    run_to_end(engine)
    assert engine.sequences("B")[0].num_output_tokens == 14
    assert_pool_drained(engine)


def test_a_blocked_admission_leaves_the_request_as_it_was():
    # A holds 5 of the 6 blocks once it decodes; B shares A's first 2 blocks but needs 3 more:
    # blocked (fcfs never preempts for a waiting request). B keeps no block, no reference on the
    # blocks of its hit, and no computed token (a policy reads what a waiting request has left)
    engine = make_engine(num_blocks=6)
    a = tokens(1, 16)
    engine.add_request(request("A", a, max_new=8))
    engine.step()
    engine.add_request(request("B", a[:8] + tokens(2, 12), max_new=2))
    engine.step()
    assert engine.executor.plans[-1].admitted == []
    b, a_seq = engine.sequences("B")[0], engine.sequences("A")[0]
    assert b.state is WAITING and b.num_computed_tokens == 0 and b.block_table == []
    assert len(a_seq.block_table) == 5
    assert [engine.pool.ref_count(x) for x in a_seq.block_table] == [1] * 5
    run_to_end(engine)
    assert_pool_drained(engine)


class VictimR1:
    """`select_victim`: r1 for r2 (r1 was admitted earlier in the same step)."""

    name = "victim_r1"

    @hookimpl
    def select_victim(self, ctx, requester):
        if requester.request_id == "r2":
            return next((s for s in ctx.running if s.request_id == "r1"), None)
        return None


def test_a_candidate_whose_hit_loses_its_registrant_matches_again_from_scratch():
    # r1 computes the 8-token prefix into 2 blocks registered in this step; r2, later in the same
    # step, hits them, lacks a third block and the plugin names r1 as the victim. r1's blocks
    # will not be written now: r2 must match again (nothing) and compute from token 0
    prefix = tokens(1, 8)
    engine = make_engine(num_blocks=5, plugins=[VictimR1()])
    engine.add_request(request("r1", prefix + [1], max_new=2))
    engine.add_request(request("r2", prefix + tokens(2, 11), max_new=1))
    engine.step()
    plan = engine.executor.plans[0]
    assert plan.preempted == [("r1", "WAITING")]
    assert plan.admitted == ["r2"] and plan.scheduled == {"r2": 19} and plan.starts == {"r2": 0}
    assert engine.sequences("r2")[0].num_cached_prompt_tokens == 0
    run_to_end(engine)
    assert_pool_drained(engine)


class Waiting:
    """`order_running`: the running sequences and a waiting one."""

    name = "waiting_too"

    @hookimpl
    def order_running(self, ctx, running):
        return [*running, *ctx.waiting]


def test_an_order_running_answer_naming_a_waiting_sequence_is_refused():
    engine = make_engine(plugins=[Waiting()], max_num_seqs=1)
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 4, max_new=4))  # no slot: waits
    engine.step()
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("waiting_too", "order_running")
    assert "is not a running sequence" in info.value.problem


class OnePrefill:
    """`split_budget`: the default split, at most one prefill chunk a step."""

    name = "one_prefill"

    @hookimpl
    def split_budget(self, ctx, budget, num_decoding):
        decode = min(budget, num_decoding)
        return Split(decode, budget - decode, 4, 1)


def test_max_prefills_caps_admissions_while_prefill_tokens_are_left():
    engine = make_engine(plugins=[OnePrefill()], enable_prefix_caching=False)
    engine.add_request(request("A", 8, max_new=2))
    engine.add_request(request("B", 8, max_new=2))
    run_to_end(engine)
    # B waits although 60 prefill tokens are left in step 1: one chunk a step
    assert [(p.admitted, p.scheduled) for p in engine.executor.plans] == [
        (["A"], {"A": 4}), ([], {"A": 4}), (["B"], {"A": 1, "B": 4}), ([], {"B": 4}), ([], {"B": 1}),
    ]
    assert_pool_drained(engine)


# --- the stall test and its error (metroline.core.step.stall) -----------------------------------


def test_a_stall_is_max_idle_steps_of_nothing_or_that_plus_a_pool_of_recomputation():
    assert not is_stalled(9, 10, True, 100)
    assert is_stalled(10, 10, True, 100)  # nothing scheduled for max_idle_steps steps
    assert not is_stalled(10, 10, False, 100)  # recomputation: up to max_kv_tokens steps more
    assert not is_stalled(109, 10, False, 100)
    assert is_stalled(110, 10, False, 100)


def test_the_stall_error_names_the_three_oldest_requests_in_arrival_order():
    class Nobody:
        name = "nobody"

        @hookimpl
        def admission(self):
            return ()

    engine = make_engine(plugins=[Nobody()])
    for rid in ("r0", "r1", "r2", "r3"):
        engine.add_request(request(rid, 3))
    with pytest.raises(NoProgressError) as err:
        engine.run()
    text = str(err.value)
    assert text.startswith("1000 steps scheduled nothing with 0 running, 4 waiting and 0 swapped requests")
    oldest = text.split("oldest: ")[1].split("; ")
    assert [entry.split(" ")[0] for entry in oldest] == ["r0", "r1", "r2"]
    assert all(entry.endswith("admission offered nothing and nothing runs") for entry in oldest)


# --- the bound on admission's candidates (metroline.core.step.admission) ------------------------


class Endless:
    """`admission`: the first waiting request, again and again (an endless generator)."""

    name = "endless"

    def __init__(self):
        self.pulled = 0

    @hookimpl
    def admission(self, ctx):
        first = next(iter(ctx.waiting))

        def candidates():
            while True:
                self.pulled += 1
                yield first

        return candidates()


def test_admission_may_pull_twice_the_queued_requests_plus_eight_candidates():
    # one request queued: 2 x 1 + 8 = 10 candidates (the first admits it, the other nine are
    # stale); the eleventh pull is an endless generator's
    endless = Endless()
    engine = make_engine(plugins=[endless])
    engine.add_request(request("A", 4, max_new=4))
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("endless", "admission")
    assert "more candidates than are queued" in info.value.problem
    assert endless.pulled == 10


# --- split_budget's answer, checked against the budget (metroline.core.step.split) -------------


class Answer:
    """`split_budget`: a fixed answer."""

    name = "fixed_split"

    def __init__(self, answer):
        self.answer = answer

    @hookimpl
    def split_budget(self, ctx, budget):
        return self.answer


def test_a_plain_three_tuple_split_is_accepted():
    engine = make_engine(plugins=[Answer((0, 64, 4))])  # (decode, prefill, max_chunk)
    engine.add_request(request("A", 8, max_new=1))
    engine.step()
    assert engine.executor.plans[0].scheduled == {"A": 4}


@pytest.mark.parametrize("answer", [
    Split(-1, 8, 8), Split(0, -1, 8), Split(32, 33, 8), Split(0, 8, 0), Split(0, 8, 8, -1), (0, 8),
])
def test_a_split_outside_the_budget_is_refused(answer):
    engine = make_engine(plugins=[Answer(answer)])  # budget: 64 tokens
    engine.add_request(request("A", 8, max_new=1))
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("fixed_split", "split_budget")


@pytest.mark.parametrize("answer, rescues", [(Split(0, 64, 1), 0), (Split(32, 32, 8, 0), 1), (Split(64, 0, 8), 1)])
def test_a_split_at_the_edges_of_the_budget_is_accepted(answer, rescues):
    # a chunk of 1, no prefill chunk at all, no prefill token at all: accepted; the last two
    # leave the step empty, and the core serves the oldest request itself (a chunk of 8)
    engine = make_engine(plugins=[Answer(answer)])
    engine.add_request(request("A", 8, max_new=1))
    engine.step()
    assert engine.executor.plans[0].scheduled == {"A": 1 if answer.max_chunk == 1 else 8}
    assert engine.scheduler.rescues == rescues


class Names:
    """`select_victim`: whatever `pick(ctx)` returns."""

    name = "names"

    def __init__(self, pick):
        self.pick = pick

    @hookimpl
    def select_victim(self, ctx, requester):
        return self.pick(ctx)


@pytest.mark.parametrize("pick, problem", [
    (lambda ctx: next(iter(ctx.waiting)), "is not a running sequence"),
    (lambda ctx: Preempt(next(iter(ctx.running)), "evict"), "unknown preemption mode 'evict'"),
])
def test_a_victim_that_is_not_running_or_a_mode_that_does_not_exist_is_refused(pick, problem):
    engine = make_engine(plugins=[Names(pick)], max_num_seqs=1)
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 4, max_new=4))  # no slot: B asks for a victim
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("names", "select_victim")
    assert problem in info.value.problem


def test_no_victim_named_preempts_a_running_requester_and_leaves_a_waiting_one_waiting():
    engine = make_engine(plugins=[Names(lambda ctx: None)], max_num_seqs=1)
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 4, max_new=4))
    engine.step()
    a, b = engine.sequences("A")[0], engine.sequences("B")[0]
    assert engine.scheduler.room.victim(a, "blocks") == Preempt(a, "recompute")
    assert engine.scheduler.room.victim(b, "slots") is None


# --- reserves, a fresh plan, arrivals -------------------------------------------------------------


def test_a_tenants_reserve_is_charged_only_for_what_was_scheduled():
    engine = make_engine()
    for rid in ("p", "d", "idle"):
        engine.add_request(request(rid, 4, max_new=4, tenant="a"))
    p, d, idle = (engine.sequences(r)[0] for r in ("p", "d", "idle"))
    state = StepState(StepPlan(1, 4), engine.scheduler.ctx, None)
    state.set_budget(16, 32, 4)
    reserves = Reserves({"a": 0.5, "b": 0.01}, 16, 32)
    assert (reserves.decode, reserves.prefill) == ({"a": 8}, {"a": 16})  # b's share rounds to 0
    reserves.spend(idle, state)  # not scheduled: nothing charged
    assert (reserves.decode, reserves.prefill) == ({"a": 8}, {"a": 16})
    state.schedule(p, 5, False)
    reserves.spend(p, state)
    state.schedule(d, 1, True)
    reserves.spend(d, state)
    assert (reserves.decode, reserves.prefill) == ({"a": 7}, {"a": 11})
    assert reserves.left(p, False) == 11 and reserves.left(d, True) == 7
    assert reserves.prefill_outstanding() == 11


def test_a_fresh_plan_has_no_budget_left_and_nothing_in_it():
    plan = StepPlan(3, 4)
    assert (plan.decode_left, plan.prefill_left, plan.prefills_left) == (0, 0, 0)
    assert (plan.num_prefill_tokens, plan.num_decode_tokens, plan.num_draft_tokens) == (0, 0, 0)
    assert plan.is_empty and plan.num_tokens == 0


def test_a_request_arriving_later_is_not_scheduled_before_its_arrival_time():
    engine = make_engine()
    engine.add_request(request("later", 4, max_new=2, arrival_time=0.5))
    engine.run()
    later = engine.sequences("later")[0]
    assert later.first_scheduled_time >= 0.5


def test_ctx_fail_outside_the_sample_hook_is_a_runtime_error():
    engine = make_engine()
    engine.add_request(request("A", 4, max_new=2))
    engine.step()
    with pytest.raises(RuntimeError, match="during the sample hook"):
        engine.scheduler.ctx.fail(engine.sequences("A")[0], "no grammar here")
