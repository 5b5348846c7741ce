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
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256
MAX_SPLITS = 16
DOT_MIN = 16  # tl.dot on NVIDIA needs every dimension >= 16

# The kernels use only Triton builtins and the reduction helpers below, not triton.language's own
# @jit helpers (tl.max, tl.sum, tl.zeros, tl.cdiv): those are decorated when triton is first
# imported, so under the interpreter they fail if triton was imported before TRITON_INTERPRET was
# set. The interpreter reduces with numpy only for its own combine functions, so those are taken
# when they were decorated the same way as this module's kernels.


@triton.jit
def _own_max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _own_add(a, b):
    return a + b


_std_max = getattr(tl.standard, "_elementwise_max", None)
_std_add = getattr(tl.standard, "_sum_combine", None)
_same_mode = type(_std_max) is type(_own_max) and type(_std_add) is type(_own_add)
_max_fn = _std_max if _same_mode else _own_max
_add_fn = _std_add if _same_mode else _own_add


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, block_size, num_kv_heads, head_dim,
    s_kt, s_kh, s_kd, s_vt, s_vh, s_vd,
    s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
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
    k = tl.load(k_ptr + tok * s_kt + h[:, None] * s_kh + d[None, :] * s_kd, mask=mask)
    v = tl.load(v_ptr + tok * s_vt + h[:, None] * s_vh + d[None, :] * s_vd, mask=mask)
    kc = k_cache_ptr + blk * s_kcb + off * s_kcs + h[:, None] * s_kch + d[None, :] * s_kcd
    vc = v_cache_ptr + blk * s_vcb + off * s_vcs + h[:, None] * s_vch + d[None, :] * s_vcd
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend(
    q, acc, m_i, l_i, row_pos, lo, hi, k_cache_ptr, v_cache_ptr, bt_ptr, kv_head, block_size, qk_scale,
    s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd, offs_d, d_mask,
    BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):
    """Online softmax of the rows of `q` against key positions [lo, hi) of one sequence (block table
    at `bt_ptr`), each row seeing positions <= its `row_pos`; scores are in log2 units."""
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        blk = tl.load(bt_ptr + pos // block_size, mask=valid, other=0).to(tl.int64)
        off = pos % block_size
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + blk[:, None] * s_kcb + off[:, None] * s_kcs + kv_head * s_kch
                    + offs_d[None, :] * s_kcd, mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :] & (pos[None, :] <= row_pos[:, None]), s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _max_fn))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, _add_fn)
        v = tl.load(v_cache_ptr + blk[:, None] * s_vcb + off[:, None] * s_vcs + kv_head * s_vch
                    + offs_d[None, :] * s_vcd, mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    bt_ptr, seq_lens_ptr, qsl_ptr, qk_scale, block_size, head_dim, s_bt,
    s_qt, s_qh, s_qd, s_ot, s_oh, s_od,
    s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    tiles_per_split = ((seq_len + BLOCK_N - 1) // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS
    lo = split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    row_mask = rows < GROUP
    head = kv_head * GROUP + rows
    q = tl.load(q_ptr + q_start.to(tl.int64) * s_qt + head[:, None] * s_qh + offs_d[None, :] * s_qd,
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    row_pos = tl.full([BLOCK_M], 0, tl.int32) + (seq_len - 1)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc, m_i, l_i = _attend(
        q, acc, m_i, l_i, row_pos, lo, hi, k_cache_ptr, v_cache_ptr, bt_ptr + seq.to(tl.int64) * s_bt,
        kv_head, block_size, qk_scale, s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
        offs_d, d_mask, BLOCK_N, IEEE,
    )
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + q_start.to(tl.int64) * s_ot + head[:, None] * s_oh + offs_d[None, :] * s_od
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
    else:
        # partials: acc [seq, head, split, BLOCK_D], (m, l) [seq, head, split, 2], heads = H
        idx = (seq.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split
        tl.store(part_acc_ptr + idx[:, None] * BLOCK_D + offs_d[None, :], acc, mask=row_mask[:, None])
        tl.store(part_ml_ptr + idx * 2, m_i, mask=row_mask)
        tl.store(part_ml_ptr + idx * 2 + 1, l_i, mask=row_mask)


@triton.jit
def _decode_merge_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, qsl_ptr, head_dim, s_ot, s_oh, s_od,
    BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:
        return
    splits = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    idx = (seq.to(tl.int64) * tl.num_programs(1) + head) * NUM_SPLITS + splits
    m = tl.load(part_ml_ptr + idx * 2)
    l = tl.load(part_ml_ptr + idx * 2 + 1)
    acc = tl.load(part_acc_ptr + idx[:, None] * BLOCK_D + offs_d[None, :])
    w = tl.exp2(m - tl.reduce(m, 0, _max_fn))
    out = tl.reduce(acc * w[:, None], 0, _add_fn) / tl.reduce(l * w, 0, _add_fn)
    tl.store(out_ptr + q_start.to(tl.int64) * s_ot + head * s_oh + offs_d * s_od,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    bt_ptr, seq_lens_ptr, qsl_ptr, qk_scale, block_size, head_dim, s_bt,
    s_qt, s_qh, s_qd, s_ot, s_oh, s_od,
    s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
    GROUP: tl.constexpr, TILE_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, IEEE: tl.constexpr,
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
    q = tl.load(q_ptr + tok64[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :] * s_qd,
                mask=io_mask, other=0.0)
    row_pos = tl.where(row_mask, first_pos + tok, -1)
    hi = first_pos + tl.minimum(t0 + TILE_TOKENS, q_len)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc, m_i, l_i = _attend(
        q, acc, m_i, l_i, row_pos, 0, hi, k_cache_ptr, v_cache_ptr, bt_ptr + seq.to(tl.int64) * s_bt,
        kv_head, block_size, qk_scale, s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
        offs_d, d_mask, BLOCK_N, IEEE,
    )
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tok64[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :] * s_od,
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _interpreted() -> bool:
    return not isinstance(_decode_kernel, triton.runtime.JITFunction)


def _check_device(*tensors: torch.Tensor) -> None:
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"triton attention: all tensors must be on one device, got {t.device} and {device}")
    if device.type != "cuda" and not _interpreted():
        raise RuntimeError(
            f"triton attention needs CUDA tensors (got {device}); on CPU set TRITON_INTERPRET=1 "
            "before importing metroline.executors.torch.triton_attention, or use the torch reference"
        )


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be <= {MAX_HEAD_DIM}, got {head_dim}")
    return block_size, num_kv_heads, head_dim


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``k, v: [num_tokens, num_kv_heads, head_dim]`` into the caches at ``slot_mapping``
    (integer [num_tokens], slot = block_id * block_size + offset; a negative slot is skipped)."""
    block_size, num_kv_heads, head_dim = _check_cache(k_cache, v_cache)
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"k/v must both be [num_tokens, {num_kv_heads}, {head_dim}], got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype.is_floating_point:
        raise ValueError(f"slot_mapping must be an integer tensor of shape [{k.shape[0]}], got {tuple(slot_mapping.shape)}")
    _check_device(k_cache, v_cache, k, v, slot_mapping)
    if k.shape[0] == 0:
        return
    _write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(), block_size, num_kv_heads, head_dim,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )


_SM_COUNT: dict[int, int] = {}


def _num_splits(device: torch.device, programs: int, max_context: int, block_n: int) -> int:
    """Key splits for the decode kernel: enough programs to fill the GPU twice over, each split
    keeping at least 4 key tiles; 1 when the interpreter runs."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    splits = 1
    while splits < MAX_SPLITS and programs * splits < 2 * _SM_COUNT[index] and max_context >= 8 * block_n * splits:
        splits *= 2
    return splits


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_m: int = 64,
    block_n: int = 32,
) -> torch.Tensor:
    """Causal attention of packed query tokens over their sequences' paged KV.

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
    tile) are powers of two >= 16. Only `max_query_len` can change the result (if too small)."""
    block_size, num_kv_heads, head_dim = _check_cache(k_cache, v_cache)
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
    _check_device(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out

    group = num_heads // num_kv_heads
    seq_lens = seq_lens.contiguous()
    query_start_loc = query_start_loc.contiguous()
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    qk_scale = float(scale) * LOG2E
    block_d = max(DOT_MIN, triton.next_power_of_2(head_dim))
    common = (block_size, head_dim, block_tables.stride(0), *q.stride(), *out.stride(),
              *k_cache.stride(), *v_cache.stride())
    ieee = q.dtype == torch.float32
    # 8 warps where 4 spill registers (checked on sm_90 cubins: head dim 128, or float32 dots)
    warps = 8 if block_d >= 128 or ieee else 4

    max_context = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
    splits = num_splits or _num_splits(q.device, num_seqs * num_kv_heads, max_context, block_n)
    if splits > 1:
        part_acc = torch.empty((num_seqs, num_heads, splits, block_d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((num_seqs, num_heads, splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # not touched when there is one split
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        q, k_cache, v_cache, out, part_acc, part_ml, block_tables, seq_lens, query_start_loc, qk_scale, *common,
        GROUP=group, BLOCK_M=max(DOT_MIN, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        NUM_SPLITS=splits, IEEE=ieee, num_warps=warps,
    )
    if splits > 1:
        _decode_merge_kernel[(num_seqs, num_heads)](
            out, part_acc, part_ml, query_start_loc, head_dim, *out.stride(), BLOCK_D=block_d, NUM_SPLITS=splits,
        )

    if num_tokens > num_seqs:  # some sequence has more than one query token
        bound = max_query_len if max_query_len is not None else num_tokens - num_seqs + 1
        rows = max(block_m, triton.next_power_of_2(group))
        tile_tokens = rows // group
        _prefill_kernel[(num_seqs, num_kv_heads, math.ceil(bound / tile_tokens))](
            q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, qk_scale, *common,
            GROUP=group, TILE_TOKENS=tile_tokens, BLOCK_M=rows, BLOCK_N=block_n, BLOCK_D=block_d, IEEE=ieee,
            num_warps=warps,
        )
    return out
