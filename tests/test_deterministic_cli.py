"""The deterministic mode through the commands: `compare` on the torch executor checks that the
policies produced the same outputs per request, and a 300-request offline run of the Azure
conversation trace writes, under fcfs and under srpt, the same outputs line for every request, byte
for byte (a tiny random Llama: the point is the schedule, not the model)."""

from __future__ import annotations

import json

import pytest
from torch_helpers import tiny_llama

from metroline.cli import main
from metroline.core.workloads.build import WorkloadError, find_traces_dir

TINY_RUN = ["--executor", "torch", "--kv-memory", str(1 / 256), "--deterministic"]
TRACE_REQUESTS = 300
"""Requests of the trace run under each policy: nearly five times the 64 slots, so most of them wait
and the two policies order them differently, and 2.4 times the 512 KV blocks' worth of tokens
(1,222 blocks of 16: the pool's blocks are released and reused over and over). It ran 1,000 before
(3 times the CPU: 41.5 s against 13.9 s for both runs), neither preempting, with no kind of
step that these 300 lack."""


@pytest.fixture
def folder(tmp_path):
    tiny_llama().save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


def test_compare_says_the_policies_outputs_are_identical(folder, tmp_path, capsys):
    out_json = tmp_path / "cmp.json"
    argv = ["compare", *TINY_RUN, "--model", folder, "--policies", "fcfs,srpt", "--workload", "mixed-64",
            "--groups", "1", "--length-scale", "0.1", "--max-requests", "12", "--json", str(out_json)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "deterministic: every policy produced identical outputs for all 12 requests" in out
    (row,) = [line for line in out.splitlines() if line.strip("│┃ ").startswith("outputs")]
    assert "reference (12)" in row and "identical" in row
    doc = json.loads(out_json.read_text())
    assert doc["outputs_check"]["identical"] is True and doc["outputs_check"]["requests"] == 12
    fcfs, srpt = (run["output_digests"] for run in doc["runs"])
    assert fcfs == srpt and len(fcfs) == 12
    assert all(run["executor"]["deterministic"] for run in doc["runs"])


def lines_by_id(path) -> dict[str, bytes]:
    lines = path.read_bytes().splitlines()
    return {json.loads(line)["id"]: line for line in lines}


@pytest.mark.slow
def test_hundreds_of_requests_of_a_trace_identical_under_fcfs_and_srpt(folder, tmp_path):
    """The trace's first `TRACE_REQUESTS` requests with their arrival gaps divided by 10^9 (all
    within a microsecond of the start, on the torch executor's wall clock): every one is waiting
    before the first step ends whatever the machine's speed, so with 64 slots fcfs and srpt admit
    in other orders on any host (at 1,000x the gaps spanned 0.2 s, and a machine fast enough to keep
    up would have left the policies nothing to order)."""
    try:
        find_traces_dir()
    except WorkloadError:
        pytest.skip("no traces directory (../shared/traces or $METROLINE_TRACES)")
    files = {}
    for policy in ("fcfs", "srpt"):
        files[policy] = tmp_path / f"{policy}.jsonl"
        argv = ["run", *TINY_RUN, "--model", folder, "--policy", policy, "--workload", "azure-conv",
                "--max-requests", str(TRACE_REQUESTS), "--length-scale", "0.05", "--rate-scale", "1e9", "--max-num-seqs", "64",
                "--outputs", str(files[policy])]
        assert main(argv) == 0
    fcfs, srpt = lines_by_id(files["fcfs"]), lines_by_id(files["srpt"])
    assert len(fcfs) == TRACE_REQUESTS and fcfs.keys() == srpt.keys()
    assert [rid for rid in fcfs if fcfs[rid] != srpt[rid]] == []
    assert files["fcfs"].read_bytes() != files["srpt"].read_bytes()  # finishing orders differ: the schedules do
