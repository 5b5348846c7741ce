"""`preset = "vllm"` reproduces vLLM v1's schedules: every request's first scheduling, first token and
end, on schedules recorded from vLLM 0.33's own scheduler by `bench/vllm_reference.py` (workloads
with and without preemption, with and without a shared-prefix burst)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metroline.core.config import EngineConfig, presets
from metroline.core.experiments.runner import run_workload
from metroline.core.workloads.build import build_workload
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

DATA = Path(__file__).parent / "data"
RECORDINGS = sorted(p for p in DATA.glob("vllm_*.json") if p.name != "vllm_matrix.json")  # that one: test_vllm_matrix


def replay_like(recording: dict, **config) -> tuple[dict, dict[str, tuple]]:
    w, e = recording["workload"], recording["engine"]
    workload = build_workload(w["source"], seed=w["seed"], max_requests=w["max_requests"],
                              rate_scale=w["rate_scale"], length_scale=w["length_scale"])
    cfg = EngineConfig(num_blocks=e["num_blocks"], block_size=e["block_size"], max_num_seqs=e["max_num_seqs"],
                       max_num_batched_tokens=e["max_num_batched_tokens"], max_model_len=e["max_model_len"], **config)
    doc, engine = run_workload(workload, cfg, SimulatedExecutor(make_cost_model("steps", step_time=e["step_time"])))
    times = {r.id: (r.first_scheduled_s, r.first_token_s, r.finish_s) for r in engine.metrics.requests}
    return doc, times


def recorded(recording: dict) -> dict[str, tuple]:
    return {rid: (r["first_scheduled"][1], r["first_token"][1], r["finish"][1]) for rid, r in recording["requests"].items()}


def test_the_recordings_cover_preemption_and_shared_prefix_bursts():
    docs = {p.stem: json.loads(p.read_text()) for p in RECORDINGS}
    assert any(d["preemptions"] > 0 for d in docs.values())
    assert any(d["preemptions"] == 0 for d in docs.values())
    bursts = [d for d in docs.values() if d["workload"]["source"] == "shared-prefix" and d["workload"]["rate_scale"] >= 100]
    assert any(d["preemptions"] > 0 for d in bursts) and any(d["preemptions"] == 0 for d in bursts)


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_the_vllm_preset_reproduces_every_request_of_a_recorded_vllm_schedule(path):
    recording = json.loads(path.read_text())
    doc, times = replay_like(recording, preset="vllm")
    want = recorded(recording)
    assert times.keys() == want.keys()
    differ = {rid: (times[rid], want[rid]) for rid in want if times[rid] != want[rid]}
    assert differ == {}
    assert doc["summary"]["preemptions"] == recording["preemptions"]
    assert doc["summary"]["steps"] == recording["steps"]


def test_the_preset_loses_to_explicit_fields():
    assert EngineConfig(preset="vllm").prefix_match == "block"
    cfg = EngineConfig(preset="vllm", prefix_match="token", admit_after_preemption=True)
    assert (cfg.prefix_match, cfg.admit_after_preemption, cfg.admission_gate) == ("token", True, "full_prompt")
    assert "vllm" in presets()


def test_an_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown preset 'sglang'; valid: vllm"):
        EngineConfig(preset="sglang")


def test_first_chunk_admission_departs_from_vllm_under_preemption():
    # the options matter: vLLM's whole-prompt gate is what keeps these schedules identical
    recording = json.loads((DATA / "vllm_chat_preempt.json").read_text())
    _, times = replay_like(recording, preset="vllm", admission_gate="first_chunk")
    want = recorded(recording)
    assert sum(times[rid] != want[rid] for rid in want) > 0


def test_cli_preset_flag_and_config_key(tmp_path, capsys):
    from metroline import cli

    out = tmp_path / "a.json"
    assert cli.main(["run", "--preset", "vllm", "--max-requests", "3", "--json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert (config["preset"], config["admission_gate"], config["prefix_match"]) == ("vllm", "full_prompt", "block")
    toml = tmp_path / "c.toml"
    toml.write_text('preset = "vllm"\nprefix_match = "token"\n')
    assert cli.main(["run", "--config", str(toml), "--max-requests", "3", "--json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert (config["preset"], config["prefix_match"], config["admit_after_preemption"]) == ("vllm", "token", False)
    capsys.readouterr()
    assert cli.main(["run", "--preset", "sglang", "--max-requests", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "metroline: error: unknown preset 'sglang'; valid: vllm"
