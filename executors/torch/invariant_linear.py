"""The deterministic mode's linear layers: every product of activations with a weight runs on
exactly `TILE_ROWS` rows.

A matmul library picks its kernel, its blocking and therefore each output's summation order from
the shapes it is given, the number of rows among them: a row multiplied among 1,300 others can
get other bits than the same row among 31. Inside `row_tiles(model)` each `nn.Linear` of the
model (and transformers' `Conv1D`, the same product with the weight transposed) cuts its input
into blocks of `TILE_ROWS` rows, zero-padding the last, and multiplies them one after another,
each with the layer's own forward (the oneDNN one of `linear.py` on CPU float32, `F.linear`
elsewhere). Every call then has one shape, whatever the batch, and a row's result depends on its
own values alone (a fixed-shape GEMM sums every row of its block in the same order), so the
model can run a whole step in one call while its weight products stay batch-invariant.

The layers' forwards are replaced on entry and restored on exit: outside the `with` body the model
is unchanged (it keeps serving the normal path and Hugging Face `generate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

TILE_ROWS = 32
"""Rows of every weight product in the deterministic mode (a multiple of every CPU vector width)."""


def _row_layers() -> tuple[type, ...]:
    """The module classes whose forward is a product of each input row with a weight."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency of the executor
        return (torch.nn.Linear,)
    return (torch.nn.Linear, Conv1D)


class RowTiled:
    """A layer's forward that multiplies `TILE_ROWS` rows per call of `inner` (the layer's own
    forward, given `[1, TILE_ROWS, in_features]`); the output has the input's leading shape."""

    __slots__ = ("inner", "out_features")

    def __init__(self, inner: Callable[[torch.Tensor], torch.Tensor], out_features: int) -> None:
        self.inner = inner
        self.out_features = out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        rows = x.numel() // width if width else 0
        lead = x.shape[:-1]
        if rows == 0:
            return x.new_empty(*lead, self.out_features)
        flat = x.reshape(rows, width)
        pad = -rows % TILE_ROWS
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad, width)])
        parts = [self.inner(flat[None, start:start + TILE_ROWS]) for start in range(0, rows + pad, TILE_ROWS)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return out[0, :rows].reshape(*lead, out.shape[-1])


@contextlib.contextmanager
def row_tiles(model: Any) -> Iterator[int]:
    """Inside the `with` body, every `nn.Linear` (and `Conv1D`) of `model` multiplies `TILE_ROWS`
    rows per call (`RowTiled`); yields how many layers that is. Their forwards are restored on exit."""
    saved: list[tuple[torch.nn.Module, Any]] = []
    kinds = _row_layers()
    try:
        for module in model.modules():
            if isinstance(module, kinds):
                own = module.__dict__.get("forward")  # an instance forward (linear.py's), else the class's
                out = module.out_features if isinstance(module, torch.nn.Linear) else module.nf
                module.forward = RowTiled(own if own is not None else module.forward, out)
                saved.append((module, own))
        yield len(saved)
    finally:
        for module, own in saved:
            if own is None:
                del module.forward
            else:
                module.forward = own
