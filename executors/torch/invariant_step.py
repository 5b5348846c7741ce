"""The deterministic mode's step (`EngineConfig.deterministic`): the forward in tiles of a fixed
number of tokens, so that a request's numbers never depend on its companions.

A library's matmul, norm or softmax picks its algorithm, its blocking and its split across threads
from the shapes it is given: one decode alone (one row) and the same decode among 31 others go
through different kernels and sum in different orders, so their logits differ in the last bits
(and, over a long generation or at bf16, in tokens). Here every forward of the model has exactly
`TILE_TOKENS` rows: a step's packed tokens (prefill chunks and decodes, in plan order) are cut into
tiles of that many, the last one padded with rows that write only a scratch block (the first of
the two blocks the executor allocates past the pool's; the second stays zeros, see
`invariant_attention`). Every kernel then
sees the same shapes whatever the batch, and a row's result does not depend on the other rows'
values nor on its place in the tile (a fixed-shape GEMM runs one blocking for every row); attention
is `invariant_attention` (CPU) or `triton_invariant` (CUDA), which reduce each row over its context
in one order fixed by position. Tiles run one after another, and each layer writes its KV before it
reads, so a prompt cut across tiles (or across steps, or recomputed after a preemption, or found in
the prefix cache) gets the same KV bits as when computed whole.

The cost: a step of fewer than `TILE_TOKENS` tokens computes `TILE_TOKENS` rows, and a long prefill
runs the model once per tile (`bench/deterministic.py` measures it).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import attention, linear

TILE_TOKENS = 32
"""Rows of every forward in the deterministic mode (a multiple of every CPU vector width, so a
pointwise kernel never handles a row's tail apart from the others)."""


def forward_tiles(model: Any, plan: Any, kv: Any, ops: Any, scratch: int) -> torch.Tensor:
    """Run `plan`'s scheduled tokens through `model` in tiles of `TILE_TOKENS` rows; returns the
    float32 logits of the last token of each sequence of `plan.sample_seqs`, in that order.
    `scratch` is the id of the block the padding rows write."""
    bs = plan.block_size
    rows: list[tuple[int, int, int]] = []  # (sequence index, token, position)
    seqs = list(plan.scheduled)
    last_row: dict[Any, int] = {}
    for s, (seq, n) in enumerate(plan.scheduled.items()):
        first = seq.num_computed_tokens
        rows.extend((s, seq.token_ids[p], p) for p in range(first, first + n))
        last_row[seq] = len(rows) - 1
    wanted = {last_row[seq]: j for j, seq in enumerate(plan.sample_seqs)}
    device = kv.k.device
    logits: list[torch.Tensor | None] = [None] * len(plan.sample_seqs)
    for start in range(0, len(rows), TILE_TOKENS):
        tile = rows[start:start + TILE_TOKENS]
        keep = [(r - start, wanted[r]) for r in range(start, start + len(tile)) if r in wanted]
        out = _run_tile(model, tile, seqs, bs, kv, ops, scratch, device, bool(keep))
        for row, j in keep:
            logits[j] = out[row]
    if not logits:
        return torch.empty(0, model.config.vocab_size, device=device)
    return torch.stack(logits).float()  # type: ignore[arg-type]


def _run_tile(model: Any, tile: list[tuple[int, int, int]], seqs: list[Any], bs: int, kv: Any, ops: Any,
              scratch: int, device: torch.device, want_logits: bool) -> torch.Tensor | None:
    """One forward of exactly `TILE_TOKENS` rows: `tile`'s, then padding. Returns `[rows, vocab]`
    logits (all rows, so the LM head's shape is fixed too) or None when no row is sampled."""
    pad = TILE_TOKENS - len(tile)
    ids = [t for _, t, _ in tile] + [0] * pad
    positions = [p for _, _, p in tile] + [0] * pad
    slots: list[int] = []
    tables: list[list[int]] = []
    seq_lens: list[int] = []
    starts = [0]
    for i, (s, _, p) in enumerate(tile):
        table = seqs[s].block_table
        slots.append(table[p // bs] * bs + p % bs)
        if i + 1 < len(tile) and tile[i + 1][0] == s:
            continue  # the segment of sequence s in this tile goes on
        tables.append(table[: p // bs + 1])
        seq_lens.append(p + 1)
        starts.append(i + 1)
    for i in range(pad):  # each padding row: a one-token sequence at position 0 of the scratch block
        slots.append(scratch * bs)
        tables.append([scratch])
        seq_lens.append(1)
        starts.append(starts[-1] + 1)
    width = max(len(t) for t in tables)
    padded = [t + [scratch] * (width - len(t)) for t in tables]
    meta = attention.StepMeta(
        torch.tensor(slots, dtype=torch.int64, device=device), torch.tensor(padded, dtype=torch.int32, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device), torch.tensor(starts, dtype=torch.int32, device=device),
        kv.k_layers, kv.v_layers, ops,
    )
    with attention.active_step(meta), linear.active():
        out = model(
            input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([positions], device=device),
            use_cache=False, logits_to_keep=0 if want_logits else 1,
        )
    return out.logits[0] if want_logits else None


def attention_ops(device: torch.device) -> Any:
    """The deterministic attention for `device`: the Triton kernel on CUDA when it imports, else
    the torch one."""
    if device.type == "cuda":
        try:
            from . import triton_invariant
        except ImportError:
            pass
        else:
            return triton_invariant
    from . import invariant_attention

    return invariant_attention


PROBE_BLOCK = 16
"""Block size of `check_invariance`'s scratch KV."""
ROUTING_OPS = ("aten._grouped_mm", "aten.nonzero", "aten.histc", "aten.bincount", "aten._unique2", "aten.unique_dim",
               "aten.unique_consecutive")
"""Ops whose work is split by values rather than shapes (rows per group, per expert): a forward
that runs one (outside the attention) cannot be batch-invariant however its shapes are fixed."""


class _ShapeTrace(TorchDispatchMode):
    """Records `(op, input shapes)` of every op the model runs outside metroline's attention and
    mask functions (whose shapes follow the step's layout by design, and whose numbers do not)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []
        self._skip = (attention.paged_attention_forward.__code__, attention.paged_mask.__code__)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code not in self._skip:
            frame = frame.f_back
        if frame is None:
            leaves = pytree.tree_leaves((args, kwargs))
            shapes = tuple(tuple(a.shape) for a in leaves if isinstance(a, torch.Tensor))
            self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


class _Traced:
    """`model` called under a `_ShapeTrace` (what `_run_tile` calls in the probe)."""

    def __init__(self, model: Any, trace: _ShapeTrace) -> None:
        self.model, self.trace = model, trace

    def __call__(self, **inputs: Any) -> Any:
        with self.trace:
            return self.model(**inputs)


def check_invariance(model: Any, ops: Any, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
    """Refuse, in one line, a model whose forward in the mode still depends on the other rows of
    the tile, found by behaviour rather than by name: one short sequence's tile alone and the same
    sequence after two companions. Every op outside the attention must see the same shapes in both
    (a mixture of experts runs each expert on the tokens routed to it: a shape set by the
    companions), none may split its work by values (`ROUTING_OPS`), and the sequence's logits must
    be bitwise the same."""
    from .support import UnsupportedModel, model_type

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    vocab = getattr(model.config, "vocab_size", 2) or 2
    # blocks: 0 the row's sequence, 1 and 2 the companions', 3 the scratch one, 4 the zeros
    shape = (5, PROBE_BLOCK, num_kv_heads, head_dim)
    kv = SimpleNamespace(k_layers=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                         v_layers=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])
    tokens = [[(5 + 7 * i + 11 * s * i) % vocab for i in range(n)] for s, n in enumerate((5, 13, 9))]
    seqs = [SimpleNamespace(token_ids=t, block_table=[b]) for b, t in enumerate(tokens)]
    rows = [[(s, t, p) for p, t in enumerate(tokens[s])] for s in range(3)]
    runs = []
    for tile in (rows[0], rows[1] + rows[2] + rows[0]):
        trace = _ShapeTrace()
        with torch.inference_mode():
            out = _run_tile(_Traced(model, trace), tile, seqs, PROBE_BLOCK, kv, ops, 3, device, True)
        runs.append((out[len(tile) - 1].clone(), trace.ops))
    (alone, alone_ops), (batched, batched_ops) = runs
    cause = None
    routing = next((op for op, _ in alone_ops + batched_ops if op.rsplit(".", 1)[0] in ROUTING_OPS), None)
    if routing is not None:
        cause = (f"it runs {routing}, which splits its work by how many rows the data routes to each part (a "
                 f"mixture of experts)")
    elif alone_ops != batched_ops:
        k = next((i for i, (a, b) in enumerate(zip(alone_ops, batched_ops)) if a != b), min(len(alone_ops),
                                                                                           len(batched_ops)))
        op = (alone_ops[k] if k < len(alone_ops) else batched_ops[k])[0]
        cause = (f"the shapes of its operations depend on the other rows of the batch ({op}, op {k + 1} of the "
                 f"forward: a mixture of experts or other data-dependent layer)")
    elif not torch.equal(alone, batched):
        cause = "a row's logits differ bitwise alone and among companions"
    if cause is not None:
        raise UnsupportedModel(f"{model_type(model.config)}: deterministic mode: its forward cannot be made "
                               f"batch-invariant: {cause}")
