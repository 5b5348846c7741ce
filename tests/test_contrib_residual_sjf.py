"""`residual_sjf`: srpt whose prefill work is what the prefix cache does not hold, aged by the
wait. Orders derived by hand on one slot (`max_num_seqs = 1`), the `steps` cost model (0.01 s a
step) and true output lengths as hints (`oracle_lengths`)."""

from __future__ import annotations

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.workloads.build import Workload, WorkloadItem
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.plugins_contrib.residual_sjf import ResidualSJF


class Admissions:
    name = "admissions"

    def __init__(self, names: dict[str, str]) -> None:
        self.names, self.order = names, []

    @hookimpl
    def on_admitted(self, seqs) -> None:
        self.order.extend(self.names[s.request_id] for s in seqs)


def admission_order(policy: str, items: list[tuple[str, WorkloadItem]], options: dict) -> list[str]:
    names = {str(i): name for i, (name, _) in enumerate(items)}
    log = Admissions(names)
    cfg = EngineConfig(policy=policy, max_num_seqs=1, block_size=4, num_blocks=64, max_num_batched_tokens=64,
                       plugin_options={policy: options})
    doc, _ = run_workload(Workload("hand", [item for _, item in items]), cfg,
                          SimulatedExecutor(make_cost_model("steps", step_time=0.01)), plugins=[log],
                          oracle_lengths=True)
    assert doc["summary"]["completed"] == len(items)
    return log.order


def warm_and_cold():
    """W (t = 0, prompt P of 16 tokens, 1 output token) leaves P's 4 blocks in the prefix cache
    after step 1. At t = 0.005 X (P + 4 own tokens, 4 output tokens) and Y (10 own tokens, 4 output
    tokens) arrive. With prefill_weight 1: srpt's remaining work is X 20 + 4 = 24, Y 10 + 4 = 14, so
    Y goes first; the residual leaves out X's 16 cached tokens (a lookup covers at most 19 of its 20
    tokens: 4 whole blocks), X 24 - 16 = 8 < Y 14, so X goes first."""
    return [
        ("W", WorkloadItem(0.0, (("P", 16),), 1)),
        ("X", WorkloadItem(0.005, (("P", 16), ("X", 4)), 4)),
        ("Y", WorkloadItem(0.005, (("Y", 10),), 4)),
    ]


def test_srpt_counts_the_whole_prompt():
    assert admission_order("srpt", warm_and_cold(), {"prefill_weight": 1.0}) == ["W", "Y", "X"]


def test_the_residual_leaves_out_the_cached_prefix():
    options = {"prefill_weight": 1.0, "aging_rate": 0.0}
    assert admission_order("residual_sjf", warm_and_cold(), options) == ["W", "X", "Y"]
    assert admission_order("residual_sjf", warm_and_cold(), {**options, "cache_aware": False}) == ["W", "Y", "X"]


def long_and_shorts():
    """B (t = 0, 100 output tokens) holds the one slot until t = 1.0 s. Meanwhile Q (t = 0.1, 50
    output tokens), S1 (t = 0.2, 10) and S2 (t = 0.6, 10) wait. prefill_weight 0: the residual is
    the output. Keys residual + aging_rate x arrival with aging_rate 100: Q 50 + 10 = 60, S1 10 + 20
    = 30, S2 10 + 60 = 70, so S1, Q, S2 (S2 arrived 0.5 s after Q, more than (50 - 10) / 100 =
    0.4 s, and does not overtake it). Without aging: S1, S2, Q."""
    return [
        ("B", WorkloadItem(0.0, (("B", 4),), 100)),
        ("Q", WorkloadItem(0.1, (("Q", 4),), 50)),
        ("S1", WorkloadItem(0.2, (("S1", 4),), 10)),
        ("S2", WorkloadItem(0.6, (("S2", 4),), 10)),
    ]


def test_aging_bounds_how_late_an_overtaker_may_arrive():
    assert admission_order("residual_sjf", long_and_shorts(), {"prefill_weight": 0.0, "aging_rate": 100.0}) == [
        "B", "S1", "Q", "S2"]
    assert admission_order("residual_sjf", long_and_shorts(), {"prefill_weight": 0.0, "aging_rate": 0.0}) == [
        "B", "S1", "S2", "Q"]
    assert admission_order("srpt", long_and_shorts(), {"prefill_weight": 0.0}) == ["B", "S1", "S2", "Q"]


def test_options_are_srpts_and_its_own():
    plugin = ResidualSJF(max_wait_s=5.0, aging_rate=2.5, cache_aware=False)
    assert (plugin.max_wait_s, plugin.aging_rate, plugin.cache_aware) == (5.0, 2.5, False)
    with pytest.raises(ValueError, match=r"plugin 'residual_sjf': option 'aging_rate'.*greater than or equal to 0"):
        ResidualSJF(aging_rate=-1.0)
