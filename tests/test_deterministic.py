"""The deterministic mode (`EngineConfig.deterministic`): a request's tokens and logprobs are bitwise
the ones it gets alone, whatever its companions (1, 7, 31), its prompt's chunking (16, 64 tokens,
whole), its place in the batch, preemption by recompute and by swap, a prefix hit, and the policy
(fcfs, srpt), in float32 and bfloat16, on SmolLM2 and on tiny random models of three more
architectures of the support matrix (Qwen3's q/k norms, Gemma2's softcaps and sliding window,
GPT-NeoX's layer norms and parallel residual). Logprobs are compared by their bits, not with a
tolerance.

The negative control (`control_differences`): the same scenarios in the mode with one thing
changed, `TileSplitControl`: a step that holds rows of more than one sequence walks its keys in
splits of `CONTROL_SPLIT` positions instead of `KV_SPLIT` (a reduction order chosen from the
batch, what a split-KV attention kernel does); a step of one sequence, every alone run's, is the
mode's own. The requests then differ from their alone runs, so these tests can fail. The control's
effect cannot depend on the host: the order it changes is in metroline's own code (an online
softmax over more, shorter splits: a new running max and a rescale of the sum and the output by
`exp(m_old - m_new)` at each added boundary, shorter pairwise sums), so the change is there on any
x86-64 CPU, at any oneDNN ISA level and thread count; it does not wait for a library kernel to pick
another algorithm for another shape. (The default mode's own differences are the host's: on an AMD
EPYC with AVX2 chunked prefill changes a request's bits, on an Intel Xeon with AVX-512 the tiny
Llama's float32 quick scenarios changed none; no test rests on them.)

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
from metroline.executors.torch import TorchExecutor, invariant_attention
from metroline.executors.torch.invariant_attention import KV_SPLIT
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
second of which reads KV that a decode row wrote. In the mode every forward is a multiple of 32
rows, so a lone decode costs as much as 32 prompt tokens: each token past these would add a model call to every
one of the 8 alone runs and every scenario (and bfloat16 is 4-6x float32 on CPUs without bfloat16
instructions) without a kind of step the first three do not already have."""
SMOLLM2_SEARCH = ("companions-1", "chunk-16", "companions-7", "recompute-7", "swap-7")
"""The order in which the negative control (`control_differences(..., first=True)`) looks for a
difference on SmolLM2: the cheapest scenario first, the first two of the subset's prompts together
(50 and 79 tokens: 7 model calls, where chunk-16 takes 16), whose steps hold rows of both requests,
so their rows past position `CONTROL_SPLIT` are summed in the control's order; then the subset,
chunked prefill first (its steps hold two prompts' chunks from the first step on). Every request of
these has its alone run in the subset's."""
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


def run(ex: TorchExecutor, items: list[tuple[int, list[int]]], max_new: int = MAX_NEW, control: bool = False,
        **settings: Any) -> tuple[dict, list]:
    """Run `items` (request index, prompt) through one engine in the mode; with `control`, with
    the negative control's attention (`TileSplitControl`) in place of the mode's."""
    eng = Engine(EngineConfig(**{**BASE, **settings, "deterministic": True}), ex)
    if control:
        ex._invariant_ops = TileSplitControl(ex)  # bind() set the mode's own; the next engine's bind resets it
    results = eng.generate(request(i, p, max_new) for i, p in items)
    eng.pool.check_invariants([])
    seqs = [s for v in results.values() for s in v]
    return {s.request_id: fingerprint(s) for s in seqs}, seqs


CONTROL_SPLIT = KV_SPLIT // 4
"""Key positions per split in the negative control's steps that hold rows of more than one sequence
(the mode's is `KV_SPLIT`)."""


class TileSplitControl:
    """The negative control's attention, put in the executor's place of the mode's: the mode's own
    `invariant_attention`, except that a step holding rows of more than one sequence (the padding
    rows, whose blocks are the scratch one, do not count) walks its keys in splits of
    `CONTROL_SPLIT` positions instead of `KV_SPLIT`. Each cut adds a step of the online softmax (a
    new running max, a rescale of the sum and of the output by `exp(m_old - m_new)`, shorter
    pairwise sums), so a row past position `CONTROL_SPLIT` is summed in another order whenever
    companions share its step. A step of one sequence gets the mode's layout unchanged: a request
    alone has the mode's bits."""

    write_kv = staticmethod(invariant_attention.write_kv)
    attend = staticmethod(invariant_attention.attend)

    def __init__(self, ex: TorchExecutor) -> None:
        self.ex = ex

    def plan_step(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                  block_size: int) -> invariant_attention.BlockLayout:
        scratch = self.ex.kv.num_blocks - 2  # the block the padding rows use (`invariant_step`)
        shared = int((block_tables[:, 0] != scratch).sum()) >= 2
        return invariant_attention.plan_step(block_tables, seq_lens, query_start_loc, block_size,
                                             CONTROL_SPLIT if shared else KV_SPLIT)


def prefix_case(ex: TorchExecutor, vocab: int, alone: dict[str, tuple], max_new: int = MAX_NEW) -> int:
    """A request whose first two blocks of 16 another request computed before (a prefix hit), in
    the mode, against the same request run alone in its own engine; returns 1 when they differ.
    The request is the first one of `alone` (from `alone_runs`, whose fingerprint is that alone
    run) that draws with a seed and has a prompt of at least 48 tokens, so 16 or more of its
    prompt tokens are computed after the hit; the warm request shares its first 40 tokens."""
    prompts = prompts_for(vocab)
    i = next(i for i in range(len(alone)) if i % 4 == 1 and len(prompts[i]) >= 48)
    eng = Engine(EngineConfig(**BASE, deterministic=True), ex)
    warm = request(len(prompts), prompts[i][:40] + [1, 2, 3])
    warm["sampling"]["max_new_tokens"] = 1  # it only fills the cache: its own decodes would prove nothing
    eng.generate([warm])
    results = eng.generate([request(i, prompts[i], max_new)])
    (seq,) = results[str(i)]
    assert seq.num_cached_prompt_tokens >= 32  # two whole blocks of 16 came from the cache
    return int(fingerprint(seq) != alone[str(i)])


def alone_runs(ex: TorchExecutor, vocab: int, scenarios: tuple[str, ...], max_new: int = MAX_NEW) -> dict[str, tuple]:
    """In the mode, the fingerprint of every request that `scenarios` use, each run alone in its
    own engine (each generating `max_new` tokens)."""
    prompts = prompts_for(vocab)
    alone: dict[str, tuple] = {}
    for i in range(max(abs(SCENARIOS[name][0]) for name in scenarios)):
        alone.update(run(ex, [(i, prompts[i])], max_new)[0])
    return alone


def scenario_differences(ex: TorchExecutor, vocab: int, name: str, alone: dict[str, tuple], max_new: int = MAX_NEW,
                         control: bool = False) -> int:
    """How many requests of scenario `name`, run in the mode (with `control`: under
    `TileSplitControl`), differ from their `alone` fingerprints; a recompute or swap scenario must
    preempt."""
    count, settings = SCENARIOS[name]
    items = list(enumerate(prompts_for(vocab)[:abs(count)]))
    got, seqs = run(ex, items[::-1] if count < 0 else items, max_new, control, **settings)
    if name.startswith(("recompute", "swap")):
        assert sum(s.num_preemptions for s in seqs) > 0, f"{name}: nothing was preempted"
    assert got.keys() == {str(i) for i, _ in items}
    return sum(got[rid] != alone[rid] for rid in got)


def differences(ex: TorchExecutor, vocab: int, scenarios: tuple[str, ...], alone: dict[str, tuple],
                max_new: int = MAX_NEW) -> dict[str, int]:
    """In the mode: for each scenario (then "prefix-hit"), how many requests' fingerprints differ
    from the same request run alone (`alone`, from `alone_runs`)."""
    found = {name: scenario_differences(ex, vocab, name, alone, max_new) for name in scenarios}
    found["prefix-hit"] = prefix_case(ex, vocab, alone, max_new)
    return found


def control_differences(ex: TorchExecutor, vocab: int, scenarios: tuple[str, ...], alone: dict[str, tuple],
                        max_new: int = MAX_NEW, first: bool = False) -> dict[str, int]:
    """The negative control: for each scenario, how many requests' fingerprints under
    `TileSplitControl` differ from their alone fingerprints in the mode (`alone`, which the control
    leaves as they are: a request alone shares no step); with `first`, it stops after the first
    scenario with a difference (all "the scenarios can fail" needs on a model where a run is dear)."""
    found: dict[str, int] = {}
    for name in scenarios:
        found[name] = scenario_differences(ex, vocab, name, alone, max_new, control=True)
        if first and found[name]:
            break
    return found


def tiny(name: str, dtype: torch.dtype) -> tuple[TorchExecutor, int]:
    case = {c.name: c for c in CASES}[name]
    return TorchExecutor(build(case).to(dtype)), case.config["vocab_size"]


def test_quick_matrix_tiny_llama() -> None:
    """The quick subset on the tiny Llama (float32): bitwise equal with the mode; under the negative
    control (`TileSplitControl`) some request differs from its alone run in every scenario of the
    subset. The control cannot depend on the host: it changes the order of metroline's own float32
    sums (`invariant_attention`'s online softmax over splits of 16 keys instead of 64) in every step
    that companions share, whatever the CPU's kernels, ISA level or thread count; alone, it is the
    mode, as the first request run alone under it shows."""
    ex = TorchExecutor(tiny_llama())
    alone = alone_runs(ex, 128, QUICK)
    assert differences(ex, 128, QUICK, alone) == {name: 0 for name in (*QUICK, "prefix-hit")}
    assert run(ex, [(0, prompts_for(128)[0])], control=True)[0] == {"0": alone["0"]}
    control = control_differences(ex, 128, QUICK, alone)
    assert all(control.values()), control


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", *ARCHITECTURES])
def test_full_matrix_tiny_models(name: str, dtype: torch.dtype) -> None:
    """The whole matrix: bitwise equal with the mode. In float32, under the negative control
    (`TileSplitControl`, see `test_quick_matrix_tiny_llama` for why its effect cannot depend on the
    host) some request differs in every scenario, on every architecture. (In bfloat16 each layer's
    attention output is rounded to 8 bits of mantissa, which absorbs most float32 reorderings on
    models this small; SmolLM2's bfloat16 test has its own control.)"""
    ex, vocab = tiny(name, dtype)
    alone = alone_runs(ex, vocab, tuple(SCENARIOS))
    assert differences(ex, vocab, tuple(SCENARIOS), alone) == {n: 0 for n in (*SCENARIOS, "prefix-hit")}
    if dtype == torch.float32:
        control = control_differences(ex, vocab, tuple(SCENARIOS), alone)
        assert all(control.values()), control


def test_mixture_of_experts_refused_in_the_mode() -> None:
    case = {c.name: c for c in CASES}["mixtral"]
    ex = TorchExecutor(build(case))
    with pytest.raises(UnsupportedModel, match=r"^mixtral: deterministic mode: .*cannot be made batch-invariant: "
                                               r"it runs aten\.\w+\.default, which splits its work"):
        Engine(EngineConfig(**BASE, deterministic=True), ex)
    Engine(EngineConfig(**BASE), ex)  # without the mode it runs as before


def test_padding_rows_write_only_the_scratch_block() -> None:
    """A step of 3 tokens is padded with 29 rows: they write the first block past the pool's,
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
