"""core/parallel.run_grid: every config on every workload in one pool of workers; the documents
equal those of running each one here, one by one (but `wall_s`), at `docs[workload][config]`."""

from __future__ import annotations

from metroline.core.config import EngineConfig
from metroline.core.horizon import MeasurementWindow
from metroline.core.parallel import run_grid, run_workloads
from metroline.core.workloads import build_workload
from metroline.executors.registry import simulated
from test_compare_parallel import without_wall_time


def test_a_grid_of_workloads_and_configs_equals_the_runs_one_by_one():
    workloads = [build_workload("chat", seed=s, max_requests=60) for s in (0, 1)]
    configs = [EngineConfig(policy=p, max_num_seqs=16) for p in ("fcfs", "srpt", "priority")]
    window = MeasurementWindow(warmup_s=0.2, horizon_s=1.0)
    grid = run_grid(workloads, configs, lambda: simulated("steps"), jobs=2, measure=window)
    assert [len(row) for row in grid] == [3, 3]
    for w, row in zip(workloads, grid):
        alone = run_workloads(w, configs, lambda: simulated("steps"), jobs=1, measure=window)
        assert without_wall_time(row) == without_wall_time(alone)
        assert [d["policy"] for d in row] == ["fcfs", "srpt", "priority"]
        assert all(d["measurement"] == {"warmup_s": 0.2, "horizon_s": 1.0} for d in row)
    assert without_wall_time(grid[0]) != without_wall_time(grid[1])  # two different draws
