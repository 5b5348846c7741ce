"""The attention function metroline registers with transformers (`attn_implementation="metroline_paged"`).

Each attention layer of the model calls `paged_attention_forward` with the step's packed queries,
keys and values (batch 1). It writes the new keys and values into the layer's paged cache at the
step's slot mapping, then attends over each sequence's block table. Every layer writes before it
reads, so a sequence may read blocks that another sequence of the same step writes.

Masks: transformers builds a model's masks through the mask function registered under the same
name (`paged_mask`). metroline's attention applies causality and keeps the packed sequences apart
itself, so the mask function hands the model no tensor: it evaluates the mask function the model
asked for on (query, key) pairs within each sequence of the step and returns None when that
is plain causal attention, a `WindowMask` when it is a sliding window (honoured by the attention
exactly as the `sliding_window` argument is), and a `RefusedMask` for anything else (chunks,
bidirectional spans, custom overlays), which a layer given it refuses (`UnsupportedAttention`). A
window that lives only in the mask (qwen2_moe, phimoe) is thus applied, never dropped.

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
    every layer. `calls`: when a list, each attention call appends its layer index (how the load
    check sees that every layer went through this function).
    """

    __slots__ = ("slot_mapping", "block_tables", "seq_lens", "query_start_loc", "k_caches", "v_caches", "ops",
                 "layout", "calls")

    def __init__(self, slot_mapping, block_tables, seq_lens, query_start_loc, k_caches, v_caches, ops,
                 calls: list[int] | None = None) -> None:
        self.slot_mapping = slot_mapping
        self.block_tables = block_tables
        self.seq_lens = seq_lens
        self.query_start_loc = query_start_loc
        self.k_caches = k_caches
        self.v_caches = v_caches
        self.ops = ops
        self.calls = calls  # when a list: the layer index of every attention call (the load check)
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


IMPLEMENTED_ARGUMENTS = ("scaling", "dropout", "sliding_window", "softcap", "s_aux")
"""The arguments transformers passes to an attention function that metroline's attention honours:
the scale, dropout (0 at inference; anything else is refused), the layer's sliding window, logit
softcapping and attention sinks (`s_aux`, GPT-OSS)."""

NEUTRAL_ARGUMENTS = {
    "position_ids": None, "cache_position": None, "use_cache": None, "output_attentions": (False, None),
    "output_hidden_states": (False, None), "return_dict": None, "output_router_logits": None, "is_causal": (True, None),
    "head_mask": (None,), "layer_head_mask": (None,), "position_bias": (None,), "sinks": (None,),
}
"""Arguments that change nothing here: name -> the values that are neutral (None: any value; the
positions were applied by the rotary embedding before attention). Any other value, and any
argument in neither list, is refused (`UnsupportedAttention`), never ignored."""


class UnsupportedAttention(ValueError):
    """The model asked the attention function for something metroline's attention does not do."""


def check_arguments(kwargs: dict[str, Any]) -> None:
    """Raise `UnsupportedAttention` naming the first argument in `kwargs` (beyond the implemented
    ones) that is not neutral at the value given."""
    for name, value in kwargs.items():
        neutral = NEUTRAL_ARGUMENTS.get(name, ())  # an unknown argument has no neutral value
        if neutral is None or any(value is v or (v is not None and value == v) for v in neutral):
            continue
        raise UnsupportedAttention(f"passes the attention argument {name}={_short(value)}, which metroline's "
                                   f"paged attention does not implement")


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: `query [1, heads, tokens, dim]`, `key`/`value`
    `[1, kv_heads, tokens, dim]`; returns `[1, tokens, heads, dim]` and no weights.

    `sliding_window` (this layer's window, None for a full layer), `softcap` and `s_aux` (sink
    logits, one per query head) are honoured; `kwargs` must be neutral (`check_arguments`)."""
    meta = _current
    if meta is None:
        raise RuntimeError("metroline_paged attention called outside a metroline step")
    if kwargs:
        check_arguments(kwargs)
    if dropout:
        raise UnsupportedAttention(f"passes dropout={dropout}: metroline runs inference only (model.eval())")
    window = sliding_window or None
    if isinstance(attention_mask, WindowMask):
        if window is not None and window != attention_mask.window:
            raise UnsupportedAttention(f"passes sliding_window={window} but its mask has a window of "
                                       f"{attention_mask.window}")
        window = attention_mask.window
    elif isinstance(attention_mask, RefusedMask):
        raise UnsupportedAttention(attention_mask.cause)
    elif attention_mask is not None:
        raise UnsupportedAttention("builds its own attention mask instead of going through transformers' "
                                   "mask interface, which metroline's paged attention would ignore")
    if query.shape[0] != 1:
        raise ValueError(f"metroline_paged attention expects one packed batch, got batch size {query.shape[0]}")
    layer = module.layer_idx
    k_cache, v_cache = meta.k_caches[layer], meta.v_caches[layer]
    check_kv_shape(key, value, k_cache)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    cap = softcap or None
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    if meta.layout is not None:  # the torch reference takes any strides
        meta.ops.write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        out = meta.ops.attend(q, k_cache, v_cache, meta.layout, scale, window=window, softcap=cap, sinks=s_aux)
    else:
        meta.ops.write_kv(k_cache, v_cache, k.contiguous(), v.contiguous(), meta.slot_mapping)
        out = meta.ops.paged_attention(
            q.contiguous(), k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale,
            window=window, softcap=cap, sinks=s_aux,
        )
    if meta.calls is not None:
        meta.calls.append(layer)
    return out.unsqueeze(0), None


def check_kv_shape(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor) -> None:
    """Refuse keys or values whose heads and width are not the paged cache's `[kv_heads, head_dim]`
    (keys and values of different widths: multi-head latent attention)."""
    want = tuple(k_cache.shape[2:])
    k_shape, v_shape = (key.shape[1], key.shape[-1]), (value.shape[1], value.shape[-1])
    if key.shape[-1] != value.shape[-1]:
        raise UnsupportedAttention(f"its keys and values have different widths ({key.shape[-1]} and {value.shape[-1]}: "
                                   f"latent or asymmetric attention), which metroline's paged cache does not store")
    if k_shape != want or v_shape != want:
        raise UnsupportedAttention(f"its keys are {k_shape[0]} heads of {k_shape[1]} where the config gives "
                                   f"{want[0]} of {want[1]} (per-layer or latent head shapes), which metroline's "
                                   f"paged cache does not store")


class WindowMask:
    """What `paged_mask` hands a model in place of a mask tensor when the model's mask is a sliding
    window: `window` (a query at position `p` sees keys `p - window < k <= p`)."""

    __slots__ = ("window",)

    def __init__(self, window: int) -> None:
        self.window = window

    def __repr__(self) -> str:
        return f"WindowMask({self.window})"


class RefusedMask:
    """What `paged_mask` hands a model for a mask metroline's attention does not implement: the
    attention of a layer that receives it refuses, with `cause` (a model may build masks that no
    layer uses, as qwen2_moe's sliding mask with its window off)."""

    __slots__ = ("cause",)

    def __init__(self, cause: str) -> None:
        self.cause = cause


def paged_mask(
    batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
    mask_function: Any = None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
    **kwargs: Any,
) -> WindowMask | RefusedMask | None:
    """transformers' mask interface: the mask the model asks for (`mask_function` over the packed
    step), as the attention will apply it. Evaluates `mask_function` on (query, key) pairs of each
    sequence's rows in the step (`_pairs_within_sequences`) and returns None when that is causal
    attention, a `WindowMask` when it is causal within `local_size` (the window transformers'
    sliding-window masks pass);
    anything else a `RefusedMask`, which the attention of a layer given it refuses. A step whose
    sequences are all shorter than the window cannot tell the two apart: the window is the one the
    model asked for."""
    meta = _current
    if meta is None:
        raise RuntimeError("metroline_paged mask built outside a metroline step")
    if attention_mask is not None:
        raise UnsupportedAttention("passes a padding mask, which metroline's packed steps never need")
    if batch_size != 1 or q_offset or kv_offset or q_length != kv_length:
        raise UnsupportedAttention(f"builds its mask over {batch_size} rows, {q_length} queries and {kv_length} keys "
                                   f"(offsets {q_offset}, {kv_offset}) where metroline packs one batch row")
    if mask_function is None:
        return None
    q, kv = _pairs_within_sequences(meta.query_start_loc, local_size)
    zero = torch.zeros_like(q)
    try:
        visible = mask_function(zero, zero, q, kv)
    except Exception as e:  # noqa: BLE001 - a mask function that is not index-based is refused
        return RefusedMask(f"builds an attention mask metroline cannot evaluate pair by pair ({type(e).__name__})")
    visible = torch.as_tensor(visible, device=q.device).expand(q.shape)
    distance = q - kv
    causal = distance >= 0
    if local_size and bool((visible == (causal & (distance < local_size))).all()):
        return WindowMask(int(local_size))
    if bool((visible == causal).all()):
        return None
    return RefusedMask("puts structure other than causal attention or a sliding window into its attention mask "
                       "(chunks, bidirectional spans or a custom overlay), which metroline's paged attention does "
                       "not implement")


NEAR = 16
"""`paged_mask` reads every pair of rows of a sequence at most this far apart (and one apart the
wrong way), the pairs at a window's edge, and the whole row of each sequence's last query."""


def _pairs_within_sequences(query_start_loc: torch.Tensor, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(query row, key row) pairs of the step, both rows in one sequence's segment, as two flat
    int64 tensors: every row with the keys at distances -1..`NEAR` and at `window` - 1, `window`,
    `window` + 1 (what tells causal attention, a window and anything else apart in a row), and
    the last row of each segment with every key of its segment (long-range structure: chunks,
    global tokens). Linear in the step's rows, not quadratic."""
    starts = query_start_loc.to(torch.int64)
    lens = starts[1:] - starts[:-1]
    device = starts.device
    rows = torch.arange(int(starts[-1]), device=device)
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=device), lens)
    near = list(range(-1, NEAR + 1)) + ([window - 1, window, window + 1] if window else [])
    distance = torch.tensor(sorted(set(near)), device=device)
    q = rows[:, None].expand(-1, distance.numel())
    kv = q - distance[None, :]
    inside = (kv >= starts[seg][:, None]) & (kv < starts[seg + 1][:, None])
    last = (starts[1:] - 1)[lens > 0]
    q_last = torch.repeat_interleave(last, lens[lens > 0])
    return torch.cat([q[inside], q_last]), torch.cat([kv[inside], rows])


def register() -> str:
    """Register the attention function and its mask function (`paged_mask`) with transformers;
    returns the `attn_implementation` name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, paged_mask)
    return ATTN_IMPLEMENTATION
