"""Paged attention in plain torch: the reference the Triton kernels are tested against, and the
implementation used on CPU.

KV layout (metroline's blocks): `k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]`;
slot `b * block_size + o` is offset `o` of block `b`.
"""

from __future__ import annotations

import torch


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store the step's keys and values `k, v: [num_tokens, num_kv_heads, head_dim]` at the cache
    slots `slot_mapping: int64 [num_tokens]`."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = v.to(v_cache.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed queries over each sequence's paged context.

    `q: [num_tokens, num_heads, head_dim]`, packed by sequence: sequence `s` owns rows
    `query_start_loc[s]:query_start_loc[s + 1]`. `seq_lens[s]` is its context length after this step,
    so its query row `i` sits at position `seq_lens[s] - q_len + i` and attends to positions up to
    its own. `block_tables: int32 [num_seqs, max_blocks]` (padded with any valid block id). Query head `h` reads KV head
    `h // (num_heads // num_kv_heads)`. Returns `[num_tokens, num_heads, head_dim]` in `q`'s dtype.
    """
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    groups = num_heads // num_kv_heads
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    decodes = []
    for s, ctx_len in enumerate(lens):
        q0, q1 = starts[s], starts[s + 1]
        q_len = q1 - q0
        if q_len == 1:
            decodes.append(s)
            continue
        if q_len == 0:
            continue
        blocks = block_tables[s, : (ctx_len + block_size - 1) // block_size].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx_len]
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx_len]
        qs = q[q0:q1].float().view(q_len, num_kv_heads, groups, head_dim)
        scores = torch.einsum("qkgd,ckd->kgqc", qs, k.float()) * scale
        pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
        future = torch.arange(ctx_len, device=q.device)[None, :] > pos[:, None]
        scores.masked_fill_(future, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        o = torch.einsum("kgqc,ckd->qkgd", probs, v.float())
        out[q0:q1] = o.reshape(q_len, num_heads, head_dim).to(q.dtype)
    if decodes:
        _decode_batch(q, k_cache, v_cache, block_tables, decodes, [starts[s] for s in decodes],
                      [lens[s] for s in decodes], scale, out)
    return out


def _decode_batch(q, k_cache, v_cache, block_tables, seqs, rows, lens, scale, out) -> None:
    """One query token per sequence, all sequences at once over their contexts padded to the
    longest (padding and slots past a context are masked out)."""
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    num_heads = q.shape[1]
    dev = q.device
    width = (max(lens) + block_size - 1) // block_size
    tables = block_tables[torch.tensor(seqs, device=dev), :width].long()
    n = len(seqs)
    k = k_cache[tables].view(n, width * block_size, num_kv_heads, head_dim).float()
    v = v_cache[tables].view(n, width * block_size, num_kv_heads, head_dim).float()
    row_idx = torch.tensor(rows, device=dev)
    qd = q[row_idx].float().view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("nkgd,nckd->nkgc", qd, k) * scale
    ctx = torch.tensor(lens, device=dev)
    past_end = torch.arange(width * block_size, device=dev)[None, :] >= ctx[:, None]
    scores.masked_fill_(past_end[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o = torch.einsum("nkgc,nckd->nkgd", probs, v)
    out[row_idx] = o.reshape(n, num_heads, head_dim).to(q.dtype)
