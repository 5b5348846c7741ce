"""The architecture sweep: every causal-LM model type of the installed transformers, built tiny
with random weights from its config class, is exact against HF `generate` or refused at load in one
line naming the model type; never silently wrong.

For each type in transformers' causal-LM mapping: a config from `TINY` (small widths, two layers,
a sliding window of `WINDOW` tokens where the config has one, prompts longer than it), the model
from that config (float32, eager attention). A type whose config or model cannot be built that
way is "not buildable" (the cause is kept). A built model goes to `TorchExecutor`: a refusal
must be one `UnsupportedModel` line starting with the model type; any other exception is a crash.
A loaded model generates `MAX_NEW` greedy tokens for each prompt under three settings (plain,
chunked prefill of 5 tokens, a shared prefix with copy-on-write) and must give HF `generate`'s
tokens, one prompt at a time. Where it does not, and HF `generate` itself differs from the model's
plain forward (no cache) on those prompts, the type is "hf inconsistent" (moshi with a window: its
cache keeps only the window while its mask is full causal), with what metroline gave.
`python tests/architecture_sweep.py [TYPE ...]` prints the table.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from typing import Any

import torch
from test_model_support import generate_greedy, hf_greedy_each
from torch_helpers import Argmax

from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.executors.torch import TorchExecutor

VOCAB = 128
WINDOW = 8
MAX_NEW = 4
TINY = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=None,
    eos_token_id=None, pad_token_id=None, n_embd=64, n_layer=2, n_head=4, n_positions=256, d_model=64,
    num_layers=2, num_heads=4, ffn_dim=96, n_inner=96, num_experts=4, num_local_experts=4, n_routed_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, moe_num_experts=4,
    moe_topk=2, intermediate_size_mlp=96, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
    qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, tie_word_embeddings=False,
)
"""Config values every tiny model gets (a config class ignores or stores the names it does not use)."""
MAX_PARAMETERS = 20_000_000
"""A model built from `TINY` with more parameters than this (its config ignores the tiny sizes) is
not built: counted as not buildable."""

SETTINGS = {
    "plain": dict(num_blocks=128, block_size=8, enable_prefix_caching=False),
    "chunked": dict(num_blocks=128, block_size=8, max_prefill_chunk=5, max_num_batched_tokens=32),
    "prefix-cow": dict(num_blocks=128, block_size=8, prefix_match="token"),
}


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def build(model_type: str) -> Any:
    """The tiny random model of `model_type` (float32, eager), or raise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    tiny = dict(TINY)
    if not hasattr(AutoConfig.for_model(model_type), "num_key_value_heads"):
        del tiny["num_key_value_heads"]  # a model without grouped-query heads would ignore it
    config = AutoConfig.for_model(model_type, **tiny)
    for name in ("sliding_window", "window_size"):
        if getattr(config, name, None):
            setattr(config, name, WINDOW)
    if hasattr(config, "use_sliding_window"):
        config.use_sliding_window = True
        config.sliding_window = WINDOW
    config._attn_implementation = "eager"
    with torch.device("meta"):  # count the parameters before allocating any: some configs ignore TINY
        shell = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        size = sum(p.numel() for p in shell.parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"{size / 1e6:.0f}M parameters with the tiny config (over {MAX_PARAMETERS / 1e6:.0f}M)")
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if model.config.get_text_config().vocab_size < VOCAB:
        raise ValueError(f"vocabulary {model.config.vocab_size} < {VOCAB}")
    return model


def prompts(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Three prompts of 9..20 tokens (past the window), and three sharing a 13-token prefix."""
    rng = random.Random(seed)
    plain = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (9, 14, 20)]
    head = [rng.randrange(3, VOCAB) for _ in range(13)]
    shared = [head + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (2, 5, 7)]
    return plain, shared


def check(model_type: str) -> tuple[str, str]:
    """`(outcome, detail)`: outcome one of exact, refused, not buildable, crash, wrong, or hf
    inconsistent (HF `generate` differs from HF's own forward, so there is no one reference)."""
    from metroline.executors.torch.support import UnsupportedModel

    try:
        model = build(model_type)
    except Exception as e:  # noqa: BLE001 - what cannot be built tiny here is counted, not failed
        return "not buildable", f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
    plain, shared = prompts()
    try:
        refs = {"plain": hf_greedy_each(model, plain, MAX_NEW), "shared": hf_greedy_each(model, shared, MAX_NEW)}
    except Exception as e:  # noqa: BLE001 - HF itself cannot generate with this tiny model
        return "not buildable", f"HF generate: {type(e).__name__}: {' '.join(str(e).split())[:120]}"
    try:
        executor = TorchExecutor(model)  # one executor (one load probe) for every setting
    except UnsupportedModel as e:
        line = str(e)
        if "\n" in line or not line.startswith(f"{model_type}: ") and not line.startswith(
                f"{model.config.model_type}: "):
            return "crash", f"refusal not one line naming the type: {line[:200]!r}"
        return "refused", line.split(" (supported:")[0]
    except Exception as e:  # noqa: BLE001
        return "crash", f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    for name, setting in SETTINGS.items():
        batch, ref = (shared, refs["shared"]) if name == "prefix-cow" else (plain, refs["plain"])
        try:
            eng = Engine(EngineConfig(**setting), executor, plugins=[Argmax()])
            results = generate_greedy(eng, batch, MAX_NEW, prefix_first=name == "prefix-cow")
        except Exception as e:  # noqa: BLE001
            return "crash", f"{name}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        got = [results[str(i)][0].output_token_ids for i in range(len(batch))]
        if got != ref:
            forward = hf_forward_greedy(model, batch)
            if forward != ref:  # HF's cached generate is not its own forward: no single reference
                return "hf inconsistent", (f"{name}: HF generate {ref}, HF forward {forward}, metroline {got} "
                                           f"({'equal to' if got == forward else 'unlike'} the forward)")
            return "wrong", f"{name}: {got} != HF {ref}"
    return "exact", ""


def hf_forward_greedy(model: Any, batch: list[list[int]]) -> list[list[int]]:
    """Greedy continuations by the model's plain forward over the whole sequence each token (no
    cache): where HF `generate` disagrees with it, the model's cache is not its forward."""
    model.set_attn_implementation("eager")
    out = []
    with torch.no_grad():
        for p in batch:
            ids = list(p)
            for _ in range(MAX_NEW):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(ids[len(p):])
    return out


def sweep(types: list[str] | None = None, show: Any = None) -> dict[str, tuple[str, str]]:
    """`check` of each type (all causal-LM types by default); `show(type, outcome, detail)` is
    called as each one ends."""
    torch.set_num_threads(1)
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in types or causal_lm_types():
            results[model_type] = check(model_type)
            if show is not None:
                show(model_type, *results[model_type])
    return results


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    start = time.perf_counter()
    args = sys.argv[1:]
    if args[:1] == ["--part"]:  # --part I/N [--reverse]: every N-th type from the I-th (0-based)
        i, n = map(int, args[1].split("/"))
        args = causal_lm_types()[i::n][::-1 if "--reverse" in args else 1]
    table = sweep(args or None, lambda t, o, d: print(f"{t:32} {o:14} {d}", flush=True))
    counts: dict[str, int] = {}
    for outcome, _ in table.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    print(f"{len(table)} types: {counts} in {time.perf_counter() - start:.0f} s")
