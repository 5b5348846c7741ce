"""The Triton paged-prefill kernel: sequences with more than one query token (prefill chunks).

One program per (sequence, KV head, tile of query tokens): the rows of a tile are its query tokens x
the query heads sharing the KV head, attended against tiles of keys with the causal mask and an
online softmax (`triton_common.attend`). Every program whose sequence has one query token returns at
once (the decode kernel serves it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_common import PagedArgs, add_sink, attend


@triton.jit
def prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    qk_scale, cap_in, cap_out, window, block_size, head_dim, s_bt, q_strides, out_strides, kc_strides, vc_strides,
    GROUP: tl.constexpr, TILE_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    t0 = tl.program_id(2) * TILE_TOKENS
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if q_len <= 1 or t0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_pos = seq_len - q_len  # position of query token 0

    # row r of the tile: query token t0 + r // GROUP, query head kv_head * GROUP + r % GROUP
    rows = tl.arange(0, BLOCK_M)
    tok = t0 + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_mask = (rows < TILE_TOKENS * GROUP) & (tok < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    io_mask = row_mask[:, None] & d_mask[None, :]
    tok64 = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + tok64[:, None] * q_strides[0] + head[:, None] * q_strides[1] + offs_d[None, :] * q_strides[2],
                mask=io_mask, other=0.0)
    row_pos = tl.where(row_mask, first_pos + tok, -1)
    hi = first_pos + tl.minimum(t0 + TILE_TOKENS, q_len)
    lo = 0
    if HAS_WINDOW:  # the tile's first query sees nothing older than its window, nor do the others
        lo = tl.maximum(first_pos + t0 - window + 1, 0)
    acc, m_i, l_i = attend(
        q, row_pos, lo, hi, k_cache_ptr, v_cache_ptr, bt_ptr + seq.to(tl.int64) * s_bt, kv_head, block_size,
        qk_scale, cap_in, cap_out, window, kc_strides, vc_strides, offs_d, d_mask, BLOCK_M, BLOCK_N, BLOCK_D, IEEE,
        HAS_SOFTCAP, HAS_WINDOW,
    )
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0) * 1.4426950408889634
        acc, m_i, l_i = add_sink(acc, m_i, l_i, sink)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tok64[:, None] * out_strides[0] + head[:, None] * out_strides[1]
             + offs_d[None, :] * out_strides[2], out.to(out_ptr.dtype.element_ty), mask=io_mask)


def launch_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, paged: PagedArgs, *,
    max_query_len: int, block_m: int, block_n: int, block_d: int, ieee: bool, warps: int, softcap: bool,
    window: bool, sinks: bool,
) -> None:
    """Attend every sequence of the batch with more than one query token into `out` (`paged`: the arguments
    the kernels share); `max_query_len` bounds the
    grid and must be >= the longest query."""
    num_seqs, num_kv_heads = paged.block_tables.shape[0], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    rows = max(block_m, triton.next_power_of_2(group))
    tile_tokens = rows // group
    prefill_kernel[(num_seqs, num_kv_heads, math.ceil(max_query_len / tile_tokens))](
        q, k_cache, v_cache, out, *paged,
        GROUP=group, TILE_TOKENS=tile_tokens, BLOCK_M=rows, BLOCK_N=block_n, BLOCK_D=block_d, IEEE=ieee,
        HAS_SOFTCAP=softcap, HAS_WINDOW=window, HAS_SINKS=sinks, num_warps=warps,
    )
