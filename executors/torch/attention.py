"""The attention function metroline registers with transformers (`attn_implementation="metroline_paged"`).

Each attention layer of the model calls `paged_attention_forward` with the step's packed queries,
keys and values (batch 1). It writes the new keys and values into the layer's paged cache at the
step's slot mapping, then attends over each sequence's block table. Every layer writes before it
reads, so a sequence may read blocks that another sequence of the same step writes.

The step's metadata (`StepMeta`) is installed by the executor around the forward (`active_step`).
On CUDA the Triton kernels of `triton_attention` serve when that module imports; elsewhere the torch
reference does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from . import reference_attention

ATTN_IMPLEMENTATION = "metroline_paged"


class StepMeta:
    """One step's packed layout, on the model's device.

    `slot_mapping: int64 [num_tokens]`, `block_tables: int32 [num_seqs, max_blocks]`,
    `seq_lens: int32 [num_seqs]` (context after the step), `query_start_loc: int32 [num_seqs + 1]`,
    `k_caches`, `v_caches`: one `[num_blocks, block_size, num_kv_heads, head_dim]` tensor per layer,
    `ops`: the module with `write_kv` and `paged_attention` to use. When `ops` also has `plan_step`
    and `attend` (the torch reference), `layout` is its plan of the step, made once here for
    every layer.
    """

    __slots__ = ("slot_mapping", "block_tables", "seq_lens", "query_start_loc", "k_caches", "v_caches", "ops",
                 "layout")

    def __init__(self, slot_mapping, block_tables, seq_lens, query_start_loc, k_caches, v_caches, ops) -> None:
        self.slot_mapping = slot_mapping
        self.block_tables = block_tables
        self.seq_lens = seq_lens
        self.query_start_loc = query_start_loc
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.ops = ops
        plan_step = getattr(ops, "plan_step", None)
        self.layout = plan_step(block_tables, seq_lens, query_start_loc, k_caches[0].shape[1]) if plan_step else None


_current: StepMeta | None = None


@contextlib.contextmanager
def active_step(meta: StepMeta) -> Iterator[None]:
    """Make `meta` the step the attention layers read and write during the `with` body."""
    global _current
    previous, _current = _current, meta
    try:
        yield
    finally:
        _current = previous


def attention_ops(device: torch.device) -> Any:
    """The kernels for `device`: `triton_attention` on CUDA when it imports, else the reference."""
    if device.type == "cuda":
        try:
            from . import triton_attention
        except ImportError:
            return reference_attention
        return triton_attention
    return reference_attention


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: `query [1, heads, tokens, dim]`, `key`/`value`
    `[1, kv_heads, tokens, dim]`; returns `[1, tokens, heads, dim]` and no weights."""
    meta = _current
    if meta is None:
        raise RuntimeError("metroline_paged attention called outside a metroline step")
    if query.shape[0] != 1:
        raise ValueError(f"metroline_paged attention expects one packed batch, got batch size {query.shape[0]}")
    layer = module.layer_idx
    k_cache, v_cache = meta.k_caches[layer], meta.v_caches[layer]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    if meta.layout is not None:  # the torch reference takes any strides
        meta.ops.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = meta.ops.attend(q, k_cache, v_cache, meta.layout, scale)
    else:
        meta.ops.write_kv(k_cache, v_cache, k.contiguous(), v.contiguous(), meta.slot_mapping)
        out = meta.ops.paged_attention(
            q.contiguous(), k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale
        )
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None  # the paged attention applies causality itself


def register() -> str:
    """Register the attention function (and its mask function: none) with transformers; returns
    the `attn_implementation` name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
    return ATTN_IMPLEMENTATION
