"""Regressions of issue 7's hangs (findings 1-4 and 6): each reproduction must end, or fail with a
one-line error that names the plugin and hook, never hang."""

from __future__ import annotations

import itertools

import pytest
from conftest import assert_pool_drained, live_tables, request, tokens

from metroline.cli import main
from metroline.core.conformance.kv_shadow import KVShadow
from metroline.core.config import EngineConfig
from metroline.core.errors import NoProgressError, PluginError
from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.step.engine import Engine


def run_bounded(engine: Engine, max_steps: int) -> int:
    """Step until nothing is left (checking the pool invariant); fails past `max_steps` steps."""
    steps = 0
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
        steps += 1
        assert steps <= max_steps, f"not finished after {steps} steps ({engine.scheduler.total_preemptions} preemptions)"
    return steps


def test_finding_1_weighted_fair_on_a_tight_pool_finishes(tmp_path, capsys):
    csv = tmp_path / "wf6.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,tenant\n"
                   + "".join(f"0,60,40,{t}\n" for t in "abcabc"))
    assert main(["run", "--workload", str(csv), "--policy", "weighted_fair", "--num-blocks", "8",
                 "--max-prefill-chunk", "16"]) == 0
    out = capsys.readouterr().out
    assert "completed                      6" in out
    # the same with the older admission options (admit after preemption, first-chunk gate)
    engine = Engine(EngineConfig(policy="weighted_fair", num_blocks=8, max_prefill_chunk=16,
                                 admit_after_preemption=True, admission_gate="first_chunk"))
    for i, t in enumerate("abcabc"):
        engine.add_request(request(f"r{i}", 60, max_new=40, tenant=t, arrival_time=0.0))
    # 6 x (60 + 40) tokens; 8 blocks of 16 hold one request (100 tokens, 7 blocks) at a time
    run_bounded(engine, 20 * 600)
    assert all(engine.sequences(f"r{i}")[0].num_output_tokens == 40 for i in range(6))
    assert_pool_drained(engine)


# 7 requests (prompt, output) of a few hundred tokens that token_rr preempted in turns for ever
# (half-prefilled requests displacing each other) before the no-livelock rule
# (321 tokens: exactly the pool, 107 blocks of 3)
TOKEN_RR_LIVELOCK = [(297, 24), (120, 76), (300, 21), (307, 14), (300, 21), (300, 21), (300, 21)]


def test_finding_2_token_rr_half_prefilled_requests_do_not_preempt_each_other_for_ever():
    engine = Engine(EngineConfig(
        policy="token_rr", block_size=3, num_blocks=107, enable_prefix_caching=False, max_num_batched_tokens=7,
        max_prefill_chunk=5, admit_after_preemption=True, admission_gate="first_chunk",
    ))
    for i, (p, o) in enumerate(TOKEN_RR_LIVELOCK):
        engine.add_request(request(f"r{i}", tokens(i + 1, p), max_new=o))
    total = sum(p + o for p, o in TOKEN_RR_LIVELOCK)
    from metroline.core.plugins.preemption import is_protected

    protected_seen = []
    steps = 0
    while engine.has_unfinished():
        engine.step()
        protected_seen.extend(s.seq_id for s in engine.scheduler.waiting if is_protected(s))
        steps += 1
        assert steps <= 20 * total, f"livelock: {engine.scheduler.total_preemptions} preemptions"
    assert protected_seen  # the rule was needed here
    assert all(s.finish_reason.value == "length" for r in range(7) for s in engine.sequences(f"r{r}"))
    assert_pool_drained(engine)


def test_finding_3_a_partial_prefix_hit_never_needs_more_blocks_than_a_cold_start():
    engine = Engine(EngineConfig(num_blocks=4, block_size=16, prefix_match="token"))
    a = tokens(1, 40)
    engine.add_request(request("A", a, max_new=9))
    engine.run()
    # B = A's prompt + 10 tokens, 14 out: 64 tokens, the 4 blocks of the pool. A's third block
    # (prompt tokens 32-39 + 8 outputs) matches B in part; sharing it would hold it and need a
    # copy: 5 blocks. The part-match is dropped and B runs as on a cold cache.
    engine.add_request(request("B", a + tokens(2, 10), max_new=14))
    run_bounded(engine, 200)
    b = engine.sequences("B")[0]
    assert b.num_output_tokens == 14 and b.num_cached_prompt_tokens == 32
    assert_pool_drained(engine)


def test_a_partial_prefix_hit_that_fits_is_still_shared():
    engine = Engine(EngineConfig(num_blocks=8, block_size=16, prefix_match="token"))
    a = tokens(1, 40)
    engine.add_request(request("A", a, max_new=9))
    engine.run()
    engine.add_request(request("B", a + tokens(2, 10), max_new=14))
    engine.run()
    assert engine.sequences("B")[0].num_cached_prompt_tokens == 40  # 2 full blocks + 8 tokens


class AllToDecode:
    """Gives the whole budget to decodes, nothing to prefill (finding 4's state: the decode share
    of swapped decoding requests took the budget, and the head-of-line candidate is a prefill)."""

    name = "all_to_decode"

    @hookimpl
    def split_budget(self, ctx, budget):
        from metroline.core.plugins.budget import Split

        return Split(budget, 0, ctx.config.prefill_chunk)


def test_finding_4_the_core_serves_the_oldest_request_when_the_plugins_schedule_nothing():
    engine = Engine(EngineConfig(block_size=4, num_blocks=16, max_num_batched_tokens=8), plugins=[AllToDecode()])
    engine.add_request(request("old", 10, max_new=3))
    engine.add_request(request("new", 5, max_new=3))
    steps = run_bounded(engine, 100)
    old, new = engine.sequences("old")[0], engine.sequences("new")[0]
    assert old.num_output_tokens == new.num_output_tokens == 3
    assert old.first_token_time < new.first_scheduled_time  # the oldest first, one at a time
    # old: 10-token prompt in chunks of 8 (2 steps), 2 decodes (the decode share serves it once
    # it decodes); then new likewise (1 prefill step, 2 decodes)
    assert steps == 7 and engine.scheduler.rescues == 3


@pytest.mark.parametrize("debug", [False, True])
def test_a_rescue_is_logged_in_debug_mode_only(debug):
    from structlog.testing import capture_logs

    engine = Engine(EngineConfig(block_size=4, num_blocks=16, max_num_batched_tokens=8, debug=debug),
                    plugins=[AllToDecode()])
    engine.add_request(request("old", 10, max_new=3))
    with capture_logs() as logs:
        run_bounded(engine, 100)
    rescues = [e for e in logs if e["event"] == "scheduler.rescue"]
    assert engine.scheduler.rescues == 2  # the prompt's two chunks; its decodes take the decode share
    assert len(rescues) == (2 if debug else 0)
    assert all(e["request_id"] == engine.sequences("old")[0].seq_id for e in rescues)


def test_the_rescue_does_not_override_a_plugin_that_holds_requests_back():
    class Nobody:
        name = "nobody"

        @hookimpl
        def admission(self):
            return ()

    engine = Engine(EngineConfig(), plugins=[Nobody()])
    engine.add_request(request("r0", 3))
    with pytest.raises(NoProgressError) as err:
        engine.run()
    text = str(err.value)
    assert "1000 steps scheduled nothing with 0 running, 1 waiting" in text
    assert "nobody" in text and "r0 waiting needs 1 blocks of 16 tokens" in text
    assert "admission offered nothing" in text
    assert engine.scheduler.rescues == 0


class Cycling:
    """An admission generator that never ends: it cycles over the waiting requests (none of which
    fits while `big` runs), skipping instead of stopping at one that does not fit."""

    name = "cycling"

    def __init__(self, over: str = "waiting") -> None:
        self.over = over
        self.pulls = 0
        self.on = False

    def _endless(self, seqs):
        for s in itertools.cycle(seqs):
            self.pulls += 1
            if self.pulls > 100_000:
                raise AssertionError("pulled without end")
            yield s

    @hookimpl
    def admission(self, ctx):
        seqs = list(ctx.waiting if self.over == "waiting" else ctx.running)
        if not seqs or not self.on:
            return None
        return Candidates(self._endless(seqs), head_of_line=False)


@pytest.mark.parametrize("over", ["waiting", "running"])
def test_finding_6_an_endless_admission_generator_is_a_plugin_error(over):
    cycling = Cycling(over)
    engine = Engine(EngineConfig(block_size=4, num_blocks=8, max_prefill_chunk=4, max_num_batched_tokens=8),
                    plugins=[cycling])
    engine.add_request(request("big", 20, max_new=8))
    engine.step()  # the default admission admits big; w1 and w2 (5 blocks each) will not fit beside it
    cycling.on = True
    engine.add_request(request("w1", 20, max_new=8))
    engine.add_request(request("w2", 20, max_new=8))
    with pytest.raises(PluginError, match="'cycling', hook 'admission': admission yielded more candidates than are queued"):
        for _ in range(5):
            engine.step()


def test_no_progress_is_one_line_from_the_cli(tmp_path, capsys):
    csv = tmp_path / "one.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    assert main(["run", "--workload", str(csv), "--plugin", "test_progress_regressions:NeverAdmits"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metroline: error: 1000 steps scheduled nothing")
    assert "never_admits" in err[0] and "Traceback" not in err[0]


class NeverAdmits:
    name = "never_admits"

    @hookimpl
    def admission(self):
        return ()


class OldestVictim:
    """Always names the oldest running request as the victim, for running and waiting requesters
    alike: younger requests displace older ones, the pattern of a livelock of mutual preemption."""

    name = "oldest_victim"

    @hookimpl
    def select_victim(self, ctx, requester):
        return min(ctx.running, key=lambda s: s.arrival_no) if ctx.running else None


def test_a_protected_request_is_not_displaced_by_a_younger_one():
    # two requests of 24 prompt + 8 output tokens: each fits the 8 blocks of 4 alone, not together
    engine = Engine(EngineConfig(block_size=4, num_blocks=8, max_prefill_chunk=8, max_num_batched_tokens=16,
                                 enable_prefix_caching=False, admission_gate="first_chunk",
                                 admit_after_preemption=True), plugins=[OldestVictim()])
    engine.add_request(request("old", 24, max_new=8))
    engine.add_request(request("young", 24, max_new=8))
    seen = []
    steps = 0
    while engine.has_unfinished():
        engine.step()
        ctx = engine.scheduler.ctx
        seen.extend(s.seq_id for s in (*ctx.running, *ctx.waiting) if ctx.is_protected(s))
        steps += 1
        assert steps <= 20 * 64, f"livelock: {engine.scheduler.total_preemptions} preemptions"
    assert "old" in seen
    old, young = engine.sequences("old")[0], engine.sequences("young")[0]
    assert old.num_output_tokens == young.num_output_tokens == 8
    assert old.finish_time < young.finish_time  # once protected, old runs to the end
    assert_pool_drained(engine)


def test_a_candidate_whose_admission_preempts_the_registrant_of_its_hit_matches_again():
    # block size 1: r1 (priority 1) computes the shared prefix token 9100002 into a block registered
    # in the step; r2 (priority 0, same prefix) hits that block, then needs a block and the
    # priority policy preempts r1 for it: r1's block will not be written, so r2 must not use it
    executor = KVShadow()
    engine = Engine(EngineConfig(
        block_size=1, num_blocks=8, policy="priority", plugins=["decode_first", "slo_classes"],
        plugin_options={"slo_classes": {"classes": {"a": "interactive"}}}, max_num_seqs=3,
        max_num_batched_tokens=4, max_prefill_chunk=1,
    ), executor)
    executor.engine = engine
    shared = [9100001, 9100002]
    for rid, prompt, priority, out, n in [
        ("r0", [100001], 0, 1, 1), ("r1", shared + [200001], 1, 1, 1), ("r2", shared + [300001], 0, 1, 2),
        ("r3", [400001], 0, 2, 1), ("r4", [500001], 0, 1, 1),
    ]:
        engine.add_request(request(rid, prompt, max_new=out, n=n, tenant="a", priority=priority))
    run_bounded(engine, 100)
    assert executor.errors == []
    assert all(s.finish_reason.value == "length" for r in ("r0", "r1", "r2", "r3", "r4") for s in engine.sequences(r))
    assert_pool_drained(engine)
