"""The `metroline` command: `run` with its outputs (JSON document, request and step CSVs), a
`--config` file overridden by flags, errors that name the field (exit code 2), the default run,
and no heavy imports."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import textwrap

import pytest

from metroline import cli
from metroline.core.results.metrics import SUMMARY_KEYS

REQUESTS_HEADER = (
    "id,tenant,priority,arrival_s,first_scheduled_s,first_token_s,finish_s,prompt_tokens,"
    "cached_prompt_tokens,output_tokens,preemptions,finish_reason"
)
STEPS_HEADER = "step,time_s,running,waiting,swapped,prefill_tokens,decode_tokens,free_blocks,cached_blocks,preemptions,duration_s"


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        header = f.readline().rstrip("\n")
        rows = list(csv.DictReader(f, fieldnames=header.split(",")))
    return header, rows


def test_run_writes_the_json_document_and_both_csvs(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()  # a missing folder is an error (tests/test_cli_errors.py)
    code = cli.main([
        "run", "--workload", "mixed-64", "--groups", "1", "--max-num-seqs", "16",
        "--json", str(out / "doc.json"), "--requests-csv", str(out / "requests.csv"),
        "--steps-csv", str(out / "steps.csv"), "--cost-model", "steps",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "policy fcfs | workload mixed-64 | executor sim" in printed

    doc = json.loads((out / "doc.json").read_text())
    assert {"policy", "workload", "executor", "config", "summary", "tenants"} <= set(doc)
    assert list(doc["summary"]) == list(SUMMARY_KEYS)
    summary = doc["summary"]
    assert doc["policy"] == "fcfs"
    assert doc["workload"]["name"] == "mixed-64" and doc["workload"]["requests"] == 64
    assert doc["executor"]["name"] == "sim" and doc["executor"]["cost_model"]["name"] == "steps"
    assert doc["config"]["max_num_seqs"] == 16
    assert (summary["requests"], summary["completed"], summary["rejected"]) == (64, 64, 0)
    assert summary["output_tokens"] == 54 * 20 + 10 * 2000
    assert list(doc["tenants"]) == ["default"]
    assert doc["tenants"]["default"]["completed"] == 64

    header, rows = read_csv(out / "requests.csv")
    assert header == REQUESTS_HEADER
    assert len(rows) == 64
    assert sorted(int(r["id"]) for r in rows) == list(range(64))
    assert sorted(int(r["output_tokens"]) for r in rows) == [20] * 54 + [2000] * 10
    assert {r["finish_reason"] for r in rows} == {"length"}

    header, rows = read_csv(out / "steps.csv")
    assert header == STEPS_HEADER + ",running[default]"  # one running column per tenant
    assert len(rows) == summary["steps"]
    assert all(r["running[default]"] == r["running"] for r in rows)  # the one tenant runs everything
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert sum(int(r["decode_tokens"]) + int(r["prefill_tokens"]) for r in rows) > summary["output_tokens"]


def test_a_config_file_sets_engine_and_run_options_and_flags_override_it(tmp_path):
    config = tmp_path / "engine.toml"
    config.write_text(textwrap.dedent("""
        max_num_seqs = 8
        block_size = 8
        num_blocks = 512
        enable_prefix_caching = false

        [run]
        workload = "shared-prefix"
        max_requests = 12
        cost_model = "steps"
        step_time = 0.02
    """))
    doc_path = tmp_path / "doc.json"
    code = cli.main(["run", "--config", str(config), "--max-num-seqs", "4", "--max-requests", "6", "--json", str(doc_path)])
    assert code == 0
    doc = json.loads(doc_path.read_text())
    cfg = doc["config"]
    assert (cfg["max_num_seqs"], cfg["block_size"], cfg["num_blocks"]) == (4, 8, 512)  # flag > file > default
    assert cfg["enable_prefix_caching"] is False
    assert cfg["max_num_batched_tokens"] == 2048  # default
    assert doc["workload"]["name"] == "shared-prefix" and doc["workload"]["requests"] == 6
    assert doc["executor"]["cost_model"] == {"name": "steps", "step_time": 0.02}
    assert doc["summary"]["prefix_hit_rate"] == 0.0
    # 6 requests of 32 output tokens, at most 4 at a time, 0.02 s a step
    assert doc["summary"]["completed"] == 6


def test_a_json_config_file_works_too(tmp_path):
    config = tmp_path / "engine.json"
    config.write_text(json.dumps({"block_size": 32, "policy": "static", "run": {"max_requests": 3}}))
    doc_path = tmp_path / "doc.json"
    assert cli.main(["run", "--config", str(config), "--workload", "mixed-64", "--json", str(doc_path)]) == 0
    doc = json.loads(doc_path.read_text())
    assert (doc["policy"], doc["config"]["block_size"], doc["summary"]["requests"]) == ("static", 32, 3)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("max_num_seq = 8\n", ["bad.toml: max_num_seq: unknown key (valid: block_size, num_blocks,"]),
        ("block_size = 0\n", ["block_size", "greater than or equal to 1"]),
        ("max_prefill_chunk = 4096\n", ["max_prefill_chunk (4096)", "max_num_batched_tokens (2048)"]),
        ('[run]\nwrkload = "chat"\n', ["bad.toml: run: wrkload: unknown key (valid: workload, executor,"]),
    ],
    ids=["unknown-field", "out-of-range", "inconsistent", "unknown-run-key"],
)
def test_a_bad_config_file_exits_2_naming_the_field(tmp_path, capsys, text, named):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    assert cli.main(["run", "--config", str(config), "--max-requests", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("metroline: error: ")
    for fragment in named:
        assert fragment in captured.err
    assert "policy fcfs" not in captured.out  # nothing ran


def test_a_bad_flag_value_exits_2_naming_the_field(capsys):
    assert cli.main(["run", "--max-num-seqs", "0", "--max-requests", "2"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err


def test_a_missing_config_file_exits_2(tmp_path, capsys):
    assert cli.main(["run", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


def test_swap_mode_from_the_flags_gets_a_swap_space(tmp_path):
    doc_path = tmp_path / "doc.json"
    code = cli.main(["run", "--preemption", "swap", "--num-blocks", "600", "--workload", "mixed-64",
                     "--groups", "1", "--json", str(doc_path)])
    assert code == 0
    cfg = json.loads(doc_path.read_text())["config"]
    assert (cfg["preemption_mode"], cfg["swap_space_blocks"]) == ("swap", 600)


def test_the_default_run_works(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "metroline | policy fcfs | workload chat | executor sim" in out
    assert re.search(r"requests\s+4000\s+completed\s+4000\n", out)


def test_workloads_lists_the_builtins(capsys):
    assert cli.main(["workloads"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert {"chat", "mixed-64", "shared-prefix", "long-burst"} <= set(names)


IMPORT_WATCH = """
import sys

HEAVY = ("torch", "transformers", "triton")


class Watch:
    attempted = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            Watch.attempted.append(name)
        return None


sys.meta_path.insert(0, Watch())
import metroline.cli
{then}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print("heavy imports:", Watch.attempted, loaded)
"""


@pytest.mark.parametrize(
    "then",
    ["", "assert metroline.cli.main(['run', '--max-requests', '5']) == 0"],
    ids=["import", "run"],
)
def test_the_cli_does_not_import_torch_or_transformers(then):
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_WATCH.format(then=then)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "heavy imports: [] []"
    if then:
        assert "policy fcfs | workload chat" in result.stdout


def test_compare_gives_each_run_only_the_options_of_the_plugins_it_loads(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('[run]\nmax_requests = 4\n\n[plugin_options.tenant_quota]\nmax_running = { alpha = 1 }\n')
    doc_path = tmp_path / "runs.json"
    assert cli.main(["compare", "--policies", "fcfs,fcfs+tenant_quota", "--jobs", "1",
                     "--config", str(config), "--json", str(doc_path)]) == 0
    runs = json.loads(doc_path.read_text())["runs"]
    assert [r["config"]["plugin_options"] for r in runs] == [{}, {"tenant_quota": {"max_running": {"alpha": 1}}}]
    # options for a plugin that no compared run loads stay an error naming the table
    assert cli.main(["compare", "--policies", "fcfs,srpt", "--jobs", "1", "--config", str(config)]) == 2
    assert "plugin_options.tenant_quota: no compared run loads plugin 'tenant_quota'" in capsys.readouterr().err
