"""`pack`: one packed forward's inputs on paged KV (batch 1, explicit positions, no padding).

Each entry is a sequence's tokens of the step, the position of the first and its block table;
the slots follow from the table. The target's step (`TorchExecutor`) and the draft model's
forwards (`metroline.executors.torch.draft_model`) are both packed here, each on its own KV
tensors but with the same block tables: the draft's KV lives in the same blocks of the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import attention

Entry = tuple[Sequence[int], int, Sequence[int]]
"""(the tokens of the step, the position of the first, the sequence's block table)."""


class Packed:
    """A packed forward's inputs: `ids`, `positions` (`[1, tokens]`), the attention's `meta`,
    and `starts`: the row of each entry's first token (and one past the last, at the end)."""

    __slots__ = ("ids", "positions", "meta", "starts")

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor, meta: attention.StepMeta, starts: list[int]):
        self.ids = ids
        self.positions = positions
        self.meta = meta
        self.starts = starts


def pack(entries: Iterable[Entry], block_size: int, device: torch.device, k_layers: list[torch.Tensor],
         v_layers: list[torch.Tensor], ops: Any) -> Packed:
    """The packed inputs of `entries` (see `Entry`) on the KV `k_layers`/`v_layers`."""
    bs = block_size
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    tables: list[Sequence[int]] = []
    for tokens, first, table in entries:
        end = first + len(tokens)
        ids.extend(tokens)
        positions.extend(range(first, end))
        slots.extend(table[p // bs] * bs + p % bs for p in range(first, end))
        starts.append(starts[-1] + end - first)
        seq_lens.append(end)
        tables.append(table[: (end + bs - 1) // bs])
    width = max(len(t) for t in tables)
    padded = [list(t) + [0] * (width - len(t)) for t in tables]
    meta = attention.StepMeta(
        torch.tensor(slots, dtype=torch.int64, device=device),
        torch.tensor(padded, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        torch.tensor(starts, dtype=torch.int32, device=device),
        k_layers, v_layers, ops,
    )
    return Packed(torch.tensor([ids], device=device), torch.tensor([positions], device=device), meta, starts)
