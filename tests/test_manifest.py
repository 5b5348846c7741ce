"""The manifest of a result document: it identifies the code (version, commit, each plugin's
source), the inputs (the workload's file and requests, the seeds, the config) and the command line;
a workload file renamed keeps its hashes; `metroline replay` reruns a document and finds it
byte-identical apart from the wall-clock fields, and says so when it is not."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metroline import cli
from metroline.core.config import EngineConfig
from metroline.core.experiments.manifest import (
    WALL_CLOCK_KEYS,
    build_manifest,
    items_sha256,
    plugin_entries,
    sha256_file,
)
from metroline.core.experiments.replay_check import canonical, changed_inputs, differences, load_manifest
from metroline.core.workloads.build import build_workload

SPEC = """num_requests = 60
rate = 40.0
prompt_len = {dist = "uniform", low = 8, high = 64}
output_len = {dist = "uniform", low = 4, high = 40}
tenants = {a = 1, b = 1}
seed = 7
"""

TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n" + "".join(
    f"{0.05 * i:.2f},{20 + 7 * i},{5 + i % 9}\n" for i in range(40))


def test_a_workload_file_renamed_keeps_its_file_hash(tmp_path):
    first, second = tmp_path / "spec.toml", tmp_path / "renamed.toml"
    first.write_text(SPEC)
    shutil.copy(first, second)
    entries = []
    for path in (first, second):
        run = {"workload": str(path)}
        w = build_workload(str(path))
        entries.append(build_manifest(["run"], EngineConfig(), run, w)["workload"])
    assert entries[0]["file_sha256"] == entries[1]["file_sha256"] == hashlib.sha256(SPEC.encode()).hexdigest()
    assert entries[0]["path"] != entries[1]["path"]


def test_a_trace_renamed_keeps_its_file_hash_and_its_requests_hash_follows_the_requests(tmp_path):
    first, second = tmp_path / "trace.csv", tmp_path / "other.csv"
    first.write_text(TRACE)
    shutil.copy(first, second)
    files = [build_manifest(["run"], EngineConfig(), {"workload": str(p)}, build_workload(str(p)))["workload"]
             for p in (first, second)]
    assert files[0]["file_sha256"] == files[1]["file_sha256"] == hashlib.sha256(TRACE.encode()).hexdigest()
    assert files[0]["requests"] == 40
    again = items_sha256(build_workload(str(first)).items)
    assert again == files[0]["items_sha256"]  # the same requests, the same hash
    assert items_sha256(build_workload(str(first), rate_scale=2.0).items) != again


def test_the_manifest_names_code_inputs_and_seeds(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    config = EngineConfig(policy="fcfs", plugins=["tenant_quota"], plugin_options={"tenant_quota": {"max_running": {"a": 2}}},
                          seed=3)
    m = build_manifest(["run", "--workload", str(spec)], config, {"workload": str(spec)}, build_workload(str(spec)),
                       config_file=str(spec))
    assert m["config_file"]["sha256"] == sha256_file(spec) and "cost_model_file" not in m
    assert m["command"]["argv"] == ["run", "--workload", str(spec)]
    assert m["seeds"] == {"engine": 3, "workload": 7}  # the spec's own seed
    assert m["config"]["plugins"] == ["tenant_quota"]
    by_spec = {p["spec"]: p for p in m["plugins"]}
    assert set(by_spec) == {"fcfs", "tenant_quota", "defaults"}
    from metroline.plugins_contrib import tenant_quota

    assert by_spec["tenant_quota"]["sha256"] == sha256_file(tenant_quota.__file__)
    assert by_spec["tenant_quota"]["options"] == {"max_running": {"a": 2}}
    assert m["python"]["version"].count(".") == 2
    assert "pydantic" in m["packages"] and m["packages"]["pydantic"]
    assert set(m) >= {"metroline", "platform", "run", "workload", "started_at", "host"}
    json.dumps(m)  # JSON types only


def test_a_plugin_that_does_not_resolve_is_recorded_with_its_error():
    entries = plugin_entries([EngineConfig(policy="fcfs", plugins=["no_such_plugin"])])
    assert "error" in next(e for e in entries if e["spec"] == "no_such_plugin")


def run_json(tmp_path: Path, name: str, argv: list[str]) -> Path:
    out = tmp_path / f"{name}.json"
    assert cli.main([*argv, "--json", str(out), "--no-progress"]) == 0
    return out


ARGS = ["--workload", "chat", "--max-requests", "120", "--max-num-seqs", "16", "--cost-model", "steps"]


@pytest.mark.parametrize("command", [["run", "--policy", "srpt"], ["compare", "--policies", "fcfs,srpt", "--jobs", "2"]])
def test_a_replayed_document_is_byte_identical_apart_from_wall_clock_fields(tmp_path, capsys, command):
    path = run_json(tmp_path, "original", [*command, *ARGS])
    doc, manifest = load_manifest(path)
    assert manifest["command"]["argv"][: len(command)] == command
    assert cli.main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "identical" in out and "DIFFERS" not in out
    # the same command line again gives the same bytes once the wall-clock fields are left out,
    # and it has wall-clock fields that differ (the comparison does leave something out)
    again = json.loads(run_json(tmp_path, "original", [*command, *ARGS]).read_text())
    assert canonical(again) == canonical(doc)
    assert json.dumps(again) != json.dumps(doc) and WALL_CLOCK_KEYS == {"wall_s", "started_at", "host"}


def test_a_replay_that_differs_says_where_and_fails(tmp_path, capsys):
    path = run_json(tmp_path, "original", ["run", *ARGS])
    doc = json.loads(path.read_text())
    doc["summary"]["completed"] -= 1  # as if the code had changed since
    doc["manifest"]["plugins"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc, indent=2))
    assert cli.main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS" in out and ".summary.completed: 119 -> 120" in out
    assert "plugin fcfs: its source (metroline.policies.fcfs) changed" in out


def test_replay_refuses_a_document_without_a_manifest(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"policy": "fcfs"}))
    assert cli.main(["replay", str(path)]) == 2
    assert "has no manifest" in capsys.readouterr().err


def test_differences_and_changed_inputs_list_paths():
    assert differences({"a": [1, 2], "b": 1.0}, {"a": [1, 3], "c": 1}) == [
        ".a[1]: 2 -> 3", ".b: only in the original", ".c: only in the replay"]
    old = {"metroline": {"version": "0.1"}, "packages": {"x": "1"}, "workload": {"source": "w", "file_sha256": "a"}}
    new = {"metroline": {"version": "0.2"}, "packages": {"x": "2"}, "workload": {"source": "w", "file_sha256": "b"}}
    old["config_file"], new["config_file"] = {"path": "c.toml", "sha256": "1"}, {"path": "c.toml", "sha256": "2"}
    notes = changed_inputs(old, new)
    assert "config file c.toml: changed" in notes
    assert any(n.startswith("metroline:") for n in notes)
    assert "package x: 1 then, 2 now" in notes and "workload w: its file changed" in notes


PLUGIN = """from metroline.api import Candidates, hookimpl

from .helper import HEAD_OF_LINE


class Ordered:
    name = "ordered"

    @hookimpl
    def admission(self, ctx):
        from . import sizes  # an import inside a function counts too
        return Candidates(sorted(ctx.waiting, key=sizes.key), head_of_line=HEAD_OF_LINE)
"""


def test_replay_names_the_helper_module_of_a_plugin_that_changed(tmp_path, capsys, monkeypatch):
    pkg = tmp_path / "myplug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "policy.py").write_text(PLUGIN)
    (pkg / "helper.py").write_text("import json  # the standard library is not recorded\nHEAD_OF_LINE = True\n")
    (pkg / "sizes.py").write_text("def key(seq):\n    return seq.num_prompt_tokens\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = run_json(tmp_path, "original", ["run", "--policy", "fcfs", "--plugin", "myplug.policy:Ordered", *ARGS])
    entry = next(p for p in load_manifest(path)[1]["plugins"] if p["spec"] == "myplug.policy:Ordered")
    assert entry["module"] == "myplug.policy"
    assert set(entry["imports"]) == {"myplug", "myplug.helper", "myplug.sizes"}  # metroline, json: not recorded
    assert entry["imports"]["myplug.helper"] == sha256_file(pkg / "helper.py")
    (pkg / "helper.py").write_text("import json\nHEAD_OF_LINE = False\n")
    cli.main(["replay", str(path)])
    out = capsys.readouterr().out
    assert "plugin myplug.policy:Ordered: module myplug.helper, which it imports, changed" in out
    assert "myplug.sizes" not in out and "its source (myplug.policy) changed" not in out


CAP = '''
from metroline.api import Candidates, hookimpl


class Cap:
    name = "cap"

    @hookimpl(wrapper=True)
    def admission(self, ctx):
        answer = yield
        cands = answer if isinstance(answer, Candidates) else Candidates(answer)
        return cands.filter(lambda s: len(ctx.running) < 6)
'''


def test_a_plugin_loaded_through_pythonpath_replays_from_another_folder(tmp_path):
    """`run` with the plugin's folder on PYTHONPATH records where the module came from; `replay`
    in another folder, without that PYTHONPATH, imports it from there again and finds the result
    identical; with the folder gone, it stops with one line naming the module and what to do."""
    plugins, ran_in, elsewhere = tmp_path / "plugins", tmp_path / "ran_in", tmp_path / "elsewhere"
    for folder in (plugins / "mtl_pp_plug", ran_in, elsewhere):
        folder.mkdir(parents=True)
    (plugins / "mtl_pp_plug" / "__init__.py").write_text("")
    (plugins / "mtl_pp_plug" / "cap.py").write_text(CAP)
    base = os.environ.get("PYTHONPATH", "")

    def metroline(cwd: Path, pythonpath: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "metroline", *argv], cwd=cwd, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}, timeout=300)

    out = ran_in / "out.json"
    ran = metroline(ran_in, os.pathsep.join([str(plugins), base]), "run", "--plugin", "mtl_pp_plug.cap:Cap",
                    "--workload", "chat", "--max-requests", "60", "--cost-model", "steps", "--json", str(out))
    assert ran.returncode == 0, ran.stderr
    entry = next(p for p in load_manifest(out)[1]["plugins"] if p["spec"] == "mtl_pp_plug.cap:Cap")
    assert entry["file"] == str((plugins / "mtl_pp_plug" / "cap.py").resolve())
    assert entry["sys_path"] == str(plugins.resolve())
    assert "file" not in next(p for p in load_manifest(out)[1]["plugins"] if p["spec"] == "fcfs")  # metroline's own

    replayed = metroline(elsewhere, base, "replay", str(out))
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert replayed.stdout.startswith(f"replay of {out}: identical")

    (plugins).rename(tmp_path / "moved")
    gone = metroline(elsewhere, base, "replay", str(out))
    assert gone.returncode == 2
    assert gone.stderr.strip().splitlines()[-1] == (
        f"metroline: error: replay: plugin mtl_pp_plug.cap:Cap: module 'mtl_pp_plug.cap' was loaded from "
        f"{plugins.resolve() / 'mtl_pp_plug' / 'cap.py'} (under {plugins.resolve()}, which no longer exists) and "
        "cannot be imported here: put the folder holding 'mtl_pp_plug' on PYTHONPATH and replay again")
