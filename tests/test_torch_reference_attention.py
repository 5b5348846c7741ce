"""The torch reference paged attention against dense causal attention (torch SDPA) over
contiguous keys and values: mixed prefill chunks and decodes, grouped-query heads, scattered
blocks and runs of consecutive blocks (a lone sequence's are read as a view of the cache), padded
block tables."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from metroline.executors.torch.reference_attention import paged_attention, write_kv

SHAPES = {
    # (context after the step, new tokens): a decode, a chunk after a cached prefix, a whole prompt,
    # a decode on a context that ends exactly at a block boundary
    "mixed": [(9, 1), (11, 5), (6, 6), (8, 1)],
    # equal (query, context) shapes batched together: adjacent and apart, whole prompts and
    # chunks after a prefix, decodes around them
    "batched": [(7, 7), (7, 7), (3, 1), (10, 3), (7, 7), (10, 3), (13, 1), (10, 3)],
    "decodes only": [(5, 1), (17, 1), (1, 1), (16, 1)],
    # decodes of one context length: no mask
    "equal decodes": [(9, 1), (9, 1), (9, 1)],
    # a lone sequence (batch 1): its blocks as a view when consecutive
    "one decode": [(13, 1)],
    "one chunk": [(13, 6)],
    "one prompt": [(10, 10)],
}


@pytest.mark.parametrize("consecutive", [False, True], ids=["scattered", "consecutive"])
@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
def test_paged_attention_equals_dense_causal_attention(shapes, consecutive):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, bs, num_blocks = 4, 2, 8, 4, 64
    k_cache = torch.zeros(num_blocks, bs, kv_heads, dim)
    v_cache = torch.zeros(num_blocks, bs, kv_heads, dim)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, qs, dense, start = [], [], [], 3
    for ctx, new in shapes:
        nb = -(-ctx // bs)
        if consecutive:
            table, start = list(range(start, start + nb)), start + nb
        else:
            table = [perm.pop() for _ in range(nb)]
        tables.append(table)
        k = torch.randn(ctx, kv_heads, dim, generator=g)
        v = torch.randn(ctx, kv_heads, dim, generator=g)
        q = torch.randn(new, heads, dim, generator=g)
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(ctx)])
        write_kv(k_cache, v_cache, k, v, slots)
        qs.append(q)
        # dense: query i sits at position ctx - new + i and sees positions <= its own
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - new, ctx)[:, None]
        ref = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(heads // kv_heads, 1).transpose(0, 1),
            v.repeat_interleave(heads // kv_heads, 1).transpose(0, 1), attn_mask=mask, scale=0.3,
        )
        dense.append(ref.transpose(0, 1))
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    seq_lens = torch.tensor([c for c, _ in shapes], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor([n for _, n in shapes]).cumsum(0).tolist()], dtype=torch.int32)
    out = paged_attention(torch.cat(qs), k_cache, v_cache, block_tables, seq_lens, qsl, 0.3)
    assert out.shape == (sum(n for _, n in shapes), heads, dim)
    torch.testing.assert_close(out, torch.cat(dense), atol=1e-5, rtol=1e-5)
