"""Greedy parity: the torch executor on metroline's paged KV gives, token for token, what HF
`generate` gives (float32, eager attention) on a seeded random tiny Llama with grouped-query heads,
whatever the scheduler does to the KV: chunked prefill, prefix sharing with copy-on-write, sharing
within one step, preemption by recompute and by swap, parallel samples."""

from __future__ import annotations

import random

import pytest
from torch_helpers import engine, greedy_request, hf_greedy, random_prompts, tiny_llama

MAX_NEW = 12


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def plain(model):
    """32 prompts of random lengths 1..200 and their HF greedy continuations."""
    prompts = random_prompts(32, seed=1)
    return prompts, hf_greedy(model, prompts, MAX_NEW)


def max_new_tokens(i: int) -> int:
    """Mixed output lengths (1..MAX_NEW), so prefills and decodes of others share steps."""
    return 1 + (i * 5) % MAX_NEW


def run_and_check(eng, prompts, refs, n=1, submitted=0):
    """Submit the requests from `submitted` on, run all to the end, check every token against
    HF and the pool drained; returns every sequence."""
    results = eng.generate(
        greedy_request(str(i), p, max_new_tokens(i), n=n) for i, p in enumerate(prompts) if i >= submitted
    )
    for i, ref in enumerate(refs):
        seqs = results[str(i)]
        assert len(seqs) == n
        for seq in seqs:
            assert seq.output_token_ids == ref[: max_new_tokens(i)], f"request {i} sample {seq.index}"
    eng.pool.check_invariants([])
    assert eng.pool.num_used_blocks() == 0
    return [s for seqs in results.values() for s in seqs]


def test_no_sharing(model, plain):
    prompts, refs = plain
    eng, ex = engine(model, num_blocks=512, block_size=16, enable_prefix_caching=False)
    run_and_check(eng, prompts, refs)
    assert ex.stats.copies == ex.stats.swap_outs == 0


def test_chunked_prefill_chunk_7(model, plain):
    prompts, refs = plain
    eng, ex = engine(model, num_blocks=512, block_size=16, max_prefill_chunk=7, max_num_batched_tokens=256)
    run_and_check(eng, prompts, refs)
    # the longest prompt alone needs ceil(len / 7) steps of prefill
    assert ex.stats.total_steps >= -(-max(map(len, prompts)) // 7)


def test_shared_system_prompt_hits_end_inside_a_block(model):
    system = random_prompts(1, seed=2, lo=40, hi=40)[0]  # 2.5 blocks of 16
    prompts = random_prompts(32, seed=3, lo=9, hi=150, prefix=system)
    refs = hf_greedy(model, prompts, MAX_NEW)
    # token-granular matching: a hit may end inside a block (block matching, the default, stops at 32)
    eng, ex = engine(model, num_blocks=512, block_size=16, prefix_match="token")
    # the first request computes the system prompt before the others arrive
    eng.add_request(greedy_request("0", prompts[0], max_new_tokens(0)))
    eng.step()
    seqs = run_and_check(eng, prompts, refs, submitted=1)
    hits = [s.num_cached_prompt_tokens for s in seqs if s.request_id != "0"]
    assert all(h >= 40 for h in hits), hits  # the whole system prompt, block 2 in part...
    assert any(h % 16 for h in hits)         # ...so some hits end inside a block
    assert ex.stats.copies > 0                 # and writing after them copies the block first


def test_32_requests_arriving_together_on_one_prefix(model):
    prefix = random_prompts(1, seed=4, lo=40, hi=40)[0]  # 2.5 blocks
    prompts = random_prompts(32, seed=5, lo=9, hi=100, prefix=prefix)
    refs = hf_greedy(model, prompts, MAX_NEW)
    # ~2000 prompt tokens against a budget of 512 a step: admissions span several steps
    eng, ex = engine(model, num_blocks=512, block_size=16, max_num_batched_tokens=512, prefix_match="token")
    seqs = run_and_check(eng, prompts, refs)
    first = min(s.first_scheduled_time for s in seqs)
    same_step = [s for s in seqs if s.first_scheduled_time == first and s.request_id != "0"]
    later = [s for s in seqs if s.first_scheduled_time > first]
    assert same_step and later
    # a request admitted after the prefix was computed reuses all of it, its last block in part;
    # one admitted in the same step reuses what the scheduler lets it (blocks scheduled earlier
    # in that step, when they are indexed at once): either way the tokens are HF's
    assert all(s.num_cached_prompt_tokens >= 40 for s in later)
    assert ex.stats.copies > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption(model, plain, mode):
    prompts, refs = plain
    eng, ex = engine(
        model, num_blocks=40, block_size=16, preemption_mode=mode,
        swap_space_blocks=64 if mode == "swap" else 0,
    )
    seqs = run_and_check(eng, prompts, refs)
    assert sum(s.num_preemptions for s in seqs) > 0
    if mode == "swap":
        assert ex.stats.swap_outs > 0 and ex.stats.swap_ins > 0


def test_n4_greedy_children_all_equal_greedy(model, plain):
    prompts, refs = plain
    prompts, refs = prompts[:8], refs[:8]
    eng, ex = engine(model, num_blocks=512, block_size=16)
    seqs = run_and_check(eng, prompts, refs, n=4)
    assert len(seqs) == 32
    # children share the last partial prompt block and copy it at their first write into it
    assert ex.stats.copies > 0


def test_32_requests_on_one_prefix_share_blocks_scheduled_in_the_same_step(model):
    """Block matching (the default): the first request's full prefix blocks are in the index as
    soon as they are scheduled, so requests admitted later in that very step reuse them; the
    executor writes the step's KV before any attention reads it, so the tokens are still HF's."""
    prefix = random_prompts(1, seed=4, lo=40, hi=40)[0]  # 2 full blocks and a partial one
    prompts = random_prompts(32, seed=5, lo=9, hi=100, prefix=prefix)
    refs = hf_greedy(model, prompts, MAX_NEW)
    eng, ex = engine(model, num_blocks=512, block_size=16, max_num_batched_tokens=512)
    seqs = run_and_check(eng, prompts, refs)
    first = min(s.first_scheduled_time for s in seqs)
    same_step = [s for s in seqs if s.first_scheduled_time == first and s.request_id != "0"]
    assert same_step
    assert all(s.num_cached_prompt_tokens == 32 for s in same_step)  # both full prefix blocks
    assert ex.stats.copies == 0  # whole blocks only: nothing to copy
