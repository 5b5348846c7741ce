"""The same-step swap case on the torch executor (issue 35): a request admitted on a hit of blocks
that its step computes, and preempted in that step, must never carry unwritten KV to the host. Every
request's logprobs equal a teacher-forced Hugging Face forward of its tokens (float32, eager
attention) on a seeded random tiny Llama, and the KV shadow finds no wrong read. Before the
pending-slot rule (`metroline.kv_backends.pending`) the victim's logprobs were off (by up to 1.38
on the random configuration) while the other requests matched."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_same_step_prefix import WEIGHTED_FAIR_SWAP, same_step_swap_engine  # noqa: E402
from torch_helpers import Argmax, logprob_errors, tiny_llama  # noqa: E402

from metroline.core.conformance.kv_chaos import Scenario, run_scenario  # noqa: E402
from metroline.core.conformance.kv_shadow import KVShadow  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402

GREEDY = {"temperature": 0.0, "ignore_eos": True, "logprobs": 0}
TOLERANCE = 1e-4
"""The logprob tolerance of the real-model parity tests (`test_serve_real_model.py`)."""


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def reference():
    """The same weights (the same seed), for HF's own forward."""
    return tiny_llama(seed=0)


def test_the_three_request_reproducer_matches_hf_logprobs(model, reference):
    shadow = KVShadow(TorchExecutor(model))
    engine = shadow.attach(same_step_swap_engine(shadow, plugins=[Argmax()], **GREEDY))
    engine.step()
    b = engine.sequences("b")[0]
    assert engine.scheduler.total_preemptions == 1 and b in engine.scheduler.waiting  # recomputed, not swapped
    while engine.has_unfinished():
        engine.step()
    shadow.check_drained()
    assert shadow.errors == []
    seqs = [engine.sequences(r)[0] for r in "abc"]
    assert [s.num_output_tokens for s in seqs] == [2, 2, 2]
    gaps = logprob_errors(reference, seqs)
    assert max(gaps.values()) <= TOLERANCE, gaps


def test_the_shipped_policy_random_configuration_matches_hf_logprobs(model, reference):
    scenario = Scenario.from_json(WEIGHTED_FAIR_SWAP.read_text())
    for _, req in scenario.requests:
        req["sampling"].update(GREEDY)
    outcome = run_scenario(scenario, inner=TorchExecutor(model), engine_plugins=[Argmax()])
    assert outcome.errors == []
    engine = outcome.engine
    seqs = [s for _, req in scenario.requests for s in engine.sequences(req["request_id"])]
    assert len(seqs) == 14  # r0 has 3 samples, r3, r9 and r16 two each
    assert engine.sequences("r16")[0].num_preemptions >= 1
    gaps = logprob_errors(reference, seqs)
    assert max(gaps.values()) <= TOLERANCE, gaps
