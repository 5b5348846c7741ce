"""The deterministic mode (`EngineConfig.deterministic`): a request's tokens and logprobs are bitwise
the ones it gets alone, whatever its companions (1, 7, 31), its prompt's chunking (16, 64 tokens,
whole), its place in the batch, preemption by recompute and by swap, a prefix hit, and the policy
(fcfs, srpt), in float32 and bfloat16, on SmolLM2 and on tiny random models of three more
architectures of the support matrix (Qwen3's q/k norms, Gemma2's softcaps and sliding window,
GPT-NeoX's layer norms and parallel residual). Logprobs are compared by their bits, not with a
tolerance. Without the mode, the same runs differ (so these tests can fail).

Half of the requests are greedy, half draw (temperature 0.8, top_p 0.9), seeded or not (an
unseeded one draws from a stream keyed on its request id in the mode).
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest
import torch
from test_model_support import CASES, build
from torch_helpers import tiny_llama

from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.executors.torch import TorchExecutor
from metroline.executors.torch.support import UnsupportedModel

MAX_NEW = 6
BASE = dict(num_blocks=512, block_size=16)
SCENARIOS: dict[str, tuple[int, dict[str, Any]]] = {
    # name: (how many of the prompts run together, the engine's settings)
    "companions-1": (2, {}),
    "companions-7": (8, {}),
    "companions-31": (32, {}),
    "reversed-7": (-8, {}),  # the same 8 in reverse order: other places in the batch
    "chunk-16": (8, dict(max_prefill_chunk=16)),
    "chunk-64": (32, dict(max_prefill_chunk=64)),
    "recompute": (16, dict(num_blocks=24)),
    "swap": (16, dict(num_blocks=24, preemption_mode="swap", swap_space_blocks=256)),
    # the same with 8 prompts (SmolLM2's: fewer alone runs); 18 blocks preempt on the 8 prompts of every
    # vocabulary here (96, 1000), where 12 preempted nothing on SmolLM2's (vocabulary 1000)
    "recompute-7": (8, dict(num_blocks=18)),
    "swap-7": (8, dict(num_blocks=18, preemption_mode="swap", swap_space_blocks=128)),
    "srpt-31": (32, dict(policy="srpt")),
    "srpt-chunk-16": (8, dict(policy="srpt", max_prefill_chunk=16)),
}
QUICK = ("companions-7", "chunk-16", "recompute", "swap")
SMOLLM2 = ("companions-7", "chunk-16", "recompute-7", "swap-7")
"""SmolLM2's subset: 7 companions, 16-token chunks, preemption by recompute and by swap, all on
the same 8 prompts (each of them run alone once)."""
SMOLLM2_MAX_NEW = 3
"""Tokens each request generates on SmolLM2: the first (from the prefill) and two decodes, the
second of which reads KV that a decode row wrote. In the mode every forward is 32 rows, so a lone
decode costs as much as 32 prompt tokens: each token past these would add a model call to every
one of the 8 alone runs and every scenario (and bfloat16 is 4-6x float32 on CPUs without bfloat16
instructions) without a kind of step the first three do not already have."""
SMOLLM2_SEARCH = ("chunk-16", "companions-7", "recompute-7", "swap-7")
"""The order in which `first_difference` looks for a difference without the mode on SmolLM2:
the subset, chunked prefill first (7 companions prefilled in one step gave every greedy and seeded
request its alone bits in both dtypes, so starting there ran six requests alone for nothing)."""
ARCHITECTURES = ("qwen3", "gemma2", "gpt_neox")


def prompts_for(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 80))] for _ in range(32)]


def request(i: int, prompt: list[int], max_new: int = MAX_NEW) -> dict[str, Any]:
    sampling: dict[str, Any] = {"max_new_tokens": max_new, "ignore_eos": True, "logprobs": 1}
    if i % 2:
        sampling.update(temperature=0.8, top_p=0.9, seed=i if i % 4 == 1 else None)
    else:
        sampling.update(temperature=0.0)
    return {"request_id": str(i), "prompt_token_ids": prompt, "sampling": sampling}


def fingerprint(seq: Any) -> tuple:
    """A sequence's tokens and the exact bits of every logprob (chosen and top-1)."""
    bits = tuple(struct.pack("<dd", chosen, top[0][1]) for chosen, top in seq.logprobs)
    return tuple(seq.output_token_ids), bits


def run(ex: TorchExecutor, items: list[tuple[int, list[int]]], deterministic: bool, max_new: int = MAX_NEW,
        **settings: Any) -> tuple[dict, list]:
    eng = Engine(EngineConfig(**{**BASE, **settings, "deterministic": deterministic}), ex)
    results = eng.generate(request(i, p, max_new) for i, p in items)
    eng.pool.check_invariants([])
    seqs = [s for v in results.values() for s in v]
    return {s.request_id: fingerprint(s) for s in seqs}, seqs


def prefix_case(ex: TorchExecutor, vocab: int, deterministic: bool, max_new: int = MAX_NEW) -> int:
    """A prompt whose first 40 tokens another request computed before (a prefix hit) against the
    same prompt alone in a fresh engine; returns 1 when they differ."""
    rng = random.Random(7)
    head = [rng.randrange(vocab) for _ in range(40)]
    first, second = head + [1, 2, 3], head + [rng.randrange(vocab) for _ in range(13)]
    alone, _ = run(ex, [(5, second)], deterministic, max_new)
    eng = Engine(EngineConfig(**BASE, deterministic=deterministic), ex)
    warm = request(4, first)
    warm["sampling"]["max_new_tokens"] = 1  # it only fills the cache: its own decodes would prove nothing
    eng.generate([warm])
    results = eng.generate([request(5, second, max_new)])
    (seq,) = results["5"]
    assert seq.num_cached_prompt_tokens >= 32  # two whole blocks of 16 came from the cache
    return int(fingerprint(seq) != alone["5"])


def differences(ex: TorchExecutor, vocab: int, deterministic: bool, scenarios: tuple[str, ...],
                max_new: int = MAX_NEW) -> dict[str, int]:
    """For each scenario, how many requests' fingerprints differ from the same request run alone
    (each request generating `max_new` tokens)."""
    prompts = prompts_for(vocab)
    needed = max(abs(SCENARIOS[name][0]) for name in scenarios)
    alone = {}
    for i in range(needed):
        alone.update(run(ex, [(i, prompts[i])], deterministic, max_new)[0])
    found = {}
    for name in scenarios:
        count, settings = SCENARIOS[name]
        items = list(enumerate(prompts[:abs(count)]))
        got, seqs = run(ex, items[::-1] if count < 0 else items, deterministic, max_new, **settings)
        if name.startswith(("recompute", "swap")):
            assert sum(s.num_preemptions for s in seqs) > 0, f"{name}: nothing was preempted"
        # without the mode an unseeded draw differs by design (a generator the rows share): only
        # greedy and seeded requests count there, so a difference is one of numbers
        counted = [rid for rid in got if deterministic or int(rid) % 4 != 3]
        found[name] = sum(got[rid] != alone[rid] for rid in counted)
    found["prefix-hit"] = prefix_case(ex, vocab, deterministic, max_new)
    return found


def first_difference(ex: TorchExecutor, vocab: int, scenarios: tuple[str, ...], max_new: int = MAX_NEW) -> str | None:
    """Without the mode: the first of `scenarios` (then "prefix-hit") in which a greedy or seeded
    request's fingerprint differs from the same request run alone, or None when none does. It stops
    at the first difference, which is all "without the mode the runs differ" needs; a request is run
    alone only when its turn comes. (An unseeded draw differs by design without the mode: it does
    not count.)"""
    prompts = prompts_for(vocab)
    alone: dict[str, tuple] = {}
    for name in scenarios:
        count, settings = SCENARIOS[name]
        items = list(enumerate(prompts[:abs(count)]))
        got, _ = run(ex, items[::-1] if count < 0 else items, False, max_new, **settings)
        for i, prompt in items:
            if i % 4 == 3:
                continue
            if str(i) not in alone:
                alone.update(run(ex, [(i, prompt)], False, max_new)[0])
            if got[str(i)] != alone[str(i)]:
                return name
    return "prefix-hit" if prefix_case(ex, vocab, False, max_new) else None


def smollm2_subset(dtype: str) -> None:
    """SmolLM2-135M in `dtype` on its subset (`SMOLLM2`) and a prefix hit: bitwise equal with the
    mode; and without it, some request's bits differ (`tests/test_deterministic_smollm2*.py`, one
    file per dtype, so that `pytest -n 2 --dist loadfile` runs them in both workers), each request
    generating `SMOLLM2_MAX_NEW` tokens."""
    ex = TorchExecutor.from_options(model="smollm2", dtype=dtype)
    assert differences(ex, 1000, True, SMOLLM2, SMOLLM2_MAX_NEW) == {name: 0 for name in (*SMOLLM2, "prefix-hit")}
    assert sorted(SMOLLM2_SEARCH) == sorted(SMOLLM2)
    assert first_difference(ex, 1000, SMOLLM2_SEARCH, SMOLLM2_MAX_NEW) is not None


def tiny(name: str, dtype: torch.dtype) -> tuple[TorchExecutor, int]:
    case = {c.name: c for c in CASES}[name]
    return TorchExecutor(build(case).to(dtype)), case.config["vocab_size"]


def test_quick_matrix_tiny_llama() -> None:
    """The quick subset on the tiny Llama (float32): bitwise equal with the mode, not without."""
    ex = TorchExecutor(tiny_llama())
    assert differences(ex, 128, True, QUICK) == {name: 0 for name in (*QUICK, "prefix-hit")}
    assert first_difference(ex, 128, QUICK) is not None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", *ARCHITECTURES])
def test_full_matrix_tiny_models(name: str, dtype: torch.dtype) -> None:
    ex, vocab = tiny(name, dtype)
    assert differences(ex, vocab, True, tuple(SCENARIOS)) == {n: 0 for n in (*SCENARIOS, "prefix-hit")}


@pytest.mark.slow
def test_without_the_mode_outputs_differ() -> None:
    """The same matrix without the mode, float32: every architecture differs somewhere. (In
    bfloat16 the tiny models' logits round these differences away; SmolLM2 shows them.)"""
    for name in ("llama", *ARCHITECTURES):
        ex, vocab = tiny(name, torch.float32)
        assert first_difference(ex, vocab, tuple(SCENARIOS)) is not None, name


def test_mixture_of_experts_refused_in_the_mode() -> None:
    case = {c.name: c for c in CASES}["mixtral"]
    ex = TorchExecutor(build(case))
    with pytest.raises(UnsupportedModel, match=r"^mixtral: deterministic mode: .*cannot be made batch-invariant: "
                                               r"it runs aten\.\w+\.default, which splits its work"):
        Engine(EngineConfig(**BASE, deterministic=True), ex)
    Engine(EngineConfig(**BASE), ex)  # without the mode it runs as before


def test_padding_rows_write_only_the_scratch_block() -> None:
    """A step of 3 tokens pads its tile with 29 rows: they write the first block past the pool's,
    never a block of the pool, nor the last (the zeros read in place of keys past a row's own)."""
    ex = TorchExecutor(tiny_llama())
    eng = Engine(EngineConfig(num_blocks=4, block_size=16, deterministic=True), ex)
    assert ex.kv.num_blocks == 6 and ex.describe()["deterministic"] is True
    eng.generate([request(0, [5, 6, 7])])
    written = (ex.kv.k.abs().sum(dim=(0, 2, 3, 4)) > 0).tolist()  # per block
    assert sum(written[:4]) == 1 and written[4:] == [True, False]  # its own block, the scratch one


@pytest.mark.parametrize("name", ["llama", *ARCHITECTURES])
def test_the_mode_is_the_same_model(name: str) -> None:
    """Greedy tokens in the mode, chunked (chunks of 5) with 9 companions, are HF `generate`'s
    one prompt at a time (float32, eager): batch invariance does not change what is computed."""
    from test_model_support import MAX_NEW as SUPPORT_NEW
    from test_model_support import hf_greedy_each
    from test_model_support import prompts_for as support_prompts

    case = {c.name: c for c in CASES}[name]
    model = build(case)
    plain, _ = support_prompts(case, seed=1)
    refs = hf_greedy_each(model, plain)
    eng = Engine(EngineConfig(num_blocks=256, block_size=8, max_prefill_chunk=5, max_num_batched_tokens=64,
                              deterministic=True), TorchExecutor(model))
    results = eng.generate({"request_id": str(i), "prompt_token_ids": p, "sampling": {
        "max_new_tokens": SUPPORT_NEW, "temperature": 0.0, "ignore_eos": True}} for i, p in enumerate(plain))
    assert [results[str(i)][0].output_token_ids for i in range(len(plain))] == refs
