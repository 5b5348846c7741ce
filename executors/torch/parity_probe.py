"""The load probe by behaviour: metroline's paged forward against the model's own forward.

`support.probe` checks the structure (every layer calls the registered attention and writes its
KV); this module checks the numbers, so that a model that computes something metroline does not
give it (a window or other structure that lives only in its mask, positions it derives itself) is
refused at load instead of answering wrongly:

- `check_parity`: three short sequences run as metroline runs them (two packed steps on paged KV
  blocks: a prompt cut in two chunks, a second prompt that shares the first one's two leading
  blocks and computes only its own tail, a decode, and a filler sequence), and every row's logits
  are compared with the model's own eager forward of each whole sequence. A difference beyond the
  dtype's tolerance refuses the model.
- `check_row_independence`: the second step again with every `torch.arange` the model makes of
  the step's length shifted by `ROW_SHIFT`. Positions come to the model as `position_ids`; a
  model that instead numbers the packed rows itself (Llama-4's attention temperature on its no-rope
  layers) moves its output, and is refused. The shift reaches positions past any probe length, so
  a dependence that shows only far into a sequence (a floor scale of 8192) is seen too.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import attention

BLOCK_SIZE = 4
ROW_SHIFT = 1 << 16
"""What `check_row_independence` adds to every `torch.arange` of the step's length."""

TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
"""The largest logit difference from the model's own forward, relative to the largest logit (at
least 1), for the dtype; 16-bit types get `LOW_PRECISION_TOLERANCE`."""
LOW_PRECISION_TOLERANCE = 5e-2


class _ShiftRowIndices(TorchFunctionMode):
    """While active: every 1-D `torch.arange` of `length` elements made outside metroline comes
    back shifted by `ROW_SHIFT`."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length
        self.shifted = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.arange and out.ndim == 1 and out.numel() == self.length:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith(__package__.split(".")[0] + "."):
                self.shifted += 1
                return out + ROW_SHIFT
        return out


def _tokens(vocab: int, n: int, seed: int) -> list[int]:
    return [(seed * 31 + 7 * i * i + 3 * i) % vocab for i in range(n)]


def _step_length(config: Any, base: int) -> int:
    """A row count for the second step, at least `base + 1` and equal to no integer of the config
    (nor its half), so that an `arange` of that length can only be the step's rows."""
    ints: set[int] = set()
    for value in config.to_dict().values():
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, int) and not isinstance(v, bool):
                ints.update((v, v // 2))
    n = base + 4
    while n in ints:
        n += 1
    return n


class _Probe:
    """The probe's sequences, block tables and KV (scratch, freed with the object)."""

    def __init__(self, model: Any, num_layers: int, num_kv_heads: int, head_dim: int, ops: Any) -> None:
        self.model = model
        self.ops = ops
        config = model.config
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        vocab = getattr(config, "vocab_size", 2) or 2
        a = _tokens(vocab, 11, 1)
        self.seqs = {"a": a, "b": a[:8] + _tokens(vocab, 3, 2), "c": _tokens(vocab, 6, 3)}
        base = 5 + 3 + 1  # the second step: a's second chunk, b's tail, c's decode
        self.seqs["d"] = _tokens(vocab, _step_length(config, base) - base, 4)
        # block tables: b shares a's first two blocks (a's positions 0..7)
        self.tables = {"a": [0, 1, 2], "b": [0, 1, 3], "c": [4, 5], "d": []}
        next_block = 6
        self.tables["d"] = list(range(next_block, next_block + -(-len(self.seqs["d"]) // BLOCK_SIZE)))
        num_blocks = next_block + len(self.tables["d"])
        shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        # the steps: (sequence, first position, end position) in row order
        self.steps = [
            [("a", 0, 6), ("c", 0, 5)],
            [("a", 6, 11), ("b", 8, 11), ("c", 5, 6), ("d", 0, len(self.seqs["d"]))],
        ]

    def run(self, step: list[tuple[str, int, int]]) -> torch.Tensor:
        """The step's packed forward on the probe's KV: float32 logits of every row."""
        from .packing import pack

        entries = [(self.seqs[s][lo:hi], lo, self.tables[s]) for s, lo, hi in step]
        packed = pack(entries, BLOCK_SIZE, self.device, self.k, self.v, self.ops)
        with torch.inference_mode(), attention.active_step(packed.meta):
            out = self.model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False)
        return out.logits[0].float()

    def reference(self) -> dict[str, torch.Tensor]:
        """The model's own eager forward of each whole sequence: float32 logits of every position."""
        model = self.model
        saved = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            with torch.inference_mode():
                return {s: model(input_ids=torch.tensor([ids], device=self.device)).logits[0].float()
                        for s, ids in self.seqs.items()}
        finally:
            model.set_attn_implementation(saved)


def check(model: Any, num_layers: int, num_kv_heads: int, head_dim: int, ops: Any) -> str | None:
    """Run the probe; None when metroline's paged forward is the model's own, else the cause (one
    line) to refuse the model with."""
    probe = _Probe(model, num_layers, num_kv_heads, head_dim, ops)
    dtype = next(model.parameters()).dtype
    tolerance = TOLERANCE.get(dtype, LOW_PRECISION_TOLERANCE)
    ref = probe.reference()
    worst, where = 0.0, ""
    last = None
    for i, step in enumerate(probe.steps):
        logits = probe.run(step)
        last = logits
        row = 0
        for s, lo, hi in step:
            want = ref[s][lo:hi]
            got = logits[row:row + hi - lo]
            row += hi - lo
            scale = max(1.0, want.abs().max().item())
            err = (got - want).abs().max().item() / scale
            if not err <= worst:  # also catches NaN
                worst, where = err, f"step {i + 1}, positions {lo}..{hi - 1} of a {len(probe.seqs[s])}-token sequence"
    if not worst <= tolerance:
        return (f"a short packed, chunked, prefix-shared run on metroline's paged attention differs from its own "
                f"forward (largest logit difference {worst:.3g} of the largest logit, tolerance {tolerance:g}; "
                f"{where})")
    shift = _ShiftRowIndices(sum(hi - lo for _, lo, hi in probe.steps[1]))
    try:
        with shift:
            moved = probe.run(probe.steps[1])
    except Exception as e:  # noqa: BLE001 - a failure under shifted row numbers is a dependence on them
        return (f"derives positions from the row index of the step ({type(e).__name__} when the rows are "
                f"renumbered), which a packed step cannot give it")
    if shift.shifted:
        scale = max(1.0, last.abs().max().item())
        diff = (moved - last).abs().max().item() / scale
        if not diff <= tolerance:
            return (f"derives positions from the row index of the step instead of position_ids (its logits move "
                    f"by {diff:.3g} of the largest logit when only the rows are renumbered), which a packed step "
                    f"cannot give it")
    return None
