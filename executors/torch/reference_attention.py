"""Paged attention in plain torch: the reference the Triton kernels are tested against, and the
implementation used on CPU.

KV layout (metroline's blocks): `k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]`;
slot `b * block_size + o` is offset `o` of block `b`.

What a step's sequences read is the same in every layer, so `plan_step` works it out once per step
(a `StepLayout`) and `attend` runs one layer with it: the decodes (one query token each) in one
batched attention over their contexts gathered block by block and padded to the longest, and the
prefill chunks in batches of equal (query length, context length). Both go through torch's
`scaled_dot_product_attention` on strided views of the gathered blocks (no copy to a head-major
layout, no float32 copy of float32 data).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store the step's keys and values `k, v: [num_tokens, num_kv_heads, head_dim]` (any strides)
    at the cache slots `slot_mapping: int64 [num_tokens]`."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


class StepLayout:
    """Where each query row of one step reads its context, shared by every layer.

    - `num_tokens`: query rows in the step.
    - `parts`: one entry per batched attention, `(rows, blocks, count, q_len, width, mask)`: `rows`
      the query rows it computes (a slice, or an int64 tensor), `blocks` int64 `[count * nb]` the
      cache blocks of its `count` sequences (`nb` each), `q_len` query tokens per sequence, `width`
      context slots read per sequence (the first `width` of the gathered `nb * block_size`), `mask`
      an additive float mask broadcastable to `[count, heads, q_len, width]` (0 where a slot is
      visible, -inf where not), or None for plain causal attention (`q_len == width`).
    """

    __slots__ = ("num_tokens", "parts")

    def __init__(self, num_tokens: int, parts: list[tuple]) -> None:
        self.num_tokens = num_tokens
        self.parts = parts


def plan_step(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_size: int
) -> StepLayout:
    """The `StepLayout` of a step: `block_tables: int [num_seqs, max_blocks]` (padded with any valid
    block id), `seq_lens: int [num_seqs]` (context after the step), `query_start_loc: int
    [num_seqs + 1]` (sequence `s` owns query rows `query_start_loc[s]:query_start_loc[s + 1]`)."""
    dev = block_tables.device
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    tables = block_tables.long()
    decodes: list[int] = []
    groups: dict[tuple[int, int], list[int]] = {}
    for s, ctx_len in enumerate(lens):
        q_len = starts[s + 1] - starts[s]
        if q_len == 1:
            decodes.append(s)
        elif q_len > 1:
            groups.setdefault((q_len, ctx_len), []).append(s)
    parts = []
    if decodes:
        ctx = [lens[s] for s in decodes]
        nb = -(-max(ctx) // block_size)
        width = nb * block_size
        visible = torch.arange(width, device=dev)[None, :] < torch.tensor(ctx, device=dev)[:, None]
        mask = torch.zeros(visible.shape, device=dev).masked_fill_(~visible, float("-inf"))
        parts.append((_rows(decodes, starts, dev), _blocks(tables, decodes, nb, dev), len(decodes), 1, width,
                      mask[:, None, None, :]))
    for (q_len, ctx_len), seqs in groups.items():
        mask = None
        if ctx_len != q_len:  # a chunk after cached context: query i sits at ctx_len - q_len + i
            pos = torch.arange(ctx_len - q_len, ctx_len, device=dev)
            future = torch.arange(ctx_len, device=dev)[None, :] > pos[:, None]
            mask = torch.zeros(future.shape, device=dev).masked_fill_(future, float("-inf"))
        nb = -(-ctx_len // block_size)
        parts.append((_rows(seqs, starts, dev), _blocks(tables, seqs, nb, dev), len(seqs), q_len, ctx_len, mask))
    return StepLayout(starts[-1], parts)


def _rows(seqs: list[int], starts: list[int], dev: torch.device) -> slice | torch.Tensor:
    """The query rows of `seqs`: a slice when they are one run, else an index tensor."""
    if all(starts[a + 1] == starts[b] for a, b in zip(seqs, seqs[1:])):
        return slice(starts[seqs[0]], starts[seqs[-1] + 1])
    return torch.tensor([r for s in seqs for r in range(starts[s], starts[s + 1])], dtype=torch.int64, device=dev)


def _blocks(tables: torch.Tensor, seqs: list[int], nb: int, dev: torch.device) -> torch.Tensor:
    """The first `nb` block ids of each of `seqs`, flattened."""
    if seqs == list(range(seqs[0], seqs[0] + len(seqs))):
        return tables[seqs[0]:seqs[-1] + 1, :nb].reshape(-1)
    return tables[torch.tensor(seqs, device=dev), :nb].reshape(-1)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: StepLayout, scale: float) -> torch.Tensor:
    """One layer's causal attention of the packed queries `q: [num_tokens, num_heads, head_dim]` (any
    strides) over the paged caches, as `layout` says. Returns `[num_tokens, num_heads, head_dim]`
    in `q`'s dtype. Query head `h` reads KV head `h // (num_heads // num_kv_heads)`."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    groups = num_heads // num_kv_heads
    out = None
    for rows, blocks, count, q_len, width, mask in layout.parts:
        k = k_cache.index_select(0, blocks).view(count, -1, num_kv_heads, head_dim)[:, :width].transpose(1, 2)
        v = v_cache.index_select(0, blocks).view(count, -1, num_kv_heads, head_dim)[:, :width].transpose(1, 2)
        qs = q[rows]
        if q_len == 1:  # the query heads of one KV head are that head's query rows: no repeat of K/V
            o = F.scaled_dot_product_attention(
                qs.reshape(count, num_kv_heads, groups, head_dim), k, v, attn_mask=mask, scale=scale
            ).view(count, num_heads, head_dim)
        else:
            o = F.scaled_dot_product_attention(
                qs.view(count, q_len, num_heads, head_dim).transpose(1, 2), k, v, attn_mask=mask,
                is_causal=mask is None, scale=scale, enable_gqa=True,
            ).transpose(1, 2).reshape(count * q_len, num_heads, head_dim)
        if isinstance(rows, slice) and rows.stop - rows.start == num_tokens:
            return o
        if out is None:
            out = q.new_empty(num_tokens, num_heads, head_dim)
        out[rows] = o
    if out is None:  # no sequence had a query token
        out = q.new_empty(num_tokens, num_heads, head_dim)
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed queries over each sequence's paged context (`plan_step` then
    `attend`).

    `q: [num_tokens, num_heads, head_dim]`, packed by sequence: sequence `s` owns rows
    `query_start_loc[s]:query_start_loc[s + 1]`. `seq_lens[s]` is its context length after this step,
    so its query row `i` sits at position `seq_lens[s] - q_len + i` and attends to positions up to
    its own. `block_tables: int32 [num_seqs, max_blocks]` (padded with any valid block id). Query head `h` reads KV head
    `h // (num_heads // num_kv_heads)`. Returns `[num_tokens, num_heads, head_dim]` in `q`'s dtype.
    """
    return attend(q, k_cache, v_cache, plan_step(block_tables, seq_lens, query_start_loc, k_cache.shape[1]), scale)
