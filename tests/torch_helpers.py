"""Helpers for the torch executor tests: a seeded random tiny Llama, HF greedy references, and a
greedy sampler plugin for logits tensors."""

from __future__ import annotations

import random
from typing import Any

import torch
from conftest import torch_threads
from transformers import LlamaConfig, LlamaForCausalLM

from metroline.core.config import EngineConfig
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.step.engine import Engine
from metroline.executors.torch import TorchExecutor

VOCAB = 128

torch.set_num_threads(torch_threads())  # 1 unless OMP_NUM_THREADS says otherwise (`conftest.torch_threads`)


def tiny_llama(seed: int = 0) -> Any:
    """A random 2-layer Llama with grouped-query heads (4 query heads, 2 KV heads), float32, eager
    attention. A wide initialisation keeps the logits of different tokens well apart, so greedy
    choices do not hinge on rounding."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def random_prompts(n: int, seed: int, lo: int = 1, hi: int = 200, prefix: list[int] | None = None) -> list[list[int]]:
    """`n` prompts of random tokens with random lengths in [lo, hi], after `prefix` when given."""
    rng = random.Random(seed)
    head = list(prefix or [])
    return [head + [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def hf_greedy(model: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy continuation by `model.generate` (eager attention, EOS off),
    `max_new_tokens` tokens; the prompts go in one left-padded batch."""
    saved = model.config._attn_implementation
    model.set_attn_implementation("eager")
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    try:
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                do_sample=False, pad_token_id=0,
            )
    finally:
        model.set_attn_implementation(saved)
    return out[:, width:].tolist()


def teacher_forced_logprobs(model: Any, token_ids: list[int]) -> torch.Tensor:
    """The log-probabilities HF's forward (eager attention) gives every position of `token_ids`
    in one pass: row p is the distribution of the token after position p."""
    saved = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            logits = model(torch.tensor([token_ids])).logits[0]
    finally:
        model.set_attn_implementation(saved)
    return torch.log_softmax(logits.float(), dim=-1)


def logprob_errors(model: Any, seqs: list[Any]) -> dict[str, float]:
    """Each sequence's largest gap between the logprob it recorded for each output token
    (`seq.logprobs`, from a request with `logprobs=0`) and the teacher-forced HF forward's."""
    gaps = {}
    for seq in seqs:
        ids, start = list(seq.token_ids), seq.num_prompt_tokens
        ref = teacher_forced_logprobs(model, ids)
        assert len(seq.logprobs) == seq.num_output_tokens, seq.seq_id
        gaps[seq.seq_id] = max(
            (abs(ref[start + k - 1, ids[start + k]].item() - seq.logprobs[k][0]) for k in range(seq.num_output_tokens)),
            default=0.0,
        )
    return gaps


class Argmax:
    """Greedy sampling on a logits tensor (one argmax over the batch)."""

    name = "argmax"

    @hookimpl
    def sample(self, seqs: list, logits: Any) -> list[int]:
        return logits.argmax(dim=-1).tolist()


def engine(model: Any, **config: Any) -> tuple[Engine, TorchExecutor]:
    """An engine on a `TorchExecutor` over `model`, with greedy tensor sampling."""
    executor = TorchExecutor(model)
    return Engine(EngineConfig(**config), executor, plugins=[Argmax()]), executor


def greedy_request(rid: str, prompt: list[int], max_new: int, n: int = 1, **top: Any) -> dict[str, Any]:
    return {
        "request_id": rid, "prompt_token_ids": prompt,
        "sampling": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True, "n": n}, **top,
    }
