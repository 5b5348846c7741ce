"""The oneDNN linear layers of the torch executor: float32 results equal to `F.linear` up to
summation order inside a step, the stock layer untouched outside one, and only where they apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_helpers import tiny_llama

from metroline.executors.torch import TorchExecutor, linear

pytestmark = pytest.mark.skipif(
    not linear.available(torch.device("cpu"), torch.float32), reason="torch built without oneDNN"
)


def test_inside_a_step_close_to_f_linear_outside_identical():
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 40)
    x = torch.randn(3, 5, 48)
    with torch.no_grad():
        stock = F.linear(x, layer.weight, layer.bias)
        assert linear.install(layer) == 1
        assert torch.equal(layer(x), stock)  # no step: the stock kernel, bit for bit
        with linear.active():
            packed = layer(x)
        assert torch.equal(layer(x), stock)  # the step is over
    assert packed.shape == stock.shape and packed.dtype == torch.float32
    torch.testing.assert_close(packed, stock, rtol=1e-5, atol=1e-5)
    # the rows are independent of the batch they come in (one row alone gives the same values)
    with torch.no_grad(), linear.active():
        torch.testing.assert_close(layer(x[1, 2:3]), packed[1, 2:3], rtol=1e-6, atol=1e-6)


def test_every_float32_linear_of_a_model_once():
    model = tiny_llama(seed=3)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linear.install(model) == len(linears) > 0
    forwards = [m.forward for m in linears]
    assert linear.install(model) == len(linears)  # installing again keeps the packed weights
    assert [m.forward for m in linears] == forwards
    ids = torch.tensor([[5, 9, 2, 7]])
    with torch.no_grad():
        stock = model(ids).logits
        with linear.active():
            packed = model(ids).logits
    torch.testing.assert_close(packed, stock, rtol=1e-4, atol=1e-4)
    assert torch.equal(packed.argmax(-1), stock.argmax(-1))


def test_the_executor_uses_them_on_cpu_float32_only():
    assert TorchExecutor(tiny_llama(seed=4)).describe()["linear"] == "onednn"
    assert not linear.available(torch.device("cpu"), torch.bfloat16)
    assert TorchExecutor(tiny_llama(seed=4).to(torch.bfloat16)).describe()["linear"] == "torch"
