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

Three variants of attention that transformers asks for per layer are honoured, with the semantics
of its eager implementation: a sliding window (a query at position `p` sees keys `p - window < k <=
p`), logit softcapping (`softcap * tanh(scores / softcap)` before the mask) and attention sinks (one
learned logit per query head that joins the softmax's denominator and contributes no value). The
masks of each window are made once per step and shared by the layers that use it.
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
    - `parts`: one entry per batched attention, `(rows, blocks, count, q_len, width, q_pos)`: `rows`
      the query rows it computes (a slice, or an int64 tensor), `blocks` int64 `[count * nb]` the
      cache blocks of its `count` sequences (`nb` each; a slice of block ids when that is one
      sequence's consecutive blocks, read as a view), `q_len` query tokens per sequence, `width`
      context slots read per sequence (the first `width` of the gathered `nb * block_size`: the
      longest context of a decode part, the context of a prefill group), `q_pos`
      the position of each query row, int64 `[count or 1, q_len]` (a prefill group's sequences
      share theirs).
    - `uniform_decodes`: the decodes (always the first part) all have contexts of `width` slots.
    `mask(i, window)` is part `i`'s additive float mask (0 where a slot is visible, -inf where not),
    broadcastable to `[count, heads, q_len, width]`, or None for plain causal attention (a whole
    prompt; decodes of equal context, which see every slot read).
    """

    __slots__ = ("num_tokens", "parts", "_masks", "_uniform_decodes")

    def __init__(self, num_tokens: int, parts: list[tuple], uniform_decodes: bool = False) -> None:
        self.num_tokens = num_tokens
        self.parts = parts
        self._masks: dict[tuple[int, int | None], torch.Tensor | None] = {}
        self._uniform_decodes = uniform_decodes

    def mask(self, i: int, window: int | None) -> torch.Tensor | None:
        """Part `i`'s mask for a layer with sliding `window` (None: full causal), made once a step."""
        key = (i, window)
        if key not in self._masks:
            _, _, _, q_len, width, q_pos = self.parts[i]
            if window is None and q_len == width and q_pos.shape[0] == 1:
                self._masks[key] = None  # a whole prompt: is_causal
            elif window is None and i == 0 and q_len == 1 and self._uniform_decodes:
                self._masks[key] = None  # decodes whose contexts are all `width` long see every slot read
            else:
                k = torch.arange(width, device=q_pos.device)
                visible = k <= q_pos[:, :, None]
                if window is not None:
                    visible &= k > q_pos[:, :, None] - window
                mask = torch.zeros(visible.shape, device=q_pos.device).masked_fill_(~visible, float("-inf"))
                self._masks[key] = mask[:, None]
        return self._masks[key]


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
        # the decodes read the first max(ctx) slots: a lone decode (or equal contexts) needs no mask
        q_pos = torch.tensor(ctx, device=dev)[:, None] - 1
        parts.append((_rows(decodes, starts, dev), _blocks(tables, decodes, nb, dev), len(decodes), 1,
                      max(ctx), q_pos))
    for (q_len, ctx_len), seqs in groups.items():
        nb = -(-ctx_len // block_size)
        q_pos = torch.arange(ctx_len - q_len, ctx_len, device=dev)[None, :]
        parts.append((_rows(seqs, starts, dev), _blocks(tables, seqs, nb, dev), len(seqs), q_len, ctx_len, q_pos))
    return StepLayout(starts[-1], parts, uniform_decodes=len({lens[s] for s in decodes}) == 1)


def _rows(seqs: list[int], starts: list[int], dev: torch.device) -> slice | torch.Tensor:
    """The query rows of `seqs`: a slice when they are one run, else an index tensor."""
    if all(starts[a + 1] == starts[b] for a, b in zip(seqs, seqs[1:])):
        return slice(starts[seqs[0]], starts[seqs[-1] + 1])
    return torch.tensor([r for s in seqs for r in range(starts[s], starts[s + 1])], dtype=torch.int64, device=dev)


def _blocks(tables: torch.Tensor, seqs: list[int], nb: int, dev: torch.device) -> torch.Tensor | slice:
    """The first `nb` block ids of each of `seqs`, flattened; a slice of block ids when that is one
    sequence's run of consecutive blocks on the CPU (read as a view of the cache, no gather)."""
    if len(seqs) == 1 and dev.type == "cpu":
        ids = tables[seqs[0], :nb].tolist()
        if ids == list(range(ids[0], ids[0] + nb)):
            return slice(ids[0], ids[0] + nb)
        return torch.tensor(ids, dtype=torch.int64)
    if seqs == list(range(seqs[0], seqs[0] + len(seqs))):
        return tables[seqs[0]:seqs[-1] + 1, :nb].reshape(-1)
    return tables[torch.tensor(seqs, device=dev), :nb].reshape(-1)


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: StepLayout, scale: float, *,
    window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's causal attention of the packed queries `q: [num_tokens, num_heads, head_dim]` (any
    strides) over the paged caches, as `layout` says. Returns `[num_tokens, num_heads, head_dim]`
    in `q`'s dtype. Query head `h` reads KV head `h // (num_heads // num_kv_heads)`.

    `window`: this layer's sliding window (keys older than `window` positions are masked);
    `softcap`: logit softcapping; `sinks: [num_heads]`: attention-sink logits."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    groups = num_heads // num_kv_heads
    explicit = softcap is not None or sinks is not None
    out = None
    for i, (rows, blocks, count, q_len, width, _) in enumerate(layout.parts):
        if isinstance(blocks, slice):  # one sequence on consecutive blocks: a view
            k, v = k_cache[blocks], v_cache[blocks]
        else:
            k, v = k_cache.index_select(0, blocks), v_cache.index_select(0, blocks)
        k = k.view(count, -1, num_kv_heads, head_dim)[:, :width].transpose(1, 2)
        v = v.view(count, -1, num_kv_heads, head_dim)[:, :width].transpose(1, 2)
        mask = layout.mask(i, window)
        qs = q[rows]
        if explicit:
            o = _attend_explicit(qs.view(count, q_len, num_heads, head_dim).transpose(1, 2), k, v, mask, scale,
                                 softcap, sinks).transpose(1, 2).reshape(count * q_len, num_heads, head_dim)
        elif q_len == 1:  # the query heads of one KV head are that head's query rows: no repeat of K/V
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


def _attend_explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
    softcap: float | None, sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention written out, for what `scaled_dot_product_attention` cannot express (softcap,
    sinks), in the order of transformers' eager attention: scale, softcap, mask, softmax (with the
    sink as an extra logit that takes probability and gives no value). `q: [count, heads, q_len,
    dim]`, `k, v: [count, kv_heads, width, dim]`; returns `[count, heads, q_len, dim]`."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        q_len, width = scores.shape[-2:]
        mask = torch.zeros(q_len, width, device=q.device).masked_fill_(
            torch.ones(q_len, width, dtype=torch.bool, device=q.device).triu(width - q_len + 1), float("-inf"))
    scores = scores + mask
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
        scores = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(scores - scores.amax(dim=-1, keepdim=True), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of packed queries over each sequence's paged context (`plan_step` then
    `attend`).

    `q: [num_tokens, num_heads, head_dim]`, packed by sequence: sequence `s` owns rows
    `query_start_loc[s]:query_start_loc[s + 1]`. `seq_lens[s]` is its context length after this step,
    so its query row `i` sits at position `seq_lens[s] - q_len + i` and attends to positions up to
    its own (and, with a sliding `window`, after its own minus `window`). `block_tables: int32
    [num_seqs, max_blocks]` (padded with any valid block id). Query head `h` reads KV head
    `h // (num_heads // num_kv_heads)`. `softcap` caps the logits, `sinks: [num_heads]` adds one
    sink logit per head. Returns `[num_tokens, num_heads, head_dim]` in `q`'s dtype.
    """
    layout = plan_step(block_tables, seq_lens, query_start_loc, k_cache.shape[1])
    return attend(q, k_cache, v_cache, layout, scale, window=window, softcap=softcap, sinks=sinks)
