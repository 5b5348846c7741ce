"""What the Triton attention kernels share: reductions safe under the interpreter, the online-softmax
loop over paged keys (`attend`), and the checks of the tensors they are given.

The kernels use only Triton builtins and the reduction helpers below, not triton.language's own
@jit helpers (tl.max, tl.sum, tl.zeros, tl.cdiv): those are decorated when triton is first imported,
so under the interpreter they fail if triton was imported before TRITON_INTERPRET was set. The
interpreter reduces with numpy only for its own combine functions, so those are taken when they were
decorated the same way as this module's kernels.

Strides come in as tuples, in the tensor's dimension order: a query or output tensor's
`(token, head, dim)`, a cache's `(block, slot, kv_head, dim)`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

MAX_HEAD_DIM = 256
DOT_MIN = 16  # tl.dot on NVIDIA needs every dimension >= 16


@triton.jit
def _own_max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _own_add(a, b):
    return a + b


_std_max = getattr(tl.standard, "_elementwise_max", None)
_std_add = getattr(tl.standard, "_sum_combine", None)
_same_mode = type(_std_max) is type(_own_max) and type(_std_add) is type(_own_add)
max_fn = _std_max if _same_mode else _own_max
"""The combine function of a max reduction (`tl.reduce(x, axis, max_fn)`)."""
add_fn = _std_add if _same_mode else _own_add
"""The combine function of a sum reduction (`tl.reduce(x, axis, add_fn)`)."""


@triton.jit
def attend(
    q, row_pos, lo, hi, k_cache_ptr, v_cache_ptr, bt_ptr, kv_head, block_size, qk_scale, cap_in, cap_out, window,
    kc_strides, vc_strides, offs_d, d_mask, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    """Online softmax of the rows of `q` against key positions [lo, hi) of one sequence (block table
    at `bt_ptr`), each row seeing positions <= its `row_pos` (and, with `HAS_WINDOW`, > `row_pos -
    window`); scores are in log2 units: `dot * qk_scale`, or with `HAS_SOFTCAP` `tanh(dot * cap_in)
    * cap_out` (cap_in = scale / softcap, cap_out = softcap * log2(e)). Returns the unnormalised
    output `acc` and the running max `m_i` and sum `l_i` of each row."""
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        blk = tl.load(bt_ptr + pos // block_size, mask=valid, other=0).to(tl.int64)
        off = pos % block_size
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + blk[:, None] * kc_strides[0] + off[:, None] * kc_strides[1] + kv_head * kc_strides[2]
                    + offs_d[None, :] * kc_strides[3], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if HAS_SOFTCAP:  # tanh(x) = 1 - 2 / (e^2x + 1): exact at both ends (e^2x = inf or 0)
            s = (1.0 - 2.0 / (tl.exp2(s * (cap_in * 2.0 * 1.4426950408889634)) + 1.0)) * cap_out
        else:
            s = s * qk_scale
        seen = valid[None, :] & (pos[None, :] <= row_pos[:, None])
        if HAS_WINDOW:
            seen = seen & (pos[None, :] > row_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, max_fn))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.reduce(p, 1, add_fn)
        v = tl.load(v_cache_ptr + blk[:, None] * vc_strides[0] + off[:, None] * vc_strides[1] + kv_head * vc_strides[2]
                    + offs_d[None, :] * vc_strides[3], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def add_sink(acc, m_i, l_i, sink):
    """Fold a sink logit per row (log2 units) into an online softmax's state: it joins the
    denominator and adds nothing to the output. Returns `(acc, m_i, l_i)` rescaled."""
    m_new = tl.maximum(m_i, sink)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None], m_new, l_i * alpha + tl.exp2(sink - m_new)


class PagedArgs(NamedTuple):
    """The arguments the decode and prefill kernels share, in their order after the data pointers."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    sinks: torch.Tensor
    qk_scale: float
    cap_in: float
    cap_out: float
    window: int
    block_size: int
    head_dim: int
    block_table_stride: int
    q_strides: tuple
    out_strides: tuple
    kc_strides: tuple
    vc_strides: tuple


def interpreted() -> bool:
    """Whether the kernels were decorated for Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(attend, triton.runtime.JITFunction)


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device, and a device the kernels can run on (CUDA, or any under the
    interpreter)."""
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"triton attention: all tensors must be on one device, got {t.device} and {device}")
    if device.type != "cuda" and not interpreted():
        raise RuntimeError(
            f"triton attention needs CUDA tensors (got {device}); on CPU set TRITON_INTERPRET=1 "
            "before importing metroline.executors.torch.triton_attention, or use the torch reference"
        )


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    """`(block_size, num_kv_heads, head_dim)` of a K/V cache pair of one layer, checked."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be <= {MAX_HEAD_DIM}, got {head_dim}")
    return block_size, num_kv_heads, head_dim
