"""The support matrix: every architecture here is, under every scheduler setting, token for token
what HF `generate` gives (float32, eager attention, one prompt at a time), or refused at load with
one line naming the model type and the cause. Never a silent wrong answer.

Each case is a seeded random tiny model of that architecture, with the attention variants its
family uses switched on hard (Gemma2's logit softcap at 1.0, GPT-OSS's sinks, sliding windows of 8
tokens under prompts up to 40, Phi-3's LongRoPE). The settings: plain, chunked prefill (chunks of
5), shared prefixes with copy-on-write (token-granular matching), and a tight pool preempting by
recompute and by swap.

The support matrix of docs/guide/real-executor.md is rendered from `CASES` (`test_readme_matrix_is_the_tested_one`):
each row states what the parametrised test of that row asserts, so the table cannot drift from the
code. `METROLINE_WRITE_MATRIX=1 pytest tests/test_model_support.py -k readme` rewrites it.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch_helpers import Argmax, engine, greedy_request
from transformers import AutoConfig, AutoModelForCausalLM

from metroline.api import hookimpl
from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.executors.torch import TorchExecutor, support
from metroline.executors.torch.support import UnsupportedModel

VOCAB = 96
MAX_NEW = 6
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, initializer_range=0.2, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)
LLAMA_LIKE = dict(COMMON, intermediate_size=96, num_key_value_heads=2)
LONGROPE_ORIGINAL = 48
HALF_HEAD = 64 // 4 // 2


class Case:
    """One row of the matrix: how to build the tiny model, what it exercises, and the outcome
    (`refused`: the start of the one-line error, after the model type)."""

    def __init__(self, model_type: str, config: dict[str, Any], exercises: str = "", refused: str | None = None,
                 name: str | None = None, max_len: int | None = None) -> None:
        self.model_type = model_type
        self.config = config
        self.exercises = exercises
        self.refused = refused
        self.name = name or model_type
        self.max_len = max_len


NOT_THROUGH_INTERFACE = "attention does not go through transformers' AttentionInterface"
CASES = [
    Case("llama", LLAMA_LIKE, "grouped-query heads (4 query, 2 KV)"),
    Case("llama", dict(LLAMA_LIKE, num_key_value_heads=1, tie_word_embeddings=True), "one KV head (MQA), tied embeddings",
         name="llama-mqa"),
    Case("mistral", dict(LLAMA_LIKE, sliding_window=WINDOW), f"sliding window ({WINDOW}) in every layer"),
    Case("mixtral", dict(LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
         "mixture of experts"),
    Case("qwen2", dict(LLAMA_LIKE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
         f"sliding window ({WINDOW}) in layer 1 only, full layer 0"),
    Case("qwen3", dict(LLAMA_LIKE, head_dim=16), "q/k norms"),
    Case("gemma", dict(LLAMA_LIKE, head_dim=16), "scaled embeddings, GeGLU"),
    Case("gemma2", dict(LLAMA_LIKE, head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
                        final_logit_softcapping=5.0, sliding_window=WINDOW),
         f"attention logit softcap 1.0, final softcap, sliding window ({WINDOW}) every other layer"),
    Case("gemma3_text", dict(LLAMA_LIKE, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                             layer_types=["sliding_attention", "full_attention"]),
         f"sliding layer ({WINDOW}) and full layer with their own ropes, q/k norms"),
    Case("phi", dict(COMMON, intermediate_size=96, partial_rotary_factor=0.5), "partial rotary, parallel block"),
    Case("phi3", dict(LLAMA_LIKE, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": LONGROPE_ORIGINAL,
        "short_factor": [1.0 + 0.1 * i for i in range(HALF_HEAD)],
        "long_factor": [2.0 + 0.5 * i for i in range(HALF_HEAD)]}, max_position_embeddings=256,
        original_max_position_embeddings=LONGROPE_ORIGINAL),
        f"LongRoPE: exact up to original_max_position_embeddings ({LONGROPE_ORIGINAL}), longer requests refused",
        max_len=LONGROPE_ORIGINAL),
    Case("olmo", LLAMA_LIKE, "non-parametric layer norm"),
    Case("olmo2", LLAMA_LIKE, "q/k norms after projection"),
    Case("gpt_neox", dict(COMMON, intermediate_size=96, rotary_pct=0.5), "partial rotary, parallel residual"),
    Case("gpt2", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.2,
                      bos_token_id=None, eos_token_id=None), "learned positions, fused QKV"),
    Case("opt", dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=256, word_embed_proj_dim=64, init_std=0.2, bos_token_id=None,
                     eos_token_id=None, pad_token_id=None), "learned positions with offset"),
    Case("gpt_oss", dict(LLAMA_LIKE, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                         intermediate_size=64, layer_types=["sliding_attention", "full_attention"]),
         f"attention sinks, sliding window ({WINDOW}) every other layer, mixture of experts"),
    Case("starcoder2", dict(COMMON, intermediate_size=96, num_key_value_heads=2, sliding_window=WINDOW),
         f"sliding window ({WINDOW}), biases"),
    Case("cohere", dict(LLAMA_LIKE, logit_scale=1.0), "parallel block, interleaved rotary"),
    Case("granite", dict(LLAMA_LIKE, attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5,
                         logits_scaling=2.0), "attention and residual multipliers"),
    Case("bloom", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, initializer_range=0.2,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None),
         "ALiBi in its own attention", refused=NOT_THROUGH_INTERFACE),
    Case("falcon", dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        initializer_range=0.2, bos_token_id=None, eos_token_id=None),
         "its own attention", refused=NOT_THROUGH_INTERFACE),
    Case("gpt_neo", dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                         window_size=WINDOW, max_position_embeddings=256, initializer_range=0.2,
                         bos_token_id=None, eos_token_id=None),
         "its own attention", refused=NOT_THROUGH_INTERFACE),
    Case("mpt", dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=256, bos_token_id=None,
                     eos_token_id=None), "ALiBi in its own attention", refused=NOT_THROUGH_INTERFACE),
]
CASE_IDS = [c.name for c in CASES]


def build(case: Case, seed: int = 0) -> Any:
    """The case's tiny random model, float32, eager attention."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model(case.model_type, **case.config)
    config._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


def prompts_for(case: Case, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Ten prompts of 1..40 tokens, and ten that share a 21-token prefix (two blocks of 8 and a
    part), within the case's context."""
    rng = random.Random(seed)
    top = (case.max_len or 10**9) - MAX_NEW
    plain = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, min(40, top)))] for _ in range(10)]
    prefix = [rng.randrange(VOCAB) for _ in range(21)]
    shared = [prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(1, min(19, top - 21)))] for _ in range(10)]
    return plain, shared


def hf_greedy_each(model: Any, prompts: list[list[int]], max_new: int = MAX_NEW) -> list[list[int]]:
    """Each prompt's greedy continuation of `max_new` tokens by `model.generate`, one prompt at a
    time (no padding)."""
    model.set_attn_implementation("eager")
    refs = []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=0)
            refs.append(out[0, len(p):].tolist())
    return refs


def generate_greedy(eng: Any, prompts: list[list[int]], max_new: int, prefix_first: bool = False) -> dict[str, Any]:
    """`eng.generate`'s results for `prompts` as greedy requests "0", "1", ... of `max_new`
    tokens. With `prefix_first`, the first request computes its prompt (a step) before the others
    arrive, so those that share its prefix hit the cache."""
    if prefix_first:
        eng.add_request(greedy_request("0", prompts[0], max_new))
        eng.step()
    return eng.generate(greedy_request(str(i), p, max_new) for i, p in enumerate(prompts) if i > 0 or not prefix_first)


SETTINGS = {
    "plain": dict(num_blocks=256, block_size=8, enable_prefix_caching=False),
    "chunked": dict(num_blocks=256, block_size=8, max_prefill_chunk=5, max_num_batched_tokens=64),
    "prefix-cow": dict(num_blocks=256, block_size=8, prefix_match="token"),
    "recompute": dict(num_blocks=14, block_size=8, preemption_mode="recompute"),
    "swap": dict(num_blocks=14, block_size=8, preemption_mode="swap", swap_space_blocks=64),
}


def run_setting(model: Any, name: str, prompts: list[list[int]], refs: list[list[int]], executor: Any = None) -> Any:
    """Run `prompts` under setting `name` (on `executor` when given, else a new one over `model`);
    assert every token is HF's and every block ends free. Under prefix-cow the first request
    computes the shared prefix before the others arrive."""
    ex = executor or TorchExecutor(model)
    eng = Engine(EngineConfig(**SETTINGS[name]), ex, plugins=[Argmax()])
    results = generate_greedy(eng, prompts, MAX_NEW, prefix_first=name == "prefix-cow")
    for i, ref in enumerate(refs):
        (seq,) = results[str(i)]
        assert seq.output_token_ids == ref, f"setting {name}, request {i} (prompt of {len(prompts[i])} tokens)"
    eng.pool.check_invariants([])
    assert eng.pool.num_used_blocks() == 0
    return eng, ex, [s for seqs in results.values() for s in seqs]


@pytest.mark.parametrize("case", [c for c in CASES if c.refused is None], ids=[c.name for c in CASES if c.refused is None])
def test_exact_in_every_setting(case: Case) -> None:
    model = build(case)
    plain, shared = prompts_for(case, seed=1)
    refs_plain = hf_greedy_each(model, plain)
    refs_shared = hf_greedy_each(model, shared)
    ex = TorchExecutor(model)  # one load probe; each engine's bind gives it a new KV cache and stats
    for name in ("plain", "chunked", "recompute", "swap"):
        _, _, seqs = run_setting(model, name, plain, refs_plain, ex)
        if name in ("recompute", "swap"):
            assert sum(s.num_preemptions for s in seqs) > 0, f"{name}: the pool was not tight"
    eng, ex, seqs = run_setting(model, "prefix-cow", shared, refs_shared, ex)
    assert ex.stats.copies > 0  # hits ended inside a block and were copied before the write
    assert max(s.num_cached_prompt_tokens for s in seqs) >= 21


@pytest.mark.parametrize("case", [c for c in CASES if c.refused], ids=[c.name for c in CASES if c.refused])
def test_refused_by_name(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Refused when the executor is built on the model object, and by `metroline generate` on the
    saved folder, before any weights load: one line naming the model type and the cause."""
    from metroline.cli import main

    model = build(case)
    with pytest.raises(UnsupportedModel) as err:
        TorchExecutor(model)
    assert str(err.value).startswith(f"{case.model_type}: {case.refused}")
    assert "supported: llama, mistral" in str(err.value)
    model.save_pretrained(tmp_path / "m")
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "m"), "--max-new-tokens", "2", "hello"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"metroline: error: --model: {case.model_type}: {case.refused}")


def test_longrope_past_the_original_context_is_refused_naming_the_reason() -> None:
    """Phi-3's LongRoPE changes its factors for the whole pack past the original context; metroline
    stops there and says why."""
    case = next(c for c in CASES if c.model_type == "phi3")
    model = build(case)
    eng, ex = engine(model, num_blocks=64, block_size=8)
    assert ex.max_model_len == LONGROPE_ORIGINAL
    with pytest.raises(ValidationError) as err:
        eng.add_request(greedy_request("long", list(range(LONGROPE_ORIGINAL)), 4))
    message = str(err.value)
    assert f"exceeds max_model_len={LONGROPE_ORIGINAL}" in message and "longrope" in message


def test_sliding_window_does_not_cap_the_context() -> None:
    """A sliding-window model's max_model_len is its context, not its window; prompts five times
    the window are exact (the matrix's mistral row runs prompts up to 40 over a window of 8)."""
    case = next(c for c in CASES if c.model_type == "mistral")
    model = build(case)
    eng, ex = engine(model, num_blocks=64, block_size=8)
    assert ex.max_model_len == 256 and ex.max_model_len_reason is None


@pytest.mark.parametrize("name, value", [("position_bias", torch.zeros(1)), ("is_causal", False), ("alibi", 1)])
def test_an_attention_argument_not_understood_is_refused(name: str, value: Any) -> None:
    """Every argument transformers passes is honoured or refused; none is swallowed."""
    from metroline.executors.torch import attention

    with pytest.raises(attention.UnsupportedAttention, match=name):
        attention.check_arguments({name: value})
    attention.check_arguments({"position_ids": torch.zeros(1), "is_causal": True, "output_attentions": False})


def test_a_model_that_swallows_our_attention_is_refused_by_the_probe() -> None:
    """A layer that bypasses the registered function (here: a Llama whose second layer's attention
    is replaced by transformers' eager function) is found by the load probe."""
    from transformers.models.llama import modeling_llama

    model = build(CASES[0])
    attn = model.model.layers[1].self_attn
    original = attn.forward

    def eager_forward(*args: Any, **kwargs: Any) -> Any:
        saved = attn.config._attn_implementation
        attn.config._attn_implementation = "eager"
        try:
            return original(*args, **kwargs)
        finally:
            attn.config._attn_implementation = saved

    attn.forward = eager_forward
    assert modeling_llama.LlamaAttention is type(attn)
    with pytest.raises(UnsupportedModel, match=r"llama: .*layers \[1\] never called the registered attention"):
        TorchExecutor(model)


# --- the documented matrix ----------------------------------------------------------------------

BEGIN, END = "<!-- support-matrix:begin -->", "<!-- support-matrix:end -->"


def render_matrix() -> str:
    rows = ["| model (tiny random config) | outcome | what the case exercises |", "| --- | --- | --- |"]
    for c in CASES:
        outcome = "exact: plain, chunked, prefix + COW, recompute, swap" if c.refused is None else f"refused: {c.refused}"
        rows.append(f"| `{c.name}` | {outcome} | {c.exercises} |")
    return "\n".join(rows)


def test_readme_matrix_is_the_tested_one() -> None:
    readme = Path(__file__).resolve().parent.parent / "docs" / "guide" / "real-executor.md"
    text = readme.read_text()
    table = render_matrix()
    if os.environ.get("METROLINE_WRITE_MATRIX"):
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), f"{BEGIN}\n{table}\n{END}", text, flags=re.S)
        readme.write_text(text)
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip() if BEGIN in text else None
    assert section == table, "the support matrix of docs/guide/real-executor.md differs: METROLINE_WRITE_MATRIX=1 rewrites it"
    exact = {c.model_type for c in CASES if c.refused is None}
    assert set(support.VERIFIED_ARCHITECTURES) == exact
    assert len({c.model_type for c in CASES}) >= 15


class LogitsRecorder:
    """Greedy sampling that keeps each request's first logits row (its prompt's last token)."""

    name = "logits_recorder"

    def __init__(self) -> None:
        self.first: dict[str, torch.Tensor] = {}

    @hookimpl
    def sample(self, seqs: list, logits: Any) -> list[int]:
        for seq, row in zip(seqs, logits):
            self.first.setdefault(seq.request_id, row.clone())
        return logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("name, softcap", [("gemma2", 50.0), ("gemma2", 1.0), ("gpt_oss", None), ("mistral", None)])
def test_logits_equal_hf_forward(name: str, softcap: float | None) -> None:
    """Not only the argmax: the logits of every prompt's last token equal one eager HF forward of
    that prompt alone, packed with the others (Gemma2's default softcap of 50 moved them by up to
    0.09 when it was dropped; float32 rounding here is ~1e-5)."""
    case = next(c for c in CASES if c.name == name)
    if softcap is not None:
        case = Case(case.model_type, dict(case.config, attn_logit_softcapping=softcap), name=name)
    model = build(case)
    plain, _ = prompts_for(case, seed=3)
    recorder = LogitsRecorder()
    eng = Engine(EngineConfig(num_blocks=256, block_size=8), TorchExecutor(model), plugins=[recorder])
    eng.generate(greedy_request(str(i), p, 1) for i, p in enumerate(plain))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for i, p in enumerate(plain):
            ref = model(torch.tensor([p])).logits[0, -1]
            assert (recorder.first[str(i)] - ref).abs().max().item() < 1e-4, f"prompt {i} ({len(p)} tokens)"


def test_every_load_failure_is_one_line_naming_the_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No internal error at load: an unknown architecture and a folder without weights each give
    one line that names the model and the cause."""
    import json

    from metroline.cli import main

    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_arch", "hidden_size": 8}))
    no_weights = tmp_path / "no_weights"
    AutoConfig.for_model("llama", **LLAMA_LIKE).save_pretrained(no_weights)
    for folder, expected in ((unknown, "cannot read its config"), (no_weights, "llama: cannot load its weights")):
        capsys.readouterr()
        assert main(["generate", "--model", str(folder), "--max-new-tokens", "2", "hello"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("metroline: error: --model") and expected in lines[0], lines
        assert "internal error" not in lines[0]
