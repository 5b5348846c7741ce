"""`compare --arms FILE` and `metroline.api.compare_arms`: arms that each set their own policy
stack, engine config and cost model, paired on the same draws."""

from __future__ import annotations

import json

import pytest

from metroline import cli
from metroline.api import Arm, compare_arms
from metroline.core.workloads.build import SyntheticSpec, Workload, generate

STEP = 0.01
SPEC = """num_requests = 40
rate = 5.0
prompt_len = 16
output_len = 20
"""
ARMS = """[arms.base]
policy = "fcfs"

[arms.half]
policy = "srpt"
max_num_seqs = 4

[arms.slow]
policy = "fcfs"
cost_params = { slowdown = 2.0 }
"""


def test_each_arm_runs_its_own_policy_config_and_cost_model_on_the_same_draws(tmp_path):
    (tmp_path / "w.toml").write_text(SPEC)
    (tmp_path / "arms.toml").write_text(ARMS)
    out = tmp_path / "out.json"
    assert cli.main(["compare", "--arms", str(tmp_path / "arms.toml"), "--seeds", "2", "--workload", str(tmp_path / "w.toml"),
                     "--cost-model", "steps", "--step-time", str(STEP), "--max-num-seqs", "8", "--no-progress",
                     "--jobs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [r["policy"] for r in runs[:3]] == ["fcfs", "srpt", "fcfs"]
    assert [r["config"]["max_num_seqs"] for r in runs[:3]] == [8, 4, 8]
    assert [r["workload"]["seed"] for r in runs] == [0, 0, 0, 1, 1, 1]  # every arm on the same draws
    assert runs[2]["executor"]["cost_model"]["slowdown"] == 2.0 and "slowdown" not in runs[0]["executor"]["cost_model"]
    # at this light load each request decodes one token a step: TPOT is the step time, doubled in "slow"
    for base, slow in ((runs[0], runs[2]), (runs[3], runs[5])):
        assert base["summary"]["tpot_s"]["mean"] == pytest.approx(STEP)
        assert slow["summary"]["tpot_s"]["mean"] == pytest.approx(2 * STEP)
    slow = doc["comparison"]["policies"]["slow"]["summary.tpot_s.mean"]["vs_baseline"]
    assert slow["relative"]["estimate"] == pytest.approx(1.0)


def test_compare_arms_from_python():
    draws = [Workload("w", generate(SyntheticSpec(num_requests=20, rate=5.0, prompt_len=16, output_len=10, seed=s)))
             for s in (0, 1)]
    arms = [Arm(name="a"), Arm(name="b", config={"max_num_seqs": 2}, cost_params={"slowdown": 1.5})]
    result = compare_arms(arms, draws, [0, 1], cost_model="steps", cost_params={"step_time": STEP}, jobs=1)
    assert [r["arm"] for r in result["runs"]] == ["a", "b", "a", "b"]
    b = result["comparison"]["policies"]["b"]["summary.tpot_s.mean"]
    assert b["values"] == pytest.approx([1.5 * STEP, 1.5 * STEP])


def test_compare_arms_measures_every_arm_in_the_window():
    """`measure`: the requests arriving in the warm-up are left out of every arm's figures, and
    throughput counts only the tokens produced after it (as `compare --warmup`)."""
    from metroline.core.results.horizon import MeasurementWindow

    items = generate(SyntheticSpec(num_requests=20, rate=5.0, prompt_len=16, output_len=10, seed=0))
    assert all(a.arrival_s < b.arrival_s for a, b in zip(items, items[1:]))
    warmup = items[7].arrival_s  # requests 7.. arrive from it on: 13 measured
    arms = [Arm(name="a"), Arm(name="b", cost_params={"slowdown": 2.0})]
    common = dict(cost_model="steps", cost_params={"step_time": STEP}, jobs=1)
    result = compare_arms(arms, [Workload("w", items)], [0], measure=MeasurementWindow(warmup), **common)
    whole = compare_arms(arms, [Workload("w", items)], [0], **common)
    for doc, full in zip(result["runs"], whole["runs"]):
        assert doc["measurement"] == {"warmup_s": warmup, "horizon_s": None} and "measurement" not in full
        assert doc["summary"]["completed"] == 13 and full["summary"]["completed"] == 20
        assert 0 < doc["summary"]["output_tokens"] < full["summary"]["output_tokens"]
    b = result["comparison"]["policies"]["b"]["summary.tpot_s.mean"]["values"]
    assert b == pytest.approx([2 * STEP])  # light load: one token a step, the slowed step


SPEC_ARMS = """[arms.none]
policy = "fcfs"

[arms.k2]
policy = "fcfs"
speculative_config = { method = "draft_model", model = "draft", num_speculative_tokens = 2, acceptance_rate = 1.0, draft_cost = 0.0 }

[arms.k2_rejected]
policy = "fcfs"
speculative_config = { method = "draft_model", model = "draft", num_speculative_tokens = 2, acceptance_rate = 0.0, draft_cost = 0.0 }
"""


def test_compare_ab_tests_speculation_settings_as_arms(tmp_path):
    """Each arm its own `speculative_config`: with every draft accepted, k = 2 advances a decode
    3 tokens a step (the last step cut to max_tokens), with none accepted 1, as without speculation."""
    (tmp_path / "w.toml").write_text(SPEC)
    (tmp_path / "arms.toml").write_text(SPEC_ARMS)
    out = tmp_path / "out.json"
    assert cli.main(["compare", "--arms", str(tmp_path / "arms.toml"), "--seeds", "2", "--workload", str(tmp_path / "w.toml"),
                     "--cost-model", "steps", "--step-time", str(STEP), "--no-progress", "--jobs", "1",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [r["workload"]["seed"] for r in runs] == [0, 0, 0, 1, 1, 1]
    assert "speculation" not in runs[0]
    assert runs[1]["speculation"]["acceptance_rate"] == 1.0 and runs[2]["speculation"]["acceptance_rate"] == 0.0
    decodes = 20 - 1  # the prefill samples the first of the 20 output tokens
    steps = -(-decodes // 3)  # 3 tokens a step with k = 2 all accepted
    for i in (0, 3):
        assert runs[i]["summary"]["tpot_s"]["mean"] == pytest.approx(STEP)
        assert runs[i + 1]["summary"]["tpot_s"]["mean"] == pytest.approx(steps * STEP / decodes)
        assert runs[i + 2]["summary"]["tpot_s"]["mean"] == pytest.approx(STEP)
    k2 = doc["comparison"]["policies"]["k2"]["summary.tpot_s.mean"]
    assert k2["values"] == pytest.approx([steps * STEP / decodes] * 2)


@pytest.mark.parametrize("text, message", [
    ("[arms.only]\n", "give at least two [arms.NAME] tables"),
    ("[arms.a]\n[arms.b]\nmax_num_seq = 3\n", "arms.b.max_num_seq: not an engine config field"),
    ("[arms.a]\n[arms.b]\nmax_num_seqs = 0\n", "arm 'b': "),
    ("[arms.a]\n[arms.b]\ncost_params = { slowdown = -1 }\n", "arm 'b': cost model: slowdown: must be a number > 0"),
])
def test_bad_arms_are_refused_naming_the_arm_and_field(tmp_path, capsys, text, message):
    (tmp_path / "arms.toml").write_text(text)
    assert cli.main(["compare", "--arms", str(tmp_path / "arms.toml"), "--seeds", "2", "--workload", "chat",
                     "--max-requests", "10", "--no-progress"]) == 2
    assert message in capsys.readouterr().err
