"""The Triton decode kernel: sequences with one query token, the key range split across programs.

One program per (sequence, KV head, key split): the group of query heads sharing that KV head are
the rows of one tile, with an online softmax over key tiles (`triton_common.attend`); with more than
one split, each writes a partial result and a second small kernel merges the splits. Every program
whose sequence has more than one query token returns at once (the prefill kernel serves it), so the
dispatch needs no copy to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import DOT_MIN, PagedArgs, add_fn, add_sink, attend, max_fn

MAX_SPLITS = 16


@triton.jit
def decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, sinks_ptr,
    qk_scale, cap_in, cap_out, window, block_size, head_dim, s_bt, q_strides, out_strides, kc_strides, vc_strides,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr, IEEE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    if tl.load(qsl_ptr + seq + 1) - q_start != 1:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first = 0
    if HAS_WINDOW:  # keys older than the window are never read
        first = tl.maximum(seq_len - window, 0)
    tiles_per_split = ((seq_len - first + BLOCK_N - 1) // BLOCK_N + NUM_SPLITS - 1) // NUM_SPLITS
    lo = first + split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, seq_len)

    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    row_mask = rows < GROUP
    head = kv_head * GROUP + rows
    q = tl.load(q_ptr + q_start.to(tl.int64) * q_strides[0] + head[:, None] * q_strides[1]
                + offs_d[None, :] * q_strides[2], mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    row_pos = tl.full([BLOCK_M], 0, tl.int32) + (seq_len - 1)
    acc, m_i, l_i = attend(
        q, row_pos, lo, hi, k_cache_ptr, v_cache_ptr, bt_ptr + seq.to(tl.int64) * s_bt, kv_head, block_size,
        qk_scale, cap_in, cap_out, window, kc_strides, vc_strides, offs_d, d_mask, BLOCK_M, BLOCK_N, BLOCK_D, IEEE,
        HAS_SOFTCAP, HAS_WINDOW,
    )
    if NUM_SPLITS == 1:
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + head, mask=row_mask, other=0.0) * 1.4426950408889634
            acc, m_i, l_i = add_sink(acc, m_i, l_i, sink)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = (out_ptr + q_start.to(tl.int64) * out_strides[0] + head[:, None] * out_strides[1]
                  + offs_d[None, :] * out_strides[2])
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])
    else:
        # partials: acc [seq, head, split, BLOCK_D], (m, l) [seq, head, split, 2], heads = H
        idx = (seq.to(tl.int64) * (tl.num_programs(1) * GROUP) + head) * NUM_SPLITS + split
        tl.store(part_acc_ptr + idx[:, None] * BLOCK_D + offs_d[None, :], acc, mask=row_mask[:, None])
        tl.store(part_ml_ptr + idx * 2, m_i, mask=row_mask)
        tl.store(part_ml_ptr + idx * 2 + 1, l_i, mask=row_mask)


@triton.jit
def decode_merge_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, qsl_ptr, sinks_ptr, head_dim, out_strides,
    BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr,
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
    m_max = tl.reduce(m, 0, max_fn)
    if HAS_SINKS:  # the sink joins the denominator once, not once per split
        sink = tl.load(sinks_ptr + head) * 1.4426950408889634
        m_max = tl.maximum(m_max, sink)
    w = tl.exp2(m - m_max)
    denom = tl.reduce(l * w, 0, add_fn)
    if HAS_SINKS:
        denom += tl.exp2(sink - m_max)
    out = tl.reduce(acc * w[:, None], 0, add_fn) / denom
    tl.store(out_ptr + q_start.to(tl.int64) * out_strides[0] + head * out_strides[1] + offs_d * out_strides[2],
             out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


_SM_COUNT: dict[int, int] = {}


def choose_num_splits(device: torch.device, programs: int, max_context: int, block_n: int) -> int:
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


def launch_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, paged: PagedArgs, *,
    splits: int, block_n: int, block_d: int, ieee: bool, warps: int, softcap: bool, window: bool, sinks: bool,
) -> None:
    """Attend every one-token sequence of the batch into `out` (`paged`: the arguments
    the kernels share)."""
    num_seqs, num_heads, num_kv_heads = paged.block_tables.shape[0], q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if splits > 1:
        part_acc = torch.empty((num_seqs, num_heads, splits, block_d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((num_seqs, num_heads, splits, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # not touched when there is one split
    decode_kernel[(num_seqs, num_kv_heads, splits)](
        q, k_cache, v_cache, out, part_acc, part_ml, *paged,
        GROUP=group, BLOCK_M=max(DOT_MIN, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        NUM_SPLITS=splits, IEEE=ieee, HAS_SOFTCAP=softcap, HAS_WINDOW=window, HAS_SINKS=sinks, num_warps=warps,
    )
    if splits > 1:
        decode_merge_kernel[(num_seqs, num_heads)](
            out, part_acc, part_ml, paged.query_start_loc, paged.sinks, q.shape[2], out.stride(), BLOCK_D=block_d,
            NUM_SPLITS=splits, HAS_SINKS=sinks,
        )
