"""`metroline compare --seeds K --baseline NAME`, `--horizon` / `--warmup`, and the workload seeds:
a spec file's seed is honoured and recorded, its workload does not depend on its file name, and a
trace is resampled when a seed is given."""

from __future__ import annotations

import json
import shutil

import pytest
from test_manifest import SPEC  # a spec file's text: seed 7, rate 40.0

from metroline import cli
from metroline.core.results.paired import metric_value
from metroline.core.workloads.build import build_workload
from metroline.core.workloads.traces import load_azure

SMALL = ["--workload", "chat", "--max-requests", "80", "--max-num-seqs", "16", "--no-progress"]



def main(*argv) -> int:
    return cli.main([str(a) for a in argv])


def write_trace(path, n=200):
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{0.05 * i + (0.04 if i % 3 == 0 else 0.0):.3f},{16 + (7 * i) % 90},{2 + (5 * i) % 30}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def seeds_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("seeds") / "seeds.json"
    assert main("compare", "--policies", "fcfs,srpt,priority", *SMALL, "--seeds", "3", "--baseline", "srpt",
                "--json", path) == 0
    return json.loads(path.read_text())


def test_every_policy_runs_on_the_same_draws(seeds_doc):
    runs = seeds_doc["runs"]
    assert len(runs) == 9
    for seed in (0, 1, 2):
        draw = [r for r in runs if r["workload"]["seed"] == seed]
        assert sorted(r["policy"] for r in draw) == ["fcfs", "priority", "srpt"]
        assert len({json.dumps(r["workload"], sort_keys=True) for r in draw}) == 1  # common random numbers
    assert len({json.dumps(r["workload"], sort_keys=True) for r in runs}) == 3  # three different draws


def test_the_comparison_holds_each_runs_values_in_seed_order(seeds_doc):
    comparison = seeds_doc["comparison"]
    assert comparison["seeds"] == [0, 1, 2] and comparison["baseline"] == "srpt"
    for policy, metrics in comparison["policies"].items():
        runs = sorted((r for r in seeds_doc["runs"] if r["policy"] == policy), key=lambda r: r["workload"]["seed"])
        values = [metric_value(r, ("summary", "e2e_s", "mean")) for r in runs]
        assert metrics["summary.e2e_s.mean"]["values"] == values
        assert (metrics["summary.e2e_s.mean"]["vs_baseline"] is None) == (policy == "srpt")


def test_the_table_is_printed_with_the_baseline(tmp_path, capsys):
    assert main("compare", "--policies", "fcfs,srpt", *SMALL, "--seeds", "2", "--seed", "5") == 0
    out = capsys.readouterr().out
    assert out.startswith("2 seeds (5, 6)")
    assert "  vs fcfs" in out and "baseline" in out and "note: with 2 seeds" in out


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1"], "--seeds: must be at least 2"),
    (["--seeds", "2", "--baseline", "sjf"], "--baseline: 'sjf' is not one of --policies"),
    (["--baseline", "fcfs"], "--baseline: applies with --seeds only"),
    (["--seeds", "2", "--resample", "shuffle"], "expected 'redraw', 'window:SECONDS' or 'gamma:BURSTINESS'"),
    (["--horizon", "1", "--warmup", "2"], "--horizon: must be a number of seconds > the warm-up"),
])
def test_bad_seed_options_are_refused_in_one_line(argv, message, capsys):
    assert main("compare", "--policies", "fcfs,srpt", *SMALL, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_horizon_counts_the_unfinished_in_the_comparison(tmp_path):
    path = tmp_path / "h.json"
    assert main("compare", "--policies", "fcfs,srpt", *SMALL, "--max-num-seqs", "4", "--seeds", "2",
                "--horizon", "2", "--warmup", "0.1", "--json", path) == 0
    doc = json.loads(path.read_text())
    for run in doc["runs"]:
        s = run["summary"]
        assert run["measurement"] == {"warmup_s": 0.1, "horizon_s": 2.0}
        assert s["completed"] + s["unfinished"] + s["rejected"] == s["requests"]
        assert s["unfinished"] > 0
    assert "summary.unfinished" in doc["comparison"]["metrics"]


def test_a_spec_files_seed_is_honoured_recorded_and_overridden_by_seed(tmp_path):
    spec = tmp_path / "mine.toml"
    spec.write_text(SPEC)
    out = tmp_path / "a.json"
    assert main("run", "--workload", spec, "--no-progress", "--json", out) == 0
    doc = json.loads(out.read_text())
    assert doc["workload"]["seed"] == 7 and doc["workload"]["spec"]["seed"] == 7
    assert main("run", "--workload", spec, "--no-progress", "--seed", "3", "--json", out) == 0
    assert json.loads(out.read_text())["workload"]["seed"] == 3
    with_file_seed = build_workload(str(spec))
    assert with_file_seed.items != build_workload(str(spec), seed=0).items
    assert with_file_seed.items == build_workload(str(spec), seed=7).items


def test_renaming_a_spec_file_does_not_change_its_workload(tmp_path):
    first = tmp_path / "first.toml"
    first.write_text(SPEC)
    second = tmp_path / "renamed.toml"
    shutil.copy(first, second)
    a, b = build_workload(str(first)), build_workload(str(second))
    assert a.items == b.items and a.name != b.name
    docs = []
    for path in (first, second):
        out = tmp_path / f"{path.stem}.json"
        assert main("run", "--workload", path, "--no-progress", "--json", out) == 0
        docs.append(json.loads(out.read_text()))
    assert docs[0]["summary"]["output_tokens"] == docs[1]["summary"]["output_tokens"]
    assert {k: v for k, v in docs[0]["summary"].items() if k != "wall_s"} == \
        {k: v for k, v in docs[1]["summary"].items() if k != "wall_s"}
    changed = tmp_path / "changed.toml"
    changed.write_text(SPEC.replace("rate = 40.0", "rate = 41.0"))
    assert build_workload(str(changed)).items != a.items  # the content keys the draw


def test_a_trace_is_as_recorded_without_a_seed_and_resampled_with_one(tmp_path):
    trace = write_trace(tmp_path / "t.csv")
    recorded = build_workload(str(trace))
    assert recorded.items == load_azure(trace) and "seed" not in recorded.params
    docs = {}
    for seed in ("0", "1"):
        out = tmp_path / f"s{seed}.json"
        assert main("run", "--workload", trace, "--no-progress", "--seed", seed, "--max-num-seqs", "4",
                    "--json", out) == 0
        docs[seed] = json.loads(out.read_text())
    assert docs["0"]["workload"]["seed"] == 0 and docs["0"]["workload"]["resample"] == "redraw"
    strip = lambda d: {k: v for k, v in d["summary"].items() if k != "wall_s"}  # noqa: E731
    assert strip(docs["0"]) != strip(docs["1"])
    window = build_workload(str(trace), seed=2, resample="window:4")
    assert 0 < len(window) < len(recorded) and window.params["resample"] == "window:4"


def test_compare_seeds_on_a_trace_resamples_it(tmp_path):
    trace = write_trace(tmp_path / "t.csv")
    out = tmp_path / "c.json"
    assert main("compare", "--policies", "fcfs,srpt", "--workload", trace, "--no-progress", "--max-num-seqs", "4",
                "--seeds", "2", "--json", out) == 0
    doc = json.loads(out.read_text())
    assert doc["comparison"]["seeds"] == [0, 1]
    values = doc["comparison"]["policies"]["fcfs"]["summary.e2e_s.mean"]["values"]
    assert values[0] != values[1]


def test_the_run_table_shows_unfinished_only_with_a_horizon(capsys):
    assert main("run", *SMALL, "--max-num-seqs", "4") == 0
    assert "unfinished" not in capsys.readouterr().out
    assert main("run", *SMALL, "--max-num-seqs", "4", "--horizon", "1") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "unfinished" in x)
    assert int(line.split("unfinished")[1].split()[0]) > 0
