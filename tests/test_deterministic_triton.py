"""The deterministic mode's Triton attention (`triton_invariant`), under Triton's interpreter on
CPU (compiled on CUDA when there is one): a row's output is bitwise the same whether it is a decode
alone, a row of a whole prompt, of a chunk, or among other sequences' rows; and it is attention
(close to the torch reference). Small shapes: the interpreter is slow."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
_PREFIX = "metroline.executors.torch.triton_"
ti = importlib.import_module(_PREFIX + "invariant")
if not HAS_CUDA and not sys.modules[_PREFIX + "common"].interpreted():
    for _name in [n for n in sys.modules if n.startswith(_PREFIX)]:
        del sys.modules[_name]
    ti = importlib.import_module(_PREFIX + "invariant")
if not HAS_CUDA and not sys.modules[_PREFIX + "common"].interpreted():
    pytest.skip("CPU tensors need TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)

from metroline.executors.torch import reference_attention  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
BS, KV_HEADS, HEADS, DIM = 4, 2, 4, 16


def caches(blocks: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (blocks, BS, KV_HEADS, DIM)
    return (torch.randn(shape, generator=g).to(DEVICE), torch.randn(shape, generator=g).to(DEVICE))


def attend(q, k_cache, v_cache, tables, lens, q_lens, **variant):
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    bt = torch.tensor(tables, dtype=torch.int32, device=DEVICE)
    sl = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    layout = ti.plan_step(bt, sl, starts, BS)
    return ti.attend(q, k_cache, v_cache, layout, DIM ** -0.5, **variant), (bt, sl, starts)


@pytest.mark.parametrize("variant", [{}, {"window": 5}, {"softcap": 2.0}, {"sinks": "yes"}],
                         ids=["plain", "window", "softcap", "sinks"])
def test_a_row_is_the_same_alone_in_a_prompt_in_a_chunk_and_among_others(variant):
    if variant.get("sinks"):
        variant = {"sinks": torch.linspace(-1, 1, HEADS, device=DEVICE)}
    k_cache, v_cache = caches(16, seed=0)
    g = torch.Generator().manual_seed(1)
    ctx = 11  # sequence A: blocks 0..2, positions 0..10
    q_a = torch.randn(ctx, HEADS, DIM, generator=g).to(DEVICE)
    q_b = torch.randn(6, HEADS, DIM, generator=g).to(DEVICE)
    table_a, table_b = [0, 1, 2, 0], [5, 6, 0, 0]
    whole, _ = attend(q_a, k_cache, v_cache, [table_a], [ctx], [ctx], **variant)
    decode, _ = attend(q_a[-1:], k_cache, v_cache, [table_a], [ctx], [1], **variant)
    chunk, _ = attend(q_a[7:], k_cache, v_cache, [table_a], [ctx], [4], **variant)
    mixed, meta = attend(torch.cat([q_b, q_a[7:]]), k_cache, v_cache, [table_b, table_a], [6, ctx], [6, 4], **variant)
    assert torch.equal(decode[0], whole[-1])
    assert torch.equal(chunk, whole[7:])
    assert torch.equal(mixed[6:], whole[7:])
    ref = reference_attention.paged_attention(torch.cat([q_b, q_a[7:]]), k_cache, v_cache, *meta, DIM ** -0.5,
                                              **variant)
    torch.testing.assert_close(mixed, ref, rtol=1e-4, atol=1e-4)
