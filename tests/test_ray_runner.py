"""`--ray`: runs as tasks of a Ray cluster (here a local instance of 2 CPUs) give the very result
documents local runs give (every field but the host's wall clock and the command line in the
manifest), in the order asked; a run's error names its policy. Skipped without ray installed."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray")

from metroline import cli  # noqa: E402
from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.experiments.parallel import run_many  # noqa: E402
from metroline.core.experiments.replay_check import without_wall_clock  # noqa: E402
from metroline.core.experiments.run_series import series_of  # noqa: E402
from metroline.core.workloads.build import build_workload  # noqa: E402
from metroline.executors.registry import make_executor  # noqa: E402

# a pool small enough to preempt, three tenants, two priority classes: the policies differ
ARGS = ["--workload", "chat", "--max-requests", "160", "--max-num-seqs", "32", "--num-blocks", "500", "--no-progress"]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_run_many_on_ray_equals_local_runs_in_order():
    workload = build_workload("chat", seed=3, max_requests=120)
    runs = [(workload, EngineConfig(policy=p, num_blocks=500)) for p in ("fcfs", "srpt", "token_rr")]
    runs.append((build_workload("chat", seed=3, max_requests=120, rate_scale=2.0), EngineConfig(policy="fcfs")))

    def executor():
        return make_executor("sim", cost_model="roofline")

    local = run_many(runs, executor, extract=series_of, jobs=1)
    remote = run_many(runs, executor, extract=series_of, ray="")
    assert [d["policy"] for d, _ in remote] == ["fcfs", "srpt", "token_rr", "fcfs"]
    assert len({json.dumps(without_wall_clock(d["summary"]), sort_keys=True) for d, _ in local}) == 4
    assert without_wall_clock([d for d, _ in remote]) == without_wall_clock([d for d, _ in local])
    for (_, a), (_, b) in zip(local, remote):  # what `extract` returned crossed back whole
        assert len(a.records) == len(b.records) == 120
        assert [r.finish_s for r in a.records] == [r.finish_s for r in b.records]


def test_compare_with_ray_writes_the_document_of_local_processes(tmp_path):
    docs = {}
    for name, flags in (("local", ["--jobs", "2"]), ("ray", ["--ray"])):
        path = tmp_path / f"{name}.json"
        assert cli.main(["compare", "--policies", "fcfs,srpt,priority", *ARGS, "--json", str(path), *flags]) == 0
        docs[name] = json.loads(path.read_text())
    assert docs["ray"]["runs"][0]["summary"]["preemptions"] > 0
    commands = [docs[name]["manifest"].pop("command")["argv"] for name in ("local", "ray")]
    assert commands[0][-2:] == ["--jobs", "2"] and commands[1][-1] == "--ray"
    assert without_wall_clock(docs["ray"]) == without_wall_clock(docs["local"])


def test_a_failing_ray_task_is_reported_with_its_policy(capsys):
    assert cli.main(["compare", "--policies", "fcfs,nosuch", *ARGS, "--ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("metroline: error: nosuch: ") and "unknown plugin 'nosuch'" in err
