"""The KV guard under test: the shadow model of every KV slot (`metroline.core.conformance.kv_shadow`)
finds what it must find (a swap-out of unwritten KV, a read of a rejected draft's slot, a leaked
device or host block), and a hypothesis property test runs random configurations through it
(`metroline.core.conformance.kv_chaos.draw_scenario`: block sizes 1-64, tiny pools, swap and
recompute, prefix caching by block and by token, `n > 1`, aborts, every shipped policy with
stacked plugins, n-gram speculation, the vLLM preset): no read of a slot holding other KV, no
leaked block, every request finished.

The property test is derandomized (a fixed sequence of examples, no example database), so the
suite does not flake; `KV_SHADOW_EXAMPLES` examples (`SHADOW_EXAMPLES` unless set), with or without
`--runslow`. The first 250 of that sequence already draw every policy, every stacking plugin, the
newest-victim plugin, each preemption mode, prefix caching off and by block and by token, the vLLM
preset, n-gram speculation at each acceptance rate, `n > 1` and aborts; in 500 the rarest of these (the
vLLM preset) comes 9 times. The search for configurations nobody thought of is `bench/kv_chaos.py
--configs 2000` (the same space, thousands of seeds).
"""

from __future__ import annotations

import os

from conftest import assert_pool_drained, make_engine, request, run_to_end
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_same_step_prefix import same_step_swap_engine

from metroline.core.conformance.kv_chaos import draw_scenario, run_scenario
from metroline.core.conformance.kv_shadow import KVShadow
from metroline.kv_backends.block_pool import BlockPool


class HypothesisDraw:
    """`kv_chaos.Draw` over hypothesis's `data`, so a failing example shrinks."""

    def __init__(self, data) -> None:
        self.data = data

    def integers(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.data.draw(st.sampled_from(options))

    def boolean(self) -> bool:
        return self.data.draw(st.booleans())


SHADOW_EXAMPLES = 500
"""The property test's examples in the suite, with or without `--runslow` (1000 under it before:
twice the CPU, for no policy, plugin, preemption mode or prefix mode the first 500 do not draw;
see the module docstring)."""


@settings(max_examples=int(os.environ.get("KV_SHADOW_EXAMPLES", SHADOW_EXAMPLES)), deadline=None, derandomize=True,
          database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_configurations_read_only_their_own_kv_and_leak_no_block(data):
    scenario = draw_scenario(HypothesisDraw(data))
    outcome = run_scenario(scenario)
    assert outcome.errors == [], f"{scenario.summary()}\nreplay: {scenario.to_json()}"


# --- the shadow finds what it must find ----------------------------------------------------------


def test_the_shadow_finds_a_swap_out_of_kv_the_step_has_yet_to_write(monkeypatch):
    # the pool without its pending-slot rule: the reproducer's victim b is swapped out in step 1
    # with a's prefix blocks, which the forward writes after the swap-out
    monkeypatch.setattr(BlockPool, "reads_pending", lambda self, table, num_computed=None: False)
    shadow = KVShadow()
    engine = shadow.attach(same_step_swap_engine(shadow))
    run_to_end(engine)
    assert shadow.errors[:2] == [
        "step 1: b swapped out with wrong KV at position 0 (host block 0, slot 0): it holds nothing (never written)",
        "step 1: b swapped out with wrong KV at position 4 (host block 1, slot 0): it holds nothing (never written)",
    ]
    # swapped back in, b reads the copy: the slots of positions 0..7 hold nothing
    assert any(e.startswith("step ") and "b reads wrong KV at position 0" in e for e in shadow.errors[2:])


def spec_engine():
    shadow = KVShadow()
    engine = shadow.attach(make_engine(executor=shadow, block_size=4, num_blocks=32, speculative_config={
        "num_speculative_tokens": 2, "acceptance_rate": 0.0, "num_lookahead_tokens": 0}))
    engine.add_request(request("a", [1, 2, 3, 4, 5], max_new=4))
    engine.step()  # the prompt
    engine.step()  # a decode at position 5 carrying drafts at 6 and 7, both rejected
    return shadow, engine, engine.sequences("a")[0]


def test_rejected_drafts_stay_draft_slots_until_rewritten():
    shadow, engine, seq = spec_engine()
    # rolled back: the token sampled after position 5 is at position 6, its KV not computed yet
    assert seq.num_computed_tokens == 6 and len(seq.token_ids) == 7
    held = shadow.device[seq.block_table[1]]
    assert held[2:4] == [("draft", "a", 6), ("draft", "a", 7)]
    engine.step()  # position 6 is written with its token's KV before it is read
    assert held[2] == shadow.keys(seq)[6]
    run_to_end(engine)
    assert shadow.errors == []
    assert_pool_drained(engine)


def test_the_shadow_finds_a_read_of_a_rejected_draft_slot():
    shadow, engine, seq = spec_engine()
    # a roll-back that would count the rejected draft at position 6 as computed (the sequence
    # then decodes at 7, reading 6): the slot holds the draft's KV, not the token's
    seq.num_computed_tokens = 7
    seq.token_ids.append(9)
    engine.step()
    assert shadow.errors[0] == "step 3: a reads wrong KV at position 6 (block 1, slot 2): it holds a draft of a at position 6"


def test_the_shadow_finds_leaked_device_and_host_blocks():
    shadow = KVShadow()
    engine = shadow.attach(make_engine(executor=shadow, preemption_mode="swap", swap_space_blocks=4))
    engine.add_request(request("a", 6, max_new=2))
    run_to_end(engine)
    assert shadow.check_drained() == []
    engine.pool.allocate_slots([], 0, 5, [])  # two blocks nobody will release
    engine.scheduler.swap.allocate(3)
    assert shadow.check_drained() == [
        "after the run: KV pool invariant: block 1: ref count 1 != 0 references in live tables",
        "after the run: 2 device blocks leaked (still referenced)",
        "after the run: 3 host blocks leaked",
    ]


def test_the_shadow_checks_host_blocks_against_the_swapped_tables_before_each_step():
    shadow = KVShadow()
    engine = shadow.attach(make_engine(executor=shadow, preemption_mode="swap", swap_space_blocks=4))
    engine.add_request(request("a", 6, max_new=3))
    engine.step()
    engine.scheduler.swap.allocate(1)  # a host block no swapped sequence holds
    engine.step()
    assert shadow.errors == ["step 2: 1 host blocks allocated, 0 held by swapped sequences"]


def test_a_drawn_scenario_replays_identically_from_its_json():
    from metroline.core.conformance.kv_chaos import RandomDraw, Scenario

    scenario = draw_scenario(RandomDraw(7))
    again = Scenario.from_json(scenario.to_json())
    assert again == scenario
    first, second = run_scenario(scenario), run_scenario(again)
    assert (first.errors, first.steps, first.reads) == (second.errors, second.steps, second.reads)
    assert first.reads > 0
