"""Batch-invariant paged attention on CUDA: the deterministic mode's kernel (`invariant_step`).

Every query row, prefill or decode, is attended as a one-token sequence of its own (its context:
the positions up to its own) by the Triton decode kernel of `triton_decode` with one key split
(`num_splits=1`) and key tiles of `KV_SPLIT` positions. A row's program then walks its keys from
the first it may see to its own position, tile by tile in that order, with an online softmax, and
its result depends only on its query, its keys and values and its position: not on how many rows
the step has (the split count of the usual decode path is chosen from the batch, and the usual
prefill path tiles a row with other rows of its chunk), nor on its chunk or its companions. A
prompt computed whole, in chunks, after a preemption or read from the prefix cache therefore gets
the same KV bits, as on CPU with `invariant_attention`.

The cost: prefill rows lose the query tiling of the prefill kernel (each row reads its keys
alone). Verified under Triton's interpreter on CPU (`tests/test_deterministic_triton.py`); not
yet run compiled on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from .invariant_attention import rows_of
from .triton_attention import paged_attention, write_kv

__all__ = ["KV_SPLIT", "RowSequences", "attend", "plan_step", "write_kv"]

KV_SPLIT = 32
"""Key positions per tile of a row's walk (the kernel's `block_n`): its fixed reduction order."""


class RowSequences:
    """Each query row of a tile as a one-token sequence: `block_tables: int32 [rows, width]` (its
    sequence's), `seq_lens: int32 [rows]` (its position + 1), `query_start_loc: int32 [rows + 1]`."""

    __slots__ = ("block_tables", "seq_lens", "query_start_loc")

    def __init__(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> None:
        self.block_tables = block_tables
        self.seq_lens = seq_lens
        self.query_start_loc = query_start_loc


def plan_step(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor, block_size: int
) -> RowSequences:
    """The rows of packed sequences (sequence `s` owns rows `query_start_loc[s]:query_start_loc[s+1]`,
    the last positions of its context `seq_lens[s]`) as one-token sequences."""
    seq_of_row, positions = rows_of(seq_lens, query_start_loc)
    return RowSequences(block_tables[seq_of_row].contiguous(), (positions + 1).to(torch.int32),
                        torch.arange(seq_of_row.shape[0] + 1, dtype=torch.int32, device=block_tables.device))


def attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: RowSequences, scale: float, *,
    window: int | None = None, softcap: float | None = None, sinks: Any = None,
) -> torch.Tensor:
    """One layer's attention of the rows `q: [rows, num_heads, head_dim]` (as `layout` says), each
    row alone, one key split, tiles of `KV_SPLIT` keys."""
    return paged_attention(
        q, k_cache, v_cache, layout.block_tables, layout.seq_lens, layout.query_start_loc, scale,
        max_query_len=1, num_splits=1, block_n=KV_SPLIT, window=window, softcap=softcap, sinks=sinks,
    )
