"""Batch-invariant paged attention in plain torch: the CPU kernel of the deterministic mode.

A query row's result depends only on its own query, its sequence's keys and values and its
position, never on the rows it shares a step with, nor on whether it is a prefill row (of a whole
prompt or of a chunk) or a decode row: every row is computed in one fixed shape and reduces over
its context in one fixed order.

- A row is attended in its sequence's query block: the `QUERY_BLOCK` positions (`[8 b, 8 b + 8)`)
  that hold its position, at the place its position fixes (`position % QUERY_BLOCK`); the places
  of the block whose rows the step does not hold get zero queries. The rows of one block share
  their keys, so a prompt's keys are gathered once per block rather than once per row, and a
  decode row is a block with one place taken.
- Keys are visited in splits of `KV_SPLIT` absolute positions (`[0, 64)`, `[64, 128)`, ...), in
  that order, whatever the query: a split size fixed in tokens, never a number of splits chosen
  from the batch (what makes split-K attention batch-dependent).
- The blocks of a step are attended `BLOCKS_PER_CALL` at a time (the last call padded with empty
  blocks), so every product has one shape (`[QUERY_BLOCK * group, head_dim] @ [head_dim,
  KV_SPLIT]` scores and `[QUERY_BLOCK * group, KV_SPLIT] @ [KV_SPLIT, head_dim]` for the values,
  `BLOCKS_PER_CALL * kv_heads` of them a call), and the library's algorithm and its summation order
  are fixed; the row sum of the split's probabilities is a pairwise tree of halves written out
  (`tree_sum`).
- Splits past a row's own position are fully masked and leave its running max, sum and output
  bit for bit unchanged (a scale of exp(0) = 1, adds of exact zeros), so a row attends the same
  whether its companions have longer contexts or not. Key positions a row does not see contribute
  exact zeros; those past the last position the block's rows reach read the last slot of the cache
  instead of theirs (slot -1: a block past the pool's that nothing writes, all zeros), so stale or
  future keys and values never reach a row's sums.
- Statistics and output accumulate in float32 (bf16/fp16 caches are widened), softmax online with
  the running max; an attention sink starts the running sum (its logit is the first "key").

Semantics match `reference_attention` (sliding window `p - window < k <= p`, softcap before the
mask, sinks in the denominator), so the model is the same model; the numbers are the
deterministic mode's own (not bitwise the reference's).
"""

from __future__ import annotations

import torch

from .reference_attention import write_kv

__all__ = ["BLOCKS_PER_CALL", "KV_SPLIT", "QUERY_BLOCK", "BlockCall", "BlockLayout", "attend", "plan_step", "rows_of",
           "tree_sum", "write_kv"]

KV_SPLIT = 64
"""Key positions per split: the fixed reduction order of every row (a power of two)."""
QUERY_BLOCK = 8
"""Query positions per block: a row's place in its products is its position modulo this."""
BLOCKS_PER_CALL = 16
"""Query blocks per product call (a step's last call is padded with empty blocks)."""


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


class BlockCall:
    """`BLOCKS_PER_CALL` query blocks attended together, shared by every layer.

    - `rows: int64 [blocks * QUERY_BLOCK]`: the packed row at each place of each block, or the
      step's row count (a zero query) where the step holds no row.
    - `positions: int64 [blocks, QUERY_BLOCK]`: the position of each place.
    - `slots: int64 [splits, blocks, split]`: the cache slot of each key position of each split,
      through the block's sequence's block table; -1 (the cache's last slot, never written) past
      the last position the block's rows reach.
    - `key_pos: int64 [splits, split]`: the absolute position of each key of each split.
    `visible(window)` gives the `[splits, blocks, QUERY_BLOCK, split]` mask of a layer with that
    sliding window (None: full causal), made once per step.
    """

    __slots__ = ("rows", "positions", "slots", "key_pos", "_visible")

    def __init__(self, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, key_pos: torch.Tensor) -> None:
        self.rows = rows
        self.positions = positions
        self.slots = slots
        self.key_pos = key_pos
        self._visible: dict[int | None, torch.Tensor] = {}

    def visible(self, window: int | None) -> torch.Tensor:
        mask = self._visible.get(window)
        if mask is None:
            k = self.key_pos[:, None, None, :]
            p = self.positions[None, :, :, None]
            mask = k <= p
            if window is not None:
                mask &= k > p - window
            self._visible[window] = mask
        return mask


class BlockLayout:
    """A step's rows as query blocks (`calls`: the `BlockCall`s, in order; `num_rows`: the step's
    rows; `split`: key positions per split)."""

    __slots__ = ("num_rows", "split", "calls")

    def __init__(self, num_rows: int, split: int, calls: list[BlockCall]) -> None:
        self.num_rows = num_rows
        self.split = split
        self.calls = calls


def rows_of(seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed rows (sequence `s` owns rows `query_start_loc[s]:query_start_loc[s+1]`, the last
    positions of its context `seq_lens[s]`): each row's sequence and position, int64 `[rows]`."""
    starts = query_start_loc.long()
    q_lens = starts[1:] - starts[:-1]
    seq_of_row = torch.repeat_interleave(torch.arange(seq_lens.shape[0], device=starts.device), q_lens)
    rows = torch.arange(seq_of_row.shape[0], device=starts.device)
    return seq_of_row, (seq_lens.long() - q_lens)[seq_of_row] + rows - starts[:-1][seq_of_row]


def plan_step(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_size: int,
    split: int = KV_SPLIT,
) -> BlockLayout:
    """The `BlockLayout` of packed rows: sequence `s` owns rows `query_start_loc[s]:query_start_loc[s+1]`
    at the last positions of its context `seq_lens[s]`, reading blocks `block_tables[s]`. Keys are
    walked in splits of `split` positions (a power of two; `KV_SPLIT` in the mode). Blocks go to
    calls in order of their block number (those of one call then need about the same splits)."""
    if split & (split - 1) or split < 1:
        raise ValueError(f"plan_step: split={split} (a power of two)")
    dev = block_tables.device
    seq_of_row, positions = rows_of(seq_lens, query_start_loc)
    num_rows = int(seq_of_row.shape[0])
    blocks: dict[tuple[int, int], list[int]] = {}  # (sequence, block number) -> the row at each place
    for r, (s, p) in enumerate(zip(seq_of_row.tolist(), positions.tolist())):
        blocks.setdefault((s, p // QUERY_BLOCK), [num_rows] * QUERY_BLOCK)[p % QUERY_BLOCK] = r
    order = sorted(blocks, key=lambda key: key[1])
    tables = block_tables.long()
    places = torch.arange(QUERY_BLOCK, device=dev)
    calls = []
    for first in range(0, len(order), BLOCKS_PER_CALL):
        keys = order[first:first + BLOCKS_PER_CALL]
        empty = BLOCKS_PER_CALL - len(keys)
        rows = [r for key in keys for r in blocks[key]] + [num_rows] * (QUERY_BLOCK * empty)
        # the last position each block's rows reach (-1 for an empty block: every key reads the zeros)
        last = [b * QUERY_BLOCK + max(i for i, r in enumerate(blocks[(s, b)]) if r < num_rows) for s, b in keys]
        last += [-1] * empty
        seqs = [s for s, _ in keys] + [0] * empty
        bases = [b * QUERY_BLOCK for _, b in keys] + [0] * empty
        splits = max(last) // split + 1
        key_pos = torch.arange(splits * split, device=dev).view(splits, split)
        column = (key_pos // block_size).clamp(max=tables.shape[1] - 1)
        ids = tables[torch.tensor(seqs, device=dev)][:, column.reshape(-1)].view(BLOCKS_PER_CALL, splits, split)
        slots = (ids * block_size + (key_pos % block_size)[None]).transpose(0, 1)
        last_t = torch.tensor(last, device=dev)
        slots = slots.masked_fill(key_pos[:, None, :] > last_t[None, :, None], -1).contiguous()
        calls.append(BlockCall(torch.tensor(rows, device=dev), torch.tensor(bases, device=dev)[:, None] + places,
                               slots, key_pos))
    return BlockLayout(num_rows, split, calls)


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: BlockLayout, scale: float, *,
    window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's causal attention of the rows `q: [rows, num_heads, head_dim]` over the paged
    caches, as `layout` says; returns `[rows, num_heads, head_dim]` in `q`'s dtype. Query head `h`
    reads KV head `h // (num_heads // num_kv_heads)`."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    width = QUERY_BLOCK * group  # the rows of one block's products: its places, each with its group of heads
    qf = torch.cat([q.float().reshape(rows, num_kv_heads, group, head_dim),
                    torch.zeros(1, num_kv_heads, group, head_dim, device=q.device)])
    heads_k = k_cache.view(-1, num_kv_heads, head_dim).transpose(0, 1)  # [kv_heads, slots, dim]
    heads_v = v_cache.view(-1, num_kv_heads, head_dim).transpose(0, 1)
    out = torch.empty(rows + 1, num_kv_heads, group, head_dim, device=q.device)
    shape = (num_kv_heads, BLOCKS_PER_CALL, width)
    for call in layout.calls:
        # [kv_heads, blocks, places * group, dim]: a block's rows place by place, each with its group
        qb = qf[call.rows].view(BLOCKS_PER_CALL, QUERY_BLOCK, num_kv_heads, group, head_dim).permute(2, 0, 1, 3, 4)
        qb = qb.reshape(num_kv_heads, BLOCKS_PER_CALL, width, head_dim)
        visible = call.visible(window)
        if sinks is not None:  # the sink is the first logit: it starts the max and the sum, no value
            m = sinks.float().view(num_kv_heads, 1, 1, group).expand(num_kv_heads, BLOCKS_PER_CALL, QUERY_BLOCK, group)
            m = m.reshape(shape).clone()
            l_sum = torch.ones(shape, device=q.device)
        else:
            m = torch.full(shape, -torch.inf, device=q.device)
            l_sum = torch.zeros(shape, device=q.device)
        acc = torch.zeros(*shape, head_dim, device=q.device)
        for i in range(call.slots.shape[0]):
            slots = call.slots[i]
            k = heads_k[:, slots].float()  # [kv_heads, blocks, split, dim]
            v = heads_v[:, slots].float()
            s = torch.matmul(qb, k.transpose(-1, -2)) * scale  # [kv_heads, blocks, width, split]
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            s = s.view(num_kv_heads, BLOCKS_PER_CALL, QUERY_BLOCK, group, -1)
            s = s.masked_fill(~visible[i][None, :, :, None, :], -torch.inf).view(*shape, -1)
            m_new = torch.maximum(m, s.amax(dim=-1))  # a max is exact in any order
            base = torch.where(m_new == -torch.inf, 0.0, m_new)  # rows that have seen nothing yet
            alpha = torch.exp(m - base)
            p = torch.exp(s - base[..., None])
            l_sum = l_sum * alpha + tree_sum(p)
            acc = acc * alpha[..., None] + torch.matmul(p, v)
            m = m_new
        res = (acc / l_sum[..., None]).view(num_kv_heads, BLOCKS_PER_CALL, QUERY_BLOCK, group, head_dim)
        out[call.rows] = res.permute(1, 2, 0, 3, 4).reshape(-1, num_kv_heads, group, head_dim)
    return out[:rows].reshape(rows, num_heads, head_dim).to(q.dtype)
