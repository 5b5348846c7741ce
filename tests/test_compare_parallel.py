"""`metroline compare` runs its policies in worker processes: the result documents equal those of
running them one by one (every field but `wall_s`, the host's clock), in the order asked; a
worker's error is reported naming its policy; the progress line is labelled per policy."""

from __future__ import annotations

import json

from metroline import cli

POLICIES = "fcfs,priority,srpt,weighted_fair,token_rr"
# three tenants, two priority classes, a pool small enough to preempt, shared system prompts
ARGS = ["--workload", "chat", "--max-requests", "240", "--max-num-seqs", "32", "--num-blocks", "600"]


def without_wall_time(value):
    if isinstance(value, dict):
        return {k: without_wall_time(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [without_wall_time(v) for v in value]
    return value


def compare(tmp_path, name, *extra):
    path = tmp_path / f"{name}.json"
    assert cli.main(["compare", "--policies", POLICIES, *ARGS, "--json", str(path), *extra]) == 0
    return json.loads(path.read_text())["runs"]


def test_parallel_documents_equal_the_one_by_one_documents(tmp_path, capsys):
    serial = compare(tmp_path, "serial", "--jobs", "1")
    parallel = compare(tmp_path, "parallel", "--jobs", "3")
    assert [d["policy"] for d in parallel] == POLICIES.split(",")
    for doc in serial:  # a real run: every request ended, some preempted, several tenants
        s = doc["summary"]
        assert (s["requests"], s["completed"]) == (240, 240)
        assert set(doc["tenants"]) == {"alpha", "beta", "gamma"}
        assert doc["fairness"]["windows"]
    assert sum(d["summary"]["preemptions"] for d in serial) > 0
    # the policies differ, so a mix-up of documents would show
    assert len({json.dumps(without_wall_time(d["summary"]), sort_keys=True) for d in serial}) > 1
    assert without_wall_time(parallel) == without_wall_time(serial)
    assert all(d["summary"]["wall_s"] > 0 for d in parallel)
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("workload ")  # what every run shares, then the table
    assert table.splitlines()[2].split() == POLICIES.split(",")  # the table of the last command


def test_a_failing_worker_is_reported_with_its_policy(capsys):
    code = cli.main(["compare", "--policies", "fcfs,nosuch", *ARGS, "--jobs", "2"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("metroline: error: nosuch: ") and "unknown plugin 'nosuch'" in err


def test_jobs_below_one_is_refused(capsys):
    assert cli.main(["compare", "--policies", "fcfs", "--jobs", "0"]) == 2
    assert "--jobs: must be at least 1, got 0" in capsys.readouterr().err
