"""`least_computed`: under KV pressure the victim is the running request with the fewest computed
tokens, and the recompute tax (`summary.recompute_tax`) counts what each victim choice wastes.

The scenario, derived by hand (block size 4, 6 blocks, prefix caching off, no budget limit that
matters): A (12-token prompt), B (3) and C (7) arrive together, each generating 2 tokens. Step 1
admits all three (3 + 1 + 2 = 6 blocks) and prefills 22 tokens. In step 2 A's decode (position
12) needs a fourth block and none is free:

- fcfs (vLLM's default victim, the request admitted last) preempts C, which had computed 7
  tokens; A and B decode (2 tokens) and finish; step 3 recomputes C's 7 prompt tokens plus its
  sampled token (8). Computed: 22 + 2 + 8 = 32 tokens, 7 of them recomputed: tax 7/32.
- least_computed preempts B (3 computed, against A's 12 and C's 7); A and C decode (2 tokens) and
  finish; step 3 recomputes B's 3 prompt tokens plus its sampled token (4). Computed: 22 + 2 + 4
  = 28, 3 recomputed: tax 3/28.
"""

from __future__ import annotations

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.manager import PluginManager
from metroline.core.workloads.build import Workload, WorkloadItem
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.plugins_contrib.least_computed import LeastComputed, least_computed


class Victims:
    name = "victims"

    def __init__(self) -> None:
        self.seen = []

    @hookimpl
    def on_preempted(self, ctx, seqs) -> None:
        self.seen.extend((ctx.step, NAMES[s.request_id], s.num_lost_tokens) for s in seqs)


NAMES = {"0": "A", "1": "B", "2": "C"}  # a replay names its requests by their index


def three_prompts() -> Workload:
    return Workload("abc", [WorkloadItem(0.0, (((name,), n),), 2) for name, n in (("A", 12), ("B", 3), ("C", 7))])


def run(plugins: list[str], **config):
    fields = {"block_size": 4, "num_blocks": 6, "max_num_seqs": 8, "max_num_batched_tokens": 64,
              "enable_prefix_caching": False, **config}
    cfg = EngineConfig(policy="fcfs", plugins=plugins, **fields)
    victims = Victims()
    doc, _ = run_workload(three_prompts(), cfg, SimulatedExecutor(make_cost_model("steps", step_time=0.01)),
                          plugins=[victims])
    return doc["summary"], victims.seen


@pytest.mark.parametrize("preset", [None, "vllm"])
def test_fcfs_preempts_the_last_admitted_and_pays_7_of_32(preset):
    summary, victims = run([], preset=preset, enable_prefix_caching=False)
    assert victims == [(2, "C", 7)]
    assert summary["steps"] == 3
    assert summary["recomputed_tokens"] == 7
    assert summary["recompute_tax"] == 7 / 32


@pytest.mark.parametrize("preset", [None, "vllm"])
def test_least_computed_preempts_the_least_computed_and_pays_3_of_28(preset):
    summary, victims = run(["least_computed"], preset=preset, enable_prefix_caching=False)
    assert victims == [(2, "B", 3)]
    assert summary["steps"] == 3
    assert summary["recomputed_tokens"] == 3
    assert summary["recompute_tax"] == 3 / 28


def test_without_pressure_nothing_is_recomputed_and_the_tax_is_zero():
    summary, victims = run([], num_blocks=64)
    assert victims == []
    assert summary["recomputed_tokens"] == 0
    assert summary["recompute_tax"] == 0.0


class Seq:
    def __init__(self, computed: int, admitted: int) -> None:
        self.num_computed_tokens, self.admitted_seq_no = computed, admitted


def test_least_computed_breaks_ties_by_the_last_admitted():
    a, b, c = Seq(5, 1), Seq(3, 2), Seq(3, 3)
    assert least_computed([a, b, c]) is c
    assert least_computed([a, b]) is b
    assert least_computed([]) is None


