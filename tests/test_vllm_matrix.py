"""The referee matrix (`bench/vllm_matrix.py`): `--preset vllm` against schedules recorded from
vLLM 0.33's own v1 scheduler on the Azure conversation, Azure code and Mooncake traces, at budgets
256, 512 and 2,048, pools with and without preemption, fcfs and priority, the chunk cap off and
on, prefix caching on and off. Every request's first-scheduled, first-token and finish times must
be bit-equal, and the preemption and step counts equal. The traces live in the shared folder: the
tests skip without them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from metroline.core.workloads.items import WorkloadError
from metroline.core.workloads.traces import find_traces_dir

BENCH = Path(__file__).resolve().parent.parent / "bench" / "vllm_matrix.py"
_spec = importlib.util.spec_from_file_location("vllm_matrix", BENCH)
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)

RECORDING = json.loads(matrix.RECORDING.read_text())["cells"]
NAMES = [matrix.cell_name(r["cell"]) for r in RECORDING]
# one cell of each trace that preempts, under each policy, with the chunk cap (the rest: --runslow)
QUICK = {"azure-conv-256-tight-fcfs-chunk-prefix", "azure-code-512-tight-priority-chunk-prefix",
         "mooncake-2048-tight-priority-chunk-noprefix", "mooncake-256-tight-fcfs-nochunk-prefix"}


def traces_dir() -> Path:
    try:
        return find_traces_dir()
    except WorkloadError:
        pytest.skip("the traces folder (../shared/traces or $METROLINE_TRACES) is absent")


def test_the_matrix_is_recorded_whole_and_preempts_where_the_pool_is_tight():
    assert sorted(NAMES) == sorted(matrix.cell_name(c) for c in matrix.cells())
    assert len(NAMES) == 3 * 3 * 2 * 2 * 2 * 2
    # every trace preempts under both policies in the tight pool (not in every cell: without the
    # chunk cap, the whole-prompt gate keeps some from it)
    for trace in matrix.TRACES:
        for policy in ("fcfs", "priority"):
            assert any(r["preemptions"] > 0 for r in RECORDING if r["cell"]["pool"] == "tight"
                       and (r["cell"]["trace"], r["cell"]["policy"]) == (trace, policy))
    assert all(r["preemptions"] == 0 for r in RECORDING if r["cell"]["pool"] == "roomy")
    priorities = [r["priorities"] for r in RECORDING if r["cell"]["policy"] == "priority"]
    assert priorities and all(set(p) == {0, 1, 2} for p in priorities)


def check(recording: dict) -> None:
    matrix.check_identical(recording, traces_dir())


@pytest.mark.parametrize("recording", [r for r, n in zip(RECORDING, NAMES) if n in QUICK],
                         ids=[n for n in NAMES if n in QUICK])
def test_a_cell_of_each_kind_is_identical_to_vllm(recording):
    check(recording)


@pytest.mark.slow
@pytest.mark.parametrize("recording", RECORDING, ids=NAMES)
def test_every_cell_of_the_matrix_is_identical_to_vllm(recording):
    check(recording)
