"""The core's progress guarantee (docs/architecture.md, "The progress guarantee"): whenever the oldest unfinished request fits
in the pool on its own, every request finishes, whatever policy and plugins are stacked.

A hypothesis test drives random workloads through every shipped policy with random stacks of the
stacking plugins, both preemption modes, prefix sharing on and off, parallel sampling and random
aborts, on pools down to one that just fits the largest request alone. Every step it checks the
pool's KV invariant and a shadow model of KV memory (`metroline.core.conformance.kv_shadow`: what
each slot of each block holds, updated from the plans' copies, swaps and writes), so that no
request ever reads KV that is not its own prefix's; and every run must end within a bound on its
steps.
"""

from __future__ import annotations

import random

import pytest
from conftest import assert_pool_drained, live_tables, tokens
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from metroline.core.conformance.kv_shadow import KVShadow
from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.kv_backends.block_ops import SWAP_OUT

POLICIES = ("fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr", "prefix_aware", "residual_sjf")
STACKING = (
    "decode_first", "prefill_first", "weighted_budget", "reserve", "auto_preemption", "tenant_quota", "slo_classes",
    "adaptive_speculation", "least_computed", "session_affinity",
)
TENANTS = ("a", "b", "c")


def blocks_alone(prompt: int, out: int, n: int, block_size: int) -> int:
    """Blocks a request needs when it runs alone: each of its `n` samples holds its whole context
    (shared prompt blocks counted once per sample: an upper bound)."""
    return n * -(-(prompt + out) // block_size)


@st.composite
def scenarios(draw):
    rng_seed = draw(st.integers(0, 2**32 - 1))
    block_size = draw(st.sampled_from((1, 3, 16)))
    num_requests = draw(st.integers(1, 6))
    prefixes = [tokens(90 + k, draw(st.integers(1, 40))) for k in range(2)]
    requests = []
    for i in range(num_requests):
        prompt = list(prefixes[draw(st.integers(0, 1))]) if draw(st.booleans()) else []
        prompt += tokens(i + 1, draw(st.integers(1, 100)))
        requests.append({
            "request_id": f"r{i}", "prompt_token_ids": prompt, "tenant": draw(st.sampled_from(TENANTS)),
            "priority": draw(st.integers(0, 3)),
            "sampling": {"max_new_tokens": draw(st.integers(1, 20)), "n": draw(st.sampled_from((1, 1, 2, 3)))},
        })
    largest = max(
        blocks_alone(len(r["prompt_token_ids"]), r["sampling"]["max_new_tokens"], r["sampling"]["n"], block_size)
        for r in requests
    )
    num_blocks = largest + draw(st.sampled_from((0, 0, 1, 3, 20)))
    mode = draw(st.sampled_from(("recompute", "swap")))
    policy = draw(st.sampled_from(POLICIES))
    stack = draw(st.lists(st.sampled_from(STACKING), unique=True, max_size=3))
    if mode != "swap" and "auto_preemption" in stack:
        stack.remove("auto_preemption")
    options: dict = {
        "weighted_fair": {"preempt": draw(st.booleans())},
        "slo_classes": {"classes": {"a": "interactive"}},
        "tenant_quota": {"default_max_running": 3, "token_rate": {"b": 400.0}, "burst": 200.0},
        "session_affinity": {"prefix_tokens": 8, "max_head_wait_s": 10.0},
    }
    options = {name: o for name, o in options.items() if name == policy or name in stack}  # loaded ones only
    budget = draw(st.one_of(st.integers(4, 8), st.integers(4, 64)))
    config = dict(
        block_size=block_size, num_blocks=num_blocks, policy=policy, plugins=stack, plugin_options=options,
        max_num_seqs=draw(st.integers(3, 8)), max_num_batched_tokens=budget,
        max_prefill_chunk=draw(st.integers(1, budget)), preemption_mode=mode,
        swap_space_blocks=draw(st.integers(1, 2 * num_blocks)) if mode == "swap" else 0,
        enable_prefix_caching=draw(st.booleans()), prefix_match=draw(st.sampled_from(("block", "token"))),
        admit_after_preemption=draw(st.booleans()),
        admission_gate=draw(st.sampled_from(("full_prompt", "first_chunk"))),
    )
    if not stack and policy in ("fcfs", "priority") and draw(st.booleans()):
        # vLLM's own victims (its priority scheduler under priority), without the core's
        # protection of stalled requests, which the preset turns off
        config["preset"] = "vllm"
    if draw(st.integers(0, 3)) == 0:  # speculative decoding: drafts, accepted or not, rolled back
        config["speculative_config"] = {
            "num_speculative_tokens": draw(st.integers(1, 4)), "acceptance_rate": draw(st.sampled_from((0.0, 0.6, 1.0))),
            "num_lookahead_tokens": draw(st.integers(0, 2)), "seed": draw(st.integers(0, 3)),
        }
    aborts = draw(st.lists(st.tuples(st.integers(0, 200), st.integers(0, num_requests - 1)), max_size=2))
    arrivals = sorted(draw(st.lists(st.sampled_from((0, 0, 0, 5, 30, 80)), min_size=num_requests, max_size=num_requests)))
    return rng_seed, list(zip(arrivals, requests)), config, aborts


# issue 7, finding 2: 7 requests of a few hundred tokens that token_rr (on a pool that holds any one
# of them alone, 107 blocks of 3) preempted in turns for ever, half-prefilled ones displacing each other
TOKEN_RR_LIVELOCK = (
    0,
    [(0, {"request_id": f"r{i}", "prompt_token_ids": tokens(i + 1, p), "sampling": {"max_new_tokens": o, "n": 1}})
     for i, (p, o) in enumerate([(297, 24), (120, 76), (300, 21), (307, 14), (300, 21), (300, 21), (300, 21)])],
    dict(policy="token_rr", block_size=3, num_blocks=107, enable_prefix_caching=False, max_num_batched_tokens=7,
         max_prefill_chunk=5, admit_after_preemption=True, admission_gate="first_chunk"),
    [],
)


def step_bound(requests: list[dict]) -> int:
    """A generous bound on the steps of a run: 20 per token any sample computes or generates,
    plus 200. (A livelock of mutual preemption runs past any bound; a correct schedule computes
    at least one token in most steps.)"""
    total = sum((len(r["prompt_token_ids"]) + r["sampling"]["max_new_tokens"]) * r["sampling"]["n"] for r in requests)
    return 20 * total + 200


@settings(max_examples=int(__import__('os').environ.get('PROGRESS_EXAMPLES', 1000)), deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(scenarios())
@example(TOKEN_RR_LIVELOCK)
def test_every_request_finishes_and_reads_only_its_own_kv(scenario):
    rng_seed, arrivals, config, aborts = scenario
    executor = KVShadow()
    engine = Engine(EngineConfig(**config), executor)
    executor.engine = engine
    requests = [r for _, r in arrivals]
    rng = random.Random(rng_seed)
    aborts = dict(aborts)
    bound = step_bound(requests) + arrivals[-1][0]
    steps = 0
    while engine.has_unfinished() or arrivals:
        while arrivals and arrivals[0][0] <= steps:
            engine.add_request(arrivals.pop(0)[1])
        if steps in aborts and f"r{aborts[steps]}" in engine.intake.requests:
            engine.abort(f"r{aborts[steps]}")
        engine.step()
        if engine.last_plan_empty:
            engine.idle()
        steps += 1
        assert not executor.errors, executor.errors[0]
        assert steps <= bound, f"not finished after {steps} steps ({config['policy']} + {config.get('plugins')})"
        if rng.random() < 0.02:
            engine.pool.check_invariants(live_tables(engine))
    aborted = {f"r{i}" for i in aborts.values()}
    for r in requests:
        for seq in engine.sequences(r["request_id"]):
            if r["request_id"] in aborted and seq.finish_reason.value == "cancelled":
                continue
            assert seq.finish_reason.value == "length", (seq, seq.finish_reason, seq.error)
            assert seq.num_output_tokens == r["sampling"]["max_new_tokens"]
    assert_pool_drained(engine)


@pytest.mark.parametrize("preset, num_blocks", [(None, 5), ("vllm", 8)])
def test_an_accepted_draft_swapped_out_before_the_next_step_is_its_tokens_kv(preset, num_blocks):
    """The shadow's own regression (the fuzz reported "r1#1 reads wrong KV" on correct schedules):
    a sample whose draft is accepted in one step and is swapped out in the next one carries its
    token's KV to the host and back. One request of one token, n = 2, blocks of one token: in step
    2 each sample writes positions 1 and 2 (its draft, accepted); in step 3 the pool cannot hold
    both samples' next slots (lean: the parent's plain decode; vllm: its 1 + k slots), so the
    younger sample, r1#1, is the victim, swapped out with the block of its accepted draft."""
    executor = KVShadow()
    plans = []
    execute = executor.execute
    executor.execute = lambda plan: (plans.append(plan), execute(plan))[1]
    config = EngineConfig(
        preset=preset, policy="fcfs", block_size=1, num_blocks=num_blocks, max_num_seqs=2, preemption_mode="swap",
        swap_space_blocks=8, enable_prefix_caching=False,
        speculative_config={"num_speculative_tokens": 1, "acceptance_rate": 1.0, "num_lookahead_tokens": 0},
    )
    engine = Engine(config, executor)
    executor.engine = engine
    engine.add_request({"request_id": "r1", "prompt_token_ids": [7], "sampling": {"max_new_tokens": 4, "n": 2}})
    engine.step()
    engine.step()
    child = engine.sequences("r1")[1]
    assert (child.num_computed_tokens, len(child.token_ids), child.num_accepted_tokens) == (3, 4, 1)
    draft_block = child.block_table[2]  # position 2: the accepted draft's slot
    engine.step()
    assert engine.sequences("r1")[1] in engine.scheduler.swapped
    (host,) = [dst for kind, src, dst in plans[-1].block_ops if kind == SWAP_OUT and src == draft_block]
    assert executor.host[host] == [executor.keys(child)[2]]  # the token's KV, not a draft's
    while engine.has_unfinished():
        engine.step()
    assert not executor.errors
    assert [s.num_output_tokens for s in engine.sequences("r1")] == [4, 4]
    assert_pool_drained(engine)
