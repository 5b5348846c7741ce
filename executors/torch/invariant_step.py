"""The deterministic mode's step (`EngineConfig.deterministic`): one forward per step whose every
reduction runs in a fixed shape, so that a request's numbers never depend on its companions.

A library's matmul, norm or softmax picks its algorithm, its blocking and its split across threads
from the shapes it is given: one decode alone (one row) and the same decode among 31 others go
through different kernels and sum in different orders, so their logits differ in the last bits
(and, over a long generation or at bf16, in tokens). Here a step's packed tokens (prefill chunks
and decodes, in plan order) run through the model in one call, padded to a multiple of
`TILE_TOKENS` rows (one more sequence, at positions 0.., whose every block is a scratch block: the
first of the two blocks the executor allocates past the pool's; the second stays zeros, see
`invariant_attention`), and:

- every weight product (the model's linear layers and its LM head) multiplies exactly
  `TILE_TOKENS` rows per call (`invariant_linear`): a row's sums do not depend on how many rows the
  step has nor on its place among them;
- the attention is `invariant_attention` (CPU: a row in a block of query positions its position
  fixes) or `triton_invariant` (CUDA: each row alone), which reduce each row over its context in
  one order fixed by position; the padding rows write their KV but are not attended;
- what remains (embeddings, norms, rotary embeddings, activations, residual adds) works row by row:
  each row's reduction over its own hidden vector, in an order its length fixes. The row count is a
  multiple of `TILE_TOKENS` (a multiple of every CPU vector width), so a pointwise kernel never
  handles part of a row in its scalar tail.

Each layer writes its KV before it reads, so a prompt cut across steps (or recomputed after a
preemption, or found in the prefix cache) gets the same KV bits as when computed whole. The LM head
runs on the sampled rows only. `check_invariance` refuses, at the first `bind`, a model whose
forward the above does not make batch-invariant (a mixture of experts, a product outside its linear
layers that the probe catches).

The cost (`bench/deterministic.py` measures it): a step of fewer than `TILE_TOKENS` tokens, or the
last block of a bigger one, computes padding rows, and a long prefill's weight products run
`TILE_TOKENS` rows at a time instead of all at once.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import attention, invariant_linear, linear

TILE_TOKENS = invariant_linear.TILE_ROWS
"""Rows of every weight product in the deterministic mode; a step's rows are padded to a multiple of
it (a multiple of every CPU vector width, so a pointwise kernel
never handles a row's tail apart from the others)."""


def forward_tiles(model: Any, plan: Any, kv: Any, ops: Any, scratch: int) -> torch.Tensor:
    """Run `plan`'s scheduled tokens through `model` in one batch-invariant call (see the module);
    returns the float32 logits of the last token of each sequence of `plan.sample_seqs`, in that
    order. `scratch` is the id of the block the padding rows write."""
    rows: list[tuple[int, int, int]] = []  # (sequence index, token, position)
    seqs = list(plan.scheduled)
    last_row: dict[Any, int] = {}
    for s, (seq, n) in enumerate(plan.scheduled.items()):
        first = seq.num_computed_tokens
        rows.extend((s, seq.token_ids[p], p) for p in range(first, first + n))
        last_row[seq] = len(rows) - 1
    keep = [last_row[seq] for seq in plan.sample_seqs]
    return _run_rows(model, rows, seqs, plan.block_size, kv, ops, scratch, kv.k.device, keep).float()


def _run_rows(model: Any, rows: list[tuple[int, int, int]], seqs: list[Any], bs: int, kv: Any, ops: Any,
              scratch: int, device: torch.device, keep: list[int], trace: Any = None) -> torch.Tensor:
    """One forward of `rows` (then padding to a multiple of `TILE_TOKENS`), each a `(sequence index
    into seqs, token, position)`, the rows of a sequence consecutive and in order. Returns the
    `[len(keep), vocab]` logits of the rows `keep`, in that order. With `trace` (a dispatch mode),
    the model runs under it."""
    pad = -len(rows) % TILE_TOKENS
    ids = [t for _, t, _ in rows] + [0] * pad
    positions = [p for _, _, p in rows] + list(range(pad))
    slots: list[int] = []
    tables: list[list[int]] = []
    seq_lens: list[int] = []
    starts = [0]
    for i, (s, _, p) in enumerate(rows):
        table = seqs[s].block_table
        slots.append(table[p // bs] * bs + p % bs)
        if i + 1 < len(rows) and rows[i + 1][0] == s:
            continue  # the segment of sequence s goes on
        tables.append(table[: p // bs + 1])
        seq_lens.append(p + 1)
        starts.append(i + 1)
    if pad:  # the padding rows: one sequence at positions 0.. whose every block is the scratch one
        slots.extend(scratch * bs + p % bs for p in range(pad))
        tables.append([scratch] * -(-pad // bs))
        seq_lens.append(pad)
        starts.append(starts[-1] + pad)
    width = max(len(t) for t in tables)
    padded = [t + [scratch] * (width - len(t)) for t in tables]
    int32 = dict(dtype=torch.int32, device=device)
    meta = attention.StepMeta(
        torch.tensor(slots, dtype=torch.int64, device=device), torch.tensor(padded, **int32),
        torch.tensor(seq_lens, **int32), torch.tensor(starts, **int32), kv.k_layers, kv.v_layers,
        _WithoutPadding(ops, pad) if pad else ops,
    )
    inputs = dict(input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([positions], device=device),
                  use_cache=False, logits_to_keep=torch.tensor(keep, dtype=torch.int64, device=device))
    with attention.active_step(meta), linear.active(), invariant_linear.row_tiles(model), trace or nullcontext():
        out = model(**inputs)
    return out.logits[0]


class _WithoutPadding:
    """The mode's attention `ops` for a step whose last sequence is its `pad` padding rows: they
    write their keys and values (to the scratch block) but are not attended; their attention
    output is zeros (a padding row's results are never read)."""

    def __init__(self, ops: Any, pad: int) -> None:
        self.ops, self.pad = ops, pad
        self.write_kv = ops.write_kv

    def plan_step(self, block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                  block_size: int) -> Any:
        return self.ops.plan_step(block_tables[:-1], seq_lens[:-1], query_start_loc[:-1], block_size)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, layout: Any, scale: float,
               **options: Any) -> torch.Tensor:
        out = self.ops.attend(q[:-self.pad], k_cache, v_cache, layout, scale, **options)
        return torch.cat([out, out.new_zeros(self.pad, *out.shape[1:])])


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
PRODUCT_OPS = {"aten.mm": 0, "aten.addmm": 1, "aten.bmm": 0, "aten.baddbmm": 1, "aten.addbmm": 1,
               "mkldnn._linear_pointwise": 0}
"""Matrix products (op -> the argument holding the rows): outside the attention, every one that
sums (a contraction longer than 1) must multiply exactly `TILE_TOKENS` rows, as the tiled linear
layers do; one that multiplies the step's rows at once (a product outside the model's linear
layers) would sum each row in an order the row count may change."""


class _ShapeTrace(TorchDispatchMode):
    """Records `(op, input shapes)` of every op the model runs outside metroline's attention and
    mask functions (whose shapes follow the step's layout by design, and whose numbers do not),
    and the products (`PRODUCT_OPS`) among them that do not multiply `TILE_TOKENS` rows."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []
        self.untiled: list[str] = []
        self._skip = (attention.paged_attention_forward.__code__, attention.paged_mask.__code__)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code not in self._skip:
            frame = frame.f_back
        if frame is None:
            leaves = pytree.tree_leaves((args, kwargs))
            shapes = tuple(tuple(a.shape) for a in leaves if isinstance(a, torch.Tensor))
            name = str(func)
            self.ops.append((name, shapes))
            which = PRODUCT_OPS.get(name.rsplit(".", 1)[0])
            if which is not None and len(args) > which and isinstance(args[which], torch.Tensor):
                a = args[which]
                batched = name.startswith(("aten.bmm", "aten.baddbmm", "aten.addbmm"))
                rows = a.shape[-2] if batched else a.numel() // max(a.shape[-1], 1)
                if a.shape[-1] > 1 and rows != TILE_TOKENS:
                    self.untiled.append(f"{name} on {rows} rows")
        return func(*args, **(kwargs or {}))


def check_invariance(model: Any, ops: Any, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
    """Refuse, in one line, a model whose forward in the mode still depends on the other rows of
    the step, found by behaviour rather than by name. Three forwards of one short sequence: alone
    (one tile), after two companions in the same tile, and after three companions, its rows
    across the boundary of the second and third tiles. No op outside the attention may split its
    work by values (`ROUTING_OPS`); every product that sums must multiply `TILE_TOKENS` rows
    (`PRODUCT_OPS`: one outside the model's linear layers is not tiled); the ops of the first two
    forwards must see the same shapes (a mixture of experts runs each expert on the tokens routed
    to it: a shape set by the companions); and the sequence's logits must be bitwise the same in
    all three."""
    from .support import UnsupportedModel, model_type

    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    vocab = getattr(model.config, "vocab_size", 2) or 2
    # sequences (tokens, blocks): 0 the probed one, 1 to 3 companions; block 6 the scratch one, 7 the zeros
    lengths, tables = (5, 13, 9, 40), ([0], [1], [2], [3, 4, 5])
    shape = (8, PROBE_BLOCK, num_kv_heads, head_dim)
    kv = SimpleNamespace(k_layers=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                         v_layers=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])
    tokens = [[(5 + 7 * i + 11 * s * i) % vocab for i in range(n)] for s, n in enumerate(lengths)]
    seqs = [SimpleNamespace(token_ids=t, block_table=b) for t, b in zip(tokens, tables)]
    rows = [[(s, t, p) for p, t in enumerate(tokens[s])] for s in range(len(lengths))]
    runs = []
    # the first two sample the probed row only (the same shapes); the last, 40 + 9 + 13 rows, then the
    # probed one's 62..66 across the tiles' boundary, samples every sequence's last row
    for order, every in (((0,), False), ((1, 2, 0), False), ((3, 2, 1, 0), True)):
        step = [r for s in order for r in rows[s]]
        ends = [sum(lengths[s] for s in order[:i + 1]) - 1 for i in range(len(order))]
        keep = ends if every else ends[-1:]
        trace = _ShapeTrace()
        with torch.inference_mode():
            out = _run_rows(model, step, seqs, PROBE_BLOCK, kv, ops, 6, device, keep, trace)
        runs.append((out[-1].clone(), trace))
    traces = [trace for _, trace in runs]
    cause = None
    routing = next((op for t in traces for op, _ in t.ops if op.rsplit(".", 1)[0] in ROUTING_OPS), None)
    untiled = next((u for t in traces for u in t.untiled), None)
    (alone, alone_trace), (batched, batched_trace), (across, _) = runs
    alone_ops, batched_ops = alone_trace.ops, batched_trace.ops
    if routing is not None:
        cause = (f"it runs {routing}, which splits its work by how many rows the data routes to each part (a "
                 f"mixture of experts)")
    elif untiled is not None:
        cause = (f"it multiplies matrices outside its linear layers ({untiled}, where the mode's products take "
                 f"{TILE_TOKENS})")
    elif alone_ops != batched_ops:
        k = next((i for i, (a, b) in enumerate(zip(alone_ops, batched_ops)) if a != b), min(len(alone_ops),
                                                                                           len(batched_ops)))
        op = (alone_ops[k] if k < len(alone_ops) else batched_ops[k])[0]
        cause = (f"the shapes of its operations depend on the other rows of the batch ({op}, op {k + 1} of the "
                 f"forward: a mixture of experts or other data-dependent layer)")
    elif not (torch.equal(alone, batched) and torch.equal(alone, across)):
        cause = "a row's logits differ bitwise alone and among companions"
    if cause is not None:
        raise UnsupportedModel(f"{model_type(model.config)}: deterministic mode: its forward cannot be made "
                               f"batch-invariant: {cause}")
