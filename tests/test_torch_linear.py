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


@pytest.fixture
def restore_min_rows():
    before = linear.min_rows()
    yield
    linear.set_min_rows(before)


def test_the_kernel_follows_the_row_count(restore_min_rows):
    """Below `min_rows()` rows a call inside a step is `F.linear` bit for bit; from it on, oneDNN's
    packed kernel bit for bit (the same call made directly)."""
    torch.manual_seed(1)
    layer = torch.nn.Linear(40, 24)
    linear.install(layer)
    forward = layer.__dict__["forward"]
    linear.set_min_rows(3)
    with torch.no_grad(), linear.active():
        for rows in (1, 2, 3, 5):
            x = torch.randn(1, rows, 40)
            expected = F.linear(x, layer.weight, layer.bias) if rows < 3 else forward.onednn(x)
            assert torch.equal(layer(x), expected), rows
    with pytest.raises(ValueError, match="at least 1"):
        linear.set_min_rows(0)


@pytest.mark.parametrize("timings, rows", [
    ({1: (1.0, 2.0), 2: (2.0, 1.0), 4: (3.0, 2.0), 8: (4.0, 3.0), 16: (5.0, 4.0)}, 2),
    ({1: (1.0, 0.5), 2: (2.0, 1.0), 4: (3.0, 2.0)}, 1),
    # a torch win at 4 after a oneDNN win at 2: oneDNN only from 8 on
    ({1: (1.0, 2.0), 2: (2.0, 1.0), 4: (2.0, 2.5), 8: (4.0, 3.0)}, 8),
    ({1: (1.0, 2.0), 2: (1.0, 2.0), 4: (1.0, 2.0)}, 8),  # torch everywhere measured: past the last
])
def test_the_crossover_is_where_onednn_wins_from_then_on(timings, rows):
    assert linear.crossover(timings) == rows


def test_calibrate_measures_once_then_reads_the_cache(tmp_path, monkeypatch, restore_min_rows):
    monkeypatch.delenv(linear.MIN_ROWS_ENV, raising=False)
    model = tiny_llama(seed=5)
    linear.install(model)
    rows = linear.calibrate(model, tmp_path)
    assert rows == linear.min_rows() and rows in (1, 2, 4, 8, 16, 32)
    import json

    cache = json.loads((tmp_path / "linear-rows.json").read_text())
    key = linear.cache_key(linear.forwards(model))
    assert list(cache) == [key] and cache[key]["min_rows"] == rows
    assert sorted(map(int, cache[key]["seconds"])) == list(linear.ROW_COUNTS)
    cache[key]["min_rows"] = 7  # a cached value is taken as it is: no second measurement
    (tmp_path / "linear-rows.json").write_text(json.dumps(cache))
    monkeypatch.setattr(linear, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert linear.calibrate(model, tmp_path) == 7 == linear.min_rows()
    monkeypatch.setenv(linear.MIN_ROWS_ENV, "3")  # the environment overrides the cache
    assert linear.calibrate(model, tmp_path) == 3 == linear.min_rows()
    monkeypatch.setenv(linear.MIN_ROWS_ENV, "0")
    with pytest.raises(ValueError, match="METROLINE_LINEAR_MIN_ROWS=0: at least 1"):
        linear.calibrate(model, tmp_path)
