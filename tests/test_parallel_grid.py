"""core/parallel.run_many over several workloads (what `compare --seeds` runs), with a measurement
window: the documents in worker processes equal those of running each one here, one by one (but
`wall_s`), in the order of the runs."""

from __future__ import annotations

from test_compare_parallel import without_wall_time

from metroline.core.config import EngineConfig
from metroline.core.experiments.parallel import run_many, run_workloads
from metroline.core.results.horizon import MeasurementWindow
from metroline.core.workloads.build import build_workload
from metroline.executors.registry import simulated


def test_runs_on_several_workloads_in_workers_equal_the_runs_one_by_one():
    workloads = [build_workload("chat", seed=s, max_requests=60) for s in (0, 1)]
    configs = [EngineConfig(policy=p, max_num_seqs=16) for p in ("fcfs", "srpt", "priority")]
    window = MeasurementWindow(warmup_s=0.2, horizon_s=1.0)
    runs = [(w, c) for w in workloads for c in configs]
    docs = [doc for doc, _ in run_many(runs, lambda: simulated("steps"), jobs=2, measure=window)]
    assert [d["policy"] for d in docs] == ["fcfs", "srpt", "priority"] * 2
    for i, w in enumerate(workloads):
        alone = run_workloads(w, configs, lambda: simulated("steps"), jobs=1, measure=window)
        assert without_wall_time(docs[3 * i:3 * i + 3]) == without_wall_time(alone)
    assert all(d["measurement"] == {"warmup_s": 0.2, "horizon_s": 1.0} for d in docs)
    assert without_wall_time(docs[:3]) != without_wall_time(docs[3:])  # two different draws
