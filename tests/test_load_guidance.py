"""The README's load guidance is the one the load check gives today
(`metroline.core.experiments.load_guidance`): each row reruns its case and must be the README's
row, so a change to the check, the cost models, the engine's defaults or a workload that moves a
figure fails here until `python -m metroline.core.experiments.load_guidance --write` is run."""

from __future__ import annotations

from pathlib import Path

import pytest

from metroline.core.workloads.items import WorkloadError
from metroline.core.experiments import load_check, load_guidance
from metroline.core.workloads.traces import find_traces_dir

README = (Path(__file__).parents[1] / load_guidance.DOCUMENT).read_text()


def readme_rows() -> list[str]:
    return load_guidance.block(README).split(load_guidance.HEADER)[1].strip("\n").splitlines()


def test_the_block_is_the_generated_preamble_and_header_with_one_row_per_case_in_order():
    block = load_guidance.block(README)
    assert block.startswith(load_guidance.preamble() + "\n\n" + load_guidance.HEADER + "\n")
    rows = readme_rows()
    assert [r.split("`")[1] for r in rows] == [c.flags() for c in load_guidance.CASES]
    # the generated text of a block equals the block: rewriting with the README's own rows changes nothing
    assert load_guidance.rewritten(README, rows) == README


def test_a_row_says_what_the_check_says():
    case = load_guidance.Case("chat", 10, "steps", 2.0)
    light = {"kind": "light", "offered_rate_req_s": 4.0, "capacity_req_s": 40.0, "load": 0.1, "binding": "kv_use",
             "utilisation": 0.1, "queued_share": 0.0, "suggested_rate_scale": 19.0}
    found = {"kind": "light", "runs": {"fcfs": light}}
    assert load_guidance.row(case, found) == (
        "| `--workload chat --max-requests 10 --cost-model steps --rate-scale 2` | 4 | 40 | 0.10 x | kv 10% | 0% | "
        "light: `--rate-scale 19` |")
    short = {"kind": "short", "runs": {"fcfs": {"kind": "short", "span_s": 1.5, "service_s": 2.0}}}
    assert load_guidance.row(case, short).endswith(
        f"| short: arrivals span 1.5 s, under {load_check.STEADY_SPANS:g} x the mean service time (2 s) |")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(load_guidance.CASES)),
                         ids=[c.flags().replace(" ", "") for c in load_guidance.CASES])
def test_each_row_is_what_the_load_check_says_today(index):
    case = load_guidance.CASES[index]
    if case.on_trace:
        try:
            find_traces_dir()
        except WorkloadError:
            pytest.skip("no traces directory (../shared/traces or $METROLINE_TRACES)")
    assert readme_rows()[index] == load_guidance.row(case, load_guidance.measure(case)), (
        "the README's load guidance is stale: python -m metroline.core.experiments.load_guidance --write")
