"""The conformance suite for `sample` plugins on real logits: the plugin runs the torch executor
on a tiny Llama with seeded random weights (when torch and transformers are installed), on greedy
and seeded sampled requests, with its stack's samplers below it. The engine checks each answer as
it does in production (one int token per sequence, in the vocabulary; never a token a wrapper
banned: a `PluginError`), then the suite checks that no request was lost and that two runs give
the same tokens. Answers are counted as changed against the samplers without the plugin
(`hook_coverage`); in simulation, where there are no logits, a sampler is only run, not judged.
"""

from __future__ import annotations

import importlib.util
import random
import tempfile
from typing import Any

from ..config import EngineConfig
from ..requests.sequence import FinishReason
from .hook_coverage import HookCoverage, watch

VOCAB = 128
"""The tiny model's vocabulary."""

NUM_REQUESTS = 16
MAX_NEW_TOKENS = 16


def torch_available() -> bool:
    """Whether torch and transformers can be imported (the check runs only then)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def tiny_model(seed: int) -> Any:
    """A 2-layer Llama with random weights (seeded), float32, eager attention; the wide
    initialisation keeps its logits well apart, so greedy tokens do not hinge on rounding."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def sample_requests(seed: int) -> list[dict[str, Any]]:
    """Greedy and seeded sampled requests (temperature, top-p, penalties), random prompts."""
    rng = random.Random(f"check_plugin/sample/{seed}")
    out = []
    for i in range(NUM_REQUESTS):
        sampling: dict[str, Any] = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        if i % 2:
            sampling.update(temperature=1.0, top_p=0.95, seed=seed * 1000 + i, repetition_penalty=1.1)
        else:
            sampling.update(temperature=0.0)
        out.append({"request_id": f"s{i}", "prompt_token_ids": [rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))],
                    "sampling": sampling, "tenant": ("alpha", "beta")[i % 2]})
    return out


def check_sampler(name: str, setup: Any, seed: int, coverage: dict[str, HookCoverage],
                  failures: list[str]) -> dict[str, Any] | None:
    """Run the plugin (`setup()` -> (EngineConfig, extra plugins), as `check_plugin` builds them)
    on the torch executor twice; None when torch is not installed."""
    if not torch_available():
        return None

    from ...executors.registry import make_executor  # by name: the core never imports torch's executor
    from ..step.engine import Engine

    label = f"{name} on the torch executor (tiny random Llama, vocab {VOCAB})"
    outputs = []
    with tempfile.TemporaryDirectory(prefix="metroline-check-plugin-") as folder:
        tiny_model(seed).save_pretrained(folder)
        for attempt in range(2):
            config, extra = setup()
            config = EngineConfig.model_validate({**config.model_dump(), "num_blocks": 64, "max_model_len": 256,
                                                  "max_num_batched_tokens": 256})
            executor = make_executor("torch", model=folder, dtype="float32", device="cpu")
            engine = Engine(config, executor, plugins=extra)
            if attempt == 0:
                watch(engine, name, coverage)
            try:
                done = engine.generate(sample_requests(seed))
            except Exception as exc:
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                return None
            tokens = {}
            for rid, seqs in done.items():
                for s in seqs:
                    if s.finish_reason is not FinishReason.LENGTH or s.num_output_tokens != MAX_NEW_TOKENS:
                        failures.append(f"{label}: request {rid} ended {s.finish_reason} after "
                                        f"{s.num_output_tokens} of {MAX_NEW_TOKENS} tokens ({s.error})")
                    tokens[rid] = s.output_token_ids
            outputs.append(tokens)
    if outputs[0] != outputs[1]:
        failures.append(f"{label}: two runs with seed {seed} gave different tokens")
    return {"workload": "torch-tiny", "mode": "sample", "requests": NUM_REQUESTS,
            "steps": None, "preemptions": 0}
