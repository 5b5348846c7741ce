"""Batch-invariant paged attention in plain torch: the CPU kernel of the deterministic mode.

A query row's result depends only on its own query, its sequence's keys and values and its
position, never on the rows it shares a step with, nor on whether it is a prefill row (of a whole
prompt or of a chunk) or a decode row: every row reduces over its context in one fixed order.

- Keys are visited in splits of `KV_SPLIT` absolute positions (`[0, 32)`, `[32, 64)`, ...), in
  that order, whatever the query: a split size fixed in tokens, never a number of splits chosen
  from the batch (what makes split-K attention batch-dependent).
- Within a split, every row of the tile computes the same shapes (`[rows, kv_heads, group,
  KV_SPLIT]` scores and a `[group, KV_SPLIT] @ [KV_SPLIT, head_dim]` product), so the library's
  algorithm and its summation order are fixed; the row sum of the split's probabilities is a
  pairwise tree of halves written out (`tree_sum`).
- Splits past a row's own position are fully masked and leave its running max, sum and output
  bit for bit unchanged (a scale of exp(0) = 1, adds of exact zeros), so a row attends the same
  whether its companions have longer contexts or not. Key positions after a row's own read the
  last slot of the cache instead of theirs (slot -1: a block past the pool's that nothing
  writes, all zeros), so stale or future keys and values never reach a row's sums.
- Keys and values are gathered head-major (`[kv_heads, rows, split, head_dim]`), so both products
  run on them as they are, without a copy.
- Statistics and output accumulate in float32 (bf16/fp16 caches are widened), softmax online with
  the running max; an attention sink starts the running sum (its logit is the first "key").

Semantics match `reference_attention` (sliding window `p - window < k <= p`, softcap before the
mask, sinks in the denominator), so the model is the same model; the numbers are the
deterministic mode's own (not bitwise the reference's).
"""

from __future__ import annotations

import torch

from .reference_attention import write_kv

__all__ = ["KV_SPLIT", "RowLayout", "attend", "plan_step", "rows_of", "tree_sum", "write_kv"]

KV_SPLIT = 32
"""Key positions per split: the fixed reduction order of every row (a power of two)."""


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension (a power of two) as a pairwise tree of halves: an order written
    out, independent of the library's reduction kernels and of the other dimensions."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two length, got {n}")
    while n > 1:
        n //= 2
        x = x[..., :n] + x[..., n:]
    return x[..., 0]


class RowLayout:
    """Where each query row of a tile reads its context, shared by every layer.

    - `positions: int64 [rows]`: each row's position (it sees keys up to it).
    - `slots: int64 [splits, rows, KV_SPLIT]`: the cache slot of each key position of each split,
      through the row's block table; -1 (the cache's last slot, never written) past the row's
      position.
    - `key_pos: int64 [splits, KV_SPLIT]`: the absolute position of each key of each split.
    `visible(window)` gives the `[splits, rows, KV_SPLIT]` mask of a layer with that sliding window
    (None: full causal), made once per tile.
    """

    __slots__ = ("positions", "slots", "key_pos", "_visible")

    def __init__(self, positions: torch.Tensor, slots: torch.Tensor, key_pos: torch.Tensor) -> None:
        self.positions = positions
        self.slots = slots
        self.key_pos = key_pos
        self._visible: dict[int | None, torch.Tensor] = {}

    def visible(self, window: int | None) -> torch.Tensor:
        mask = self._visible.get(window)
        if mask is None:
            k = self.key_pos[:, None, :]
            p = self.positions[None, :, None]
            mask = k <= p
            if window is not None:
                mask &= k > p - window
            self._visible[window] = mask
        return mask


def rows_of(seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed rows (sequence `s` owns rows `query_start_loc[s]:query_start_loc[s+1]`, the last
    positions of its context `seq_lens[s]`): each row's sequence and position, int64 `[rows]`."""
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    seq_of_row = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=starts.device), q_lens)
    rows = torch.arange(seq_of_row.shape[0], device=starts.device)
    return seq_of_row, (seq_lens.long() - q_lens)[seq_of_row] + rows - starts[:-1][seq_of_row]


def plan_step(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_size: int
) -> RowLayout:
    """The `RowLayout` of packed rows: sequence `s` owns rows `query_start_loc[s]:query_start_loc[s+1]`
    at the last positions of its context `seq_lens[s]`, reading blocks `block_tables[s]`."""
    dev = block_tables.device
    seq_of_row, positions = rows_of(seq_lens, query_start_loc)
    rows = seq_of_row.shape[0]
    splits = -(-(int(positions.max()) + 1) // KV_SPLIT) if rows else 0
    key_pos = torch.arange(splits * KV_SPLIT, device=dev).view(splits, KV_SPLIT)
    column = (key_pos // block_size).clamp(max=block_tables.shape[1] - 1)
    tables = block_tables.long()[seq_of_row]  # [rows, width]
    blocks = tables[:, column.reshape(-1)].view(rows, splits, KV_SPLIT)
    slots = (blocks * block_size + (key_pos % block_size)[None]).transpose(0, 1)
    slots = slots.masked_fill(key_pos[:, None, :] > positions[None, :, None], -1).contiguous()
    return RowLayout(positions, slots, key_pos)


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: RowLayout, scale: float, *,
    window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's causal attention of the rows `q: [rows, num_heads, head_dim]` over the paged
    caches, as `layout` says; returns `[rows, num_heads, head_dim]` in `q`'s dtype. Query head `h`
    reads KV head `h // (num_heads // num_kv_heads)`."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    qf = q.float().reshape(rows, num_kv_heads, group, head_dim).transpose(0, 1)  # [kv_heads, rows, group, dim]
    heads_k = k_cache.view(-1, num_kv_heads, head_dim).transpose(0, 1)  # [kv_heads, slots, dim]
    heads_v = v_cache.view(-1, num_kv_heads, head_dim).transpose(0, 1)
    visible = layout.visible(window)
    shape = (num_kv_heads, rows, group)
    if sinks is not None:  # the sink is the first logit: it starts the max and the sum, no value
        m = sinks.float().view(num_kv_heads, 1, group).expand(shape).clone()
        l_sum = torch.ones(shape, device=q.device)
    else:
        m = torch.full(shape, -torch.inf, device=q.device)
        l_sum = torch.zeros(shape, device=q.device)
    acc = torch.zeros(num_kv_heads, rows, group, head_dim, device=q.device)
    for i in range(layout.slots.shape[0]):
        slots = layout.slots[i]
        k = heads_k[:, slots].float()  # [kv_heads, rows, split, dim]
        v = heads_v[:, slots].float()
        s = torch.matmul(qf, k.transpose(-1, -2)) * scale  # [kv_heads, rows, group, split]
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~visible[i][None, :, None, :], -torch.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))  # a max is exact in any order
        base = torch.where(m_new == -torch.inf, 0.0, m_new)  # rows that have seen nothing yet
        alpha = torch.exp(m - base)
        p = torch.exp(s - base[..., None])
        l_sum = l_sum * alpha + tree_sum(p)
        acc = acc * alpha[..., None] + torch.matmul(p, v)
        m = m_new
    out = (acc / l_sum[..., None]).transpose(0, 1)
    return out.reshape(rows, num_heads, head_dim).to(q.dtype)
