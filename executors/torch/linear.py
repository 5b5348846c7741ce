"""The model's linear layers through oneDNN on prepacked weights, on CPU in float32.

torch's CPU `linear` goes to MKL, which on some CPUs (AMD EPYC with AVX-512, for one) picks a
kernel that reaches half of what oneDNN's reaches on the same core, and the LM head and MLP
projections are most of a step. `install(model)` gives every float32 `nn.Linear` a forward that,
while a metroline step runs (`active()`), multiplies with oneDNN on a copy of its weight reordered
once into oneDNN's blocked layout; outside a step the layer is plain `F.linear`, so the same model
object still serves Hugging Face `generate` unchanged. Results are float32 (no reduced-precision
math), equal to `F.linear` up to summation order.

The packed copy is taken at `install`, of the weights the layers hold then: weights changed or
replaced afterwards are not seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 64
"""The batch size oneDNN's weight layout is chosen for (any batch size works with it)."""

_active = False


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `install` applies: a CPU float32 model and a torch built with oneDNN."""
    return (
        device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedForward:
    """The forward of one `nn.Linear`: oneDNN on the packed weight inside a step, `F.linear` outside.

    It holds the layer's weight and bias, not the layer (which holds it: no reference cycle)."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, linear: torch.nn.Linear) -> None:
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_BATCH_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _active:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def install(model: Any) -> int:
    """Give every float32 CPU `nn.Linear` of `model` a `PackedForward`; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu":
            if not isinstance(module.__dict__.get("forward"), PackedForward):
                module.forward = PackedForward(module)
            count += 1
    return count


@contextlib.contextmanager
def active() -> Iterator[None]:
    """Inside the `with` body, installed linear layers multiply with oneDNN."""
    global _active
    previous, _active = _active, True
    try:
        yield
    finally:
        _active = previous
