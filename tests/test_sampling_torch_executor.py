"""Seeded sampling on a real model: the torch executor (a seeded random tiny Llama on paged KV) with
the default sampler. A request's tokens are the same alone and inside a batch of 32, with chunked
prefill, and under preemption. (Skipped where the torch executor is not installed.)"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("metroline.executors.torch")

from torch_helpers import random_prompts, tiny_llama  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402

TARGET = {"temperature": 0.9, "top_p": 0.95, "top_k": 40, "repetition_penalty": 1.1, "seed": 99,
          "max_new_tokens": 16, "ignore_eos": True}
KINDS = [{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.7, "seed": 5, "min_p": 0.05},
         {"temperature": 0.8, "frequency_penalty": 0.5}]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3)


def outputs(model, requests, **config):
    engine = Engine(EngineConfig(**config), TorchExecutor(model))
    done = engine.generate(requests)
    return {rid: [s.output_token_ids for s in seqs] for rid, seqs in done.items()}, done


def test_a_seeded_request_samples_the_same_tokens_alone_and_in_a_batch_of_32(model):
    prompts = random_prompts(32, seed=11, lo=1, hi=60)
    target = {"request_id": "t", "prompt_token_ids": prompts[0], "sampling": TARGET}
    alone, _ = outputs(model, [target], num_blocks=64, block_size=16)
    tokens = alone["t"][0]
    assert len(tokens) == 16 and len(set(tokens)) > 4
    others = [
        {"request_id": f"o{i}", "prompt_token_ids": p,
         "sampling": {**KINDS[i % 4], "max_new_tokens": 4 + i % 13, "ignore_eos": True}}
        for i, p in enumerate(prompts[1:])
    ]
    batch = others[:20] + [target] + others[20:]
    together, _ = outputs(model, batch, num_blocks=256, block_size=16)
    assert together["t"][0] == tokens
    squeezed, done = outputs(model, batch, num_blocks=24, block_size=8, max_prefill_chunk=7)
    assert squeezed["t"][0] == tokens
    assert sum(s.num_preemptions for seqs in done.values() for s in seqs) > 0


def test_seeded_children_differ_and_greedy_children_agree(model):
    prompt = random_prompts(1, seed=12)[0]
    sampled, _ = outputs(model, [{"request_id": "r", "prompt_token_ids": prompt,
                                  "sampling": {**TARGET, "n": 4}}], num_blocks=64)
    assert len({tuple(t) for t in sampled["r"]}) == 4
    again, _ = outputs(model, [{"request_id": "r", "prompt_token_ids": prompt, "sampling": {**TARGET, "n": 4}}],
                       num_blocks=64)
    assert again == sampled
    greedy, _ = outputs(model, [{"request_id": "g", "prompt_token_ids": prompt,
                                 "sampling": {"temperature": 0.0, "max_new_tokens": 8, "n": 4, "ignore_eos": True}}],
                        num_blocks=64)
    assert all(t == greedy["g"][0] for t in greedy["g"])
