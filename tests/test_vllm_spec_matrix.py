"""The speculative referee matrix (`bench/vllm_spec_matrix.py`): `--preset vllm` with speculative
decoding against schedules recorded from vLLM 0.33's own v1 scheduler with the same
`speculative_config` (n-gram, 2 and 5 drafts), its fake model runner accepting as many drafts per
request and step as metroline's acceptance model: the built-in chat and shared-prefix workloads,
budgets 256, 512 and 2,048, pools with and without preemption, fcfs and priority, prefix caching
on and off. Every request's first-scheduled, first-token and finish times must be bit-equal, and
the preemption and step counts equal. No vLLM is needed: the recording is in tests/data/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))  # vllm_spec_matrix imports vllm_matrix beside it
_spec = importlib.util.spec_from_file_location("vllm_spec_matrix", BENCH / "vllm_spec_matrix.py")
spec_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spec_matrix)
matrix = spec_matrix.matrix

RECORDING = json.loads(spec_matrix.RECORDING.read_text())["cells"]
NAMES = [spec_matrix.cell_name(r["cell"]) for r in RECORDING]
# a preempting cell of each workload and policy, both draft counts, prefix caching on and off, and
# one that pads an admission (the rest: --runslow)
QUICK = {"chat-256-tight-k5-fcfs-prefix", "chat-512-tight-k2-priority-noprefix",
         "shared-prefix-2048-tight-k2-fcfs-prefix", "shared-prefix-512-tight-k5-priority-prefix"}


def test_the_matrix_is_recorded_whole_with_drafts_preemptions_and_padding():
    assert sorted(NAMES) == sorted(spec_matrix.cell_name(c) for c in spec_matrix.cells())
    assert len(NAMES) == 2 * 3 * 2 * 2 * 2 * 2
    for rec in RECORDING:
        drafts, k = rec["drafts"], rec["engine"]["speculative_config"]["num_speculative_tokens"]
        # drafts were verified, some accepted, some rejected
        assert 0 < drafts["num_accepted_tokens"] < drafts["num_draft_tokens"]
        assert drafts["num_padding_drafts"] % k == 0
    tight_prefix = [r for r in RECORDING if r["cell"]["pool"] == "tight" and r["cell"]["prefix"]]
    assert all(r["preemptions"] > 0 for r in tight_prefix)
    assert all(r["preemptions"] == 0 for r in RECORDING if r["cell"]["pool"] == "roomy")
    assert any(r["drafts"]["num_padding_drafts"] for r in RECORDING if spec_matrix.cell_name(r["cell"]) in QUICK)
    assert all(r["preemptions"] > 0 for r in RECORDING if spec_matrix.cell_name(r["cell"]) in QUICK)


def check(recording: dict) -> None:
    summary = matrix.check_identical(recording)
    # the same drafts were scheduled: vLLM's verified drafts and its padding (never accepted)
    drafts = recording["drafts"]
    assert summary["speculation"]["num_draft_tokens"] == drafts["num_draft_tokens"] + drafts["num_padding_drafts"]


@pytest.mark.parametrize("recording", [r for r, n in zip(RECORDING, NAMES) if n in QUICK],
                         ids=[n for n in NAMES if n in QUICK])
def test_a_cell_of_each_kind_is_identical_to_vllm(recording):
    check(recording)


@pytest.mark.slow
@pytest.mark.parametrize("recording", RECORDING, ids=NAMES)
def test_every_cell_of_the_matrix_is_identical_to_vllm(recording):
    check(recording)


def test_drafts_that_never_preempt_depart_from_vllm():
    # the preset's speculative_scheduling is what keeps these schedules identical: metroline's
    # lean rules (drafts never preempt, cut at max_tokens, rejected blocks freed) schedule otherwise
    recording = next(r for r, n in zip(RECORDING, NAMES) if n == "chat-256-tight-k5-fcfs-prefix")
    summary, times = matrix.replay_metroline(recording, speculative_scheduling="lean")
    want = matrix.recorded_times(recording)
    assert sum(times[rid] != want[rid] for rid in want) > 0


def test_an_admission_one_token_short_of_decoding_is_padded_as_vllm_pads_it(monkeypatch):
    # the cell's one padded admission (vLLM: 5 drafts of -1, never accepted): metroline schedules
    # the 5 too; without `Speculation.padding` its drafts are exactly vLLM's unpadded ones
    from metroline.core.step.speculation import Speculation

    recording = next(r for r, n in zip(RECORDING, NAMES) if n == "chat-256-tight-k5-fcfs-prefix")
    drafts = recording["drafts"]
    assert drafts["num_padding_drafts"] == 5
    padded, _ = matrix.replay_metroline(recording)
    monkeypatch.setattr(Speculation, "padding", lambda self, seq, step: 0)
    unpadded, _ = matrix.replay_metroline(recording)
    assert padded["speculation"]["num_draft_tokens"] == drafts["num_draft_tokens"] + 5
    assert unpadded["speculation"]["num_draft_tokens"] == drafts["num_draft_tokens"]
    assert padded["speculation"]["num_accepted_tokens"] == unpadded["speculation"]["num_accepted_tokens"]
