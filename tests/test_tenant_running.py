"""Per-tenant preemptions and running counts: the result document's `tenants` section, the
summary table and the steps CSV agree with what an observer counts step by step."""

from __future__ import annotations

import csv

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.results.files import write_steps_csv
from metroline.core.results.report import format_summary_table
from metroline.core.workloads.items import Workload, WorkloadItem
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

BLOCK = 16


class TenantSpy:
    """After each executed step: each tenant's running sequences, and its preempted ones."""

    name = "tenant_spy"

    def __init__(self) -> None:
        self.running: list[dict[str, int]] = []
        self.preempted: dict[str, int] = {}

    @hookimpl
    def on_step_end(self, ctx, plan) -> None:
        if plan.is_empty:  # an empty step is not recorded
            return
        counts: dict[str, int] = {}
        for seq in ctx.running:
            counts[seq.tenant] = counts.get(seq.tenant, 0) + 1
        self.running.append(counts)
        for seq in plan.preempted:
            self.preempted[seq.tenant] = self.preempted.get(seq.tenant, 0) + 1


def tight_two_tenant_run():
    """Two tenants, two slots, a pool too small for two long requests: one must be preempted."""
    items = [
        WorkloadItem(0.0, ((("t", "a0"), 2 * BLOCK),), 6 * BLOCK, "alpha"),
        WorkloadItem(0.0, ((("t", "b0"), 2 * BLOCK),), 6 * BLOCK, "beta"),
        WorkloadItem(0.5, ((("t", "a1"), BLOCK),), 4, "alpha"),
        WorkloadItem(0.5, ((("t", "b1"), BLOCK),), 4, "beta"),
    ]
    # each long request needs 8 blocks at its end; 12 hold both only until they grow past 6 each
    cfg = EngineConfig(num_blocks=12, block_size=BLOCK, max_num_seqs=2, policy="fcfs", enable_prefix_caching=False)
    spy = TenantSpy()
    doc, engine = run_workload(Workload("two-tenants", items), cfg, SimulatedExecutor(make_cost_model("steps")),
                               plugins=[spy])
    return doc, engine, spy


def test_tenant_running_counts_and_preemptions_match_an_observer(tmp_path):
    doc, engine, spy = tight_two_tenant_run()
    assert doc["summary"]["completed"] == 4
    assert sum(spy.preempted.values()) > 0  # the pool forces a preemption
    steps = engine.metrics.running_by_tenant
    assert len(steps) == len(engine.metrics.steps) == len(spy.running)
    assert [dict(c) for c in steps] == spy.running
    for tenant in ("alpha", "beta"):
        t = doc["tenants"][tenant]
        per_step = [c.get(tenant, 0) for c in spy.running]
        assert t["preemptions"] == spy.preempted.get(tenant, 0)
        assert t["running_max"] == max(per_step) <= 2
        assert abs(t["running_mean"] - sum(per_step) / len(per_step)) < 1e-12
    # the two tenants' running counts add up to the step log's running column
    assert all(sum(c.values()) == s[7] for c, s in zip(steps, engine.metrics.steps))

    row = next(line for line in format_summary_table(doc).splitlines() if line.strip().startswith("alpha"))
    alpha = doc["tenants"]["alpha"]
    assert row.split()[-3:] == [str(alpha["preemptions"]), f"{alpha['running_mean']:.2f}", str(alpha["running_max"])]

    path = tmp_path / "steps.csv"
    write_steps_csv(path, engine.metrics.steps, steps, ["alpha", "beta"])
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["running[alpha]"]) for r in rows] == [c.get("alpha", 0) for c in spy.running]
    assert all(int(r["running[alpha]"]) + int(r["running[beta]"]) == int(r["running"]) for r in rows)


def test_one_tenant_runs_everything():
    items = [WorkloadItem(0.1 * i, ((("one", i), BLOCK),), 8, "solo") for i in range(6)]
    cfg = EngineConfig(num_blocks=64, block_size=BLOCK, max_num_seqs=2, policy="fcfs")
    doc, engine = run_workload(Workload("one-tenant", items), cfg, SimulatedExecutor(make_cost_model("steps")))
    running = [s[7] for s in engine.metrics.steps]
    assert [c.get("solo", 0) for c in engine.metrics.running_by_tenant] == running
    assert doc["tenants"]["solo"]["running_max"] == max(running)
