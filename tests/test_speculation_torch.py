"""Speculative decoding on the torch executor: n-gram and draft-model drafts verified in one packed
forward of the target; greedy outputs token for token those of the run without speculation, under
chunked prefill, prefix sharing, a tight pool (preemptions), stop tokens and max_tokens."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import assert_pool_drained, live_tables  # noqa: E402
from torch_helpers import VOCAB, tiny_llama  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402


def _prompts(n: int, seed: int, shared: int = 0) -> list[list[int]]:
    """Prompts that repeat a segment (lookup finds matches), after a shared prefix."""
    rng = random.Random(seed)
    head = [rng.randrange(VOCAB) for _ in range(shared)]
    out = []
    for _ in range(n):
        seg = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 12))]
        out.append(head + seg * rng.randint(2, 4) + seg[: rng.randint(0, len(seg))])
    return out


def _run(model, spec, prompts, max_new=24, stop=None, draft_model=None, **config):
    fields = dict(block_size=4, num_blocks=120, max_num_seqs=6, max_num_batched_tokens=64)
    fields.update(config)
    executor = TorchExecutor(model)
    executor.draft_model = draft_model
    engine = Engine(EngineConfig(**fields, speculative_config=spec), executor)
    for i, p in enumerate(prompts):
        sampling = {"max_new_tokens": max_new - i % 3, "temperature": 0.0, "ignore_eos": True}
        if stop is not None:
            sampling["stop_token_ids"] = [stop]
        engine.add_request({"request_id": f"r{i}", "prompt_token_ids": p, "sampling": sampling})
    steps = 0
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
        steps += 1
    assert_pool_drained(engine)
    return engine, {f"r{i}": engine.sequences(f"r{i}")[0].output_token_ids for i in range(len(prompts))}, steps


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(3)


@pytest.mark.parametrize("config", [
    {}, {"max_num_batched_tokens": 16, "max_prefill_chunk": 7}, {"num_blocks": 40},
    {"num_blocks": 40, "preemption_mode": "swap", "swap_space_blocks": 80},
])
def test_ngram_greedy_outputs_equal_the_plain_run(model, config):
    prompts = _prompts(6, 1, shared=9)
    plain_engine, plain, plain_steps = _run(model, None, prompts, **config)
    engine, spec, steps = _run(model, NGRAM, prompts, **config)
    assert spec == plain
    counters = engine.scheduler.speculation.counters
    assert counters.num_accepted_tokens > 0
    if "num_blocks" in config:
        assert engine.scheduler.total_preemptions > 0
    elif not config:  # (with a small budget, drafts take tokens prefills could have had)
        assert steps < plain_steps


def test_a_stop_token_cuts_an_accepted_run(model):
    prompts = _prompts(4, 2)
    _, plain, _ = _run(model, None, prompts)
    stop = plain["r0"][6]
    _, plain_stop, _ = _run(model, None, prompts, stop=stop)
    engine, spec_stop, _ = _run(model, NGRAM, prompts, stop=stop)
    assert spec_stop == plain_stop
    assert plain_stop["r0"][-1] == stop and len(plain_stop["r0"]) <= 7


@pytest.mark.parametrize("same", [True, False])
def test_draft_model_greedy_outputs_equal_the_plain_run(model, same):
    """A draft model with the target's vocabulary: a copy of the target (every draft accepted) and
    another random model (few are)."""
    prompts = _prompts(4, 3)
    _, plain, _ = _run(model, None, prompts)
    draft = tiny_llama(3) if same else tiny_llama(9)
    spec = {"method": "draft_model", "model": "in-memory", "num_speculative_tokens": 3}
    engine, out, _ = _run(model, spec, prompts, draft_model=draft)
    assert out == plain
    c = engine.scheduler.speculation.counters
    if same:
        assert c.num_accepted_tokens == c.num_draft_tokens > 0
    else:
        assert c.num_accepted_tokens < c.num_draft_tokens
