"""Triton kernels for attention over metroline's paged KV cache (the CUDA path of the torch executor).

Layout, per layer: ``k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]``; token
position ``p`` of a sequence lives in block ``block_table[p // block_size]`` at offset
``p % block_size`` (slot ``block_id * block_size + offset``).

- `write_kv` stores a step's new K and V at their slots (one Triton program per token, all KV heads,
  K and V in one launch; a negative slot is skipped, as padding).
- `paged_attention` attends a packed batch of query tokens (prefill chunks and decodes, no padding)
  over each sequence's paged context. Query token ``i`` of sequence ``s`` sits at position
  ``seq_lens[s] - q_len_s + i`` and attends to every position up to its own, so a prefill chunk over
  a cached prefix and a decode follow one rule. Sequences with one query token go to the decode
  kernel (one program per sequence, KV head and key split: the group of query heads sharing that KV
  head are the rows of one tile, online softmax over key tiles, the splits merged by a second small
  kernel); sequences with more go to the prefill kernel (tiles of query tokens x their query heads
  against tiles of keys, causal mask, online softmax). Both launch over every sequence and a program
  whose sequence is not its kind returns at once, so the dispatch needs no copy to the host.

Key tiles are gathered position by position through the block table, so a tile may span several
blocks: any block size works (1 included) and the tile stays large enough for tensor cores.
Softmax statistics and the output accumulate in float32; float32 inputs use exact (IEEE) dot
products, not TF32. Without CUDA the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported), which is how the tests run them.

This module holds the two entry points and the `write_kv` kernel; the decode kernel and its merge
are in `triton_decode`, the prefill kernel in `triton_prefill`, and what they share (the online
softmax over paged keys, reductions, input checks) in `triton_common`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import DOT_MIN, PagedArgs, check_cache, check_device
from .triton_decode import choose_num_splits, launch_decode
from .triton_prefill import launch_prefill

LOG2E = 1.4426950408889634


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, block_size, num_kv_heads, head_dim,
    k_strides, v_strides, kc_strides, vc_strides, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < head_dim)
    k = tl.load(k_ptr + tok * k_strides[0] + h[:, None] * k_strides[1] + d[None, :] * k_strides[2], mask=mask)
    v = tl.load(v_ptr + tok * v_strides[0] + h[:, None] * v_strides[1] + d[None, :] * v_strides[2], mask=mask)
    kc = (k_cache_ptr + blk * kc_strides[0] + off * kc_strides[1] + h[:, None] * kc_strides[2]
          + d[None, :] * kc_strides[3])
    vc = (v_cache_ptr + blk * vc_strides[0] + off * vc_strides[1] + h[:, None] * vc_strides[2]
          + d[None, :] * vc_strides[3])
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``k, v: [num_tokens, num_kv_heads, head_dim]`` into the caches at ``slot_mapping``
    (integer [num_tokens], slot = block_id * block_size + offset; a negative slot is skipped)."""
    block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"k/v must both be [num_tokens, {num_kv_heads}, {head_dim}], got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype.is_floating_point:
        raise ValueError(f"slot_mapping must be an integer tensor of shape [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    check_device(k_cache, v_cache, k, v, slot_mapping)
    if k.shape[0] == 0:
        return
    write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(), block_size, num_kv_heads, head_dim,
        k.stride(), v.stride(), k_cache.stride(), v_cache.stride(),
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor, scale: float, *, max_query_len: int | None = None, max_seq_len: int | None = None,
    num_splits: int | None = None, block_m: int = 64, block_n: int = 32, window: int | None = None,
    softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of packed query tokens over their sequences' paged KV (the interface of
    `reference_attention.paged_attention`, plus launch hints).

    q: [num_tokens, num_heads, head_dim], tokens packed by sequence; query_start_loc: int
    [num_seqs + 1]; seq_lens: int [num_seqs], each sequence's context after this step (cached +
    new, the new K/V already written); block_tables: int [num_seqs, max_blocks], padded; every
    sequence has at least one query token. num_heads must be a multiple of num_kv_heads (query
    head h reads KV head h // (num_heads // num_kv_heads)). Returns [num_tokens, num_heads,
    head_dim] in q's dtype.

    Optional host-side hints, so that nothing is copied back from the device: `max_query_len`
    sizes the prefill grid (must be >= the longest query; default num_tokens - num_seqs + 1);
    `max_seq_len` (default block_tables' width x block_size) and `num_splits` (a power of two)
    choose the decode key splits; `block_m` (query rows per prefill tile) and `block_n` (keys per
    tile) are powers of two >= 16. Only `max_query_len` can change the result (if too small).

    The layer's variant, as `reference_attention.attend`: `window` (sliding window: keys older than
    `window` positions are masked and never read), `softcap` (logits `softcap * tanh(s / softcap)`),
    `sinks: [num_heads]` (one sink logit per query head in the softmax's denominator)."""
    block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    if q.dim() != 3 or q.shape[2] != head_dim:
        raise ValueError(f"q must be [num_tokens, num_heads, {head_dim}], got {tuple(q.shape)}")
    num_tokens, num_heads, _ = q.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if q.dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {q.dtype}")
    num_seqs = seq_lens.shape[0]
    if seq_lens.dim() != 1 or query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(f"query_start_loc must have num_seqs + 1 = {num_seqs + 1} entries, got {tuple(query_start_loc.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [{num_seqs}, max_blocks], got {tuple(block_tables.shape)}")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < DOT_MIN or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= {DOT_MIN}, got {value}")
    if num_splits is not None and (num_splits < 1 or num_splits & (num_splits - 1) or num_splits > 64):
        raise ValueError(f"num_splits must be a power of two in [1, 64], got {num_splits}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 (or None), got {window}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0 (or None), got {softcap}")
    if sinks is not None and (sinks.shape != (num_heads,)):
        raise ValueError(f"sinks must be [num_heads = {num_heads}], got {tuple(sinks.shape)}")
    check_device(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *(() if sinks is None else (sinks,)))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out

    seq_lens = seq_lens.contiguous()
    query_start_loc = query_start_loc.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    sink_logits = seq_lens if sinks is None else sinks.float().contiguous()  # any pointer when unused
    cap = float(softcap) if softcap is not None else 1.0
    paged = PagedArgs(block_tables, seq_lens, query_start_loc, sink_logits, float(scale) * LOG2E,
                      float(scale) / cap, cap * LOG2E, int(window or 0), block_size, head_dim,
                      block_tables.stride(0), q.stride(), out.stride(), k_cache.stride(), v_cache.stride())
    variant = {"softcap": softcap is not None, "window": window is not None, "sinks": sinks is not None}
    block_d = max(DOT_MIN, triton.next_power_of_2(head_dim))
    ieee = q.dtype == torch.float32
    # 8 warps where 4 spill registers (checked on sm_90 cubins: head dim 128, or float32 dots)
    warps = 8 if block_d >= 128 or ieee else 4

    max_context = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
    splits = num_splits or choose_num_splits(q.device, num_seqs * num_kv_heads, max_context, block_n)
    launch_decode(q, k_cache, v_cache, out, paged, splits=splits, block_n=block_n, block_d=block_d, ieee=ieee,
                  warps=warps, **variant)
    if num_tokens > num_seqs:  # some sequence has more than one query token
        bound = max_query_len if max_query_len is not None else num_tokens - num_seqs + 1
        launch_prefill(q, k_cache, v_cache, out, paged, max_query_len=bound, block_m=block_m, block_n=block_n,
                       block_d=block_d, ieee=ieee, warps=warps, **variant)
    return out
