"""`metroline sweep` and the load check of `metroline compare`, from the command line, on the
workload of `tests/test_sweep.py` (capacity C = SLOTS / (OUT * STEP) = 40 req/s)."""

from __future__ import annotations

import json

import pytest
from test_sweep import CAPACITY, OUT, SLOTS, STEP, N

from metroline import cli

SPEC = f"""num_requests = {N}
rate = {CAPACITY / 2}
arrival = "gamma"
burstiness = 400.0
prompt_len = 16
output_len = {OUT}
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "regular.toml"
    path.write_text(SPEC)
    return path


def common(spec) -> list[str]:
    return ["--workload", str(spec), "--max-num-seqs", str(SLOTS), "--num-blocks", "512", "--cost-model", "steps",
            "--step-time", str(STEP), "--no-progress", "--jobs", "2"]


def test_a_sweep_over_rates_finds_the_capacity_between_them(tmp_path, spec, capsys):
    out = tmp_path / "sweep.json"
    rates = [0.5 * CAPACITY, 0.9 * CAPACITY, 1.5 * CAPACITY]
    argv = ["sweep", "--policies", "fcfs,srpt", "--rates", ",".join(map(str, rates)), "--slo", "ttft=0.06,tpot=0.015",
            *common(spec), "--json", str(out)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert [(p["policy"], p["offered"]["rate_req_s"]) for p in doc["points"]] == [
        (policy, r) for policy in ("fcfs", "srpt") for r in rates]
    for policy in ("fcfs", "srpt"):  # below C every request within SLO, above it few
        assert doc["capacity"][policy]["bracket"] == [rates[1], rates[2]]
    assert doc["manifest"]["command"]["argv"] == argv
    assert doc["load_check"]["lowest_rate"]["kind"] == "light" and doc["load_check"]["highest_rate"]["kind"] == "heavy"
    assert doc["load_check"]["message"] is None  # the rates cover the capacity
    printed = capsys.readouterr().out
    assert "capacity at SLO" in printed and "fcfs" in printed


def test_sweep_warns_when_every_rate_is_too_light(tmp_path, spec, capsys):
    argv = ["sweep", "--policies", "fcfs", "--rates", f"{0.05 * CAPACITY},{0.1 * CAPACITY}", "--slo", "e2e=10",
            *common(spec)]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "every rate is too light" in err
    # the estimated capacity is C (each request holds a slot OUT steps): it is named
    named = float(err.split("capacity is about ")[1].split(" req/s")[0])
    assert named == pytest.approx(CAPACITY, rel=0.05)


def test_compare_warns_about_a_light_load_and_names_the_rate_scale(tmp_path, spec, capsys):
    out = tmp_path / "compare.json"
    # the spec's rate is C / 2: scaled by 0.2 it is 0.1 C, and 0.95 C is 9.5 times that
    assert cli.main(["compare", "--policies", "fcfs,srpt", *common(spec), "--rate-scale", "0.2", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "load too light for the policies to differ" in err
    doc = json.loads(out.read_text())
    suggested = doc["load_check"]["suggested_rate_scale"]
    assert suggested == pytest.approx(0.2 * 9.5, rel=0.05) and f"--rate-scale {suggested:g}" in err


@pytest.mark.parametrize("argv, problem", [
    (["--rates", "auto", "--slo", "ttft=1", "--rate-scale", "2"], "--rate-scale: a sweep sets the rate itself"),
    (["--rates", "10,x", "--slo", "ttft=1"], "--rates: 'x' is not a number of requests per second"),
    (["--rates", "0", "--slo", "ttft=1"], "--rates: must be a number of requests per second > 0"),
    (["--rates", "auto", "--slo", "ttft"], "--slo: 'ttft': expected METRIC=SECONDS"),
])
def test_bad_sweep_options_are_refused_in_one_line(spec, capsys, argv, problem):
    assert cli.main(["sweep", "--policies", "fcfs", "--workload", str(spec), *argv]) == 2
    assert problem in capsys.readouterr().err


def test_a_sweep_replays_identically(tmp_path, spec, capsys):
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--policies", "fcfs", "--rates", f"{CAPACITY / 2},{2 * CAPACITY}", "--slo", "ttft=0.06",
                     *common(spec), "--json", str(out)]) == 0
    assert cli.main(["replay", str(out)]) == 0
    assert f"replay of {out}: identical" in capsys.readouterr().out


def test_sweep_at_rates_too_fast_to_judge_writes_its_document(tmp_path, capsys):
    """The rates of issue 25 (`--rates 100,200,300` on 100 requests of chat): every point's arrivals
    last under 3 service times, so no load check has a capacity; the sweep still ends, says so and
    writes its JSON (it used to raise KeyError 'capacity_req_s' after all points ran)."""
    out = tmp_path / "sweep.json"
    argv = ["sweep", "--policies", "fcfs", "--rates", "100,200,300", "--slo", "ttft=1", "--workload", "chat",
            "--max-requests", "100", "--no-progress", "--jobs", "1", "--json", str(out)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert [p["offered"]["rate_req_s"] for p in doc["points"]] == [100.0, 200.0, 300.0]
    check = doc["load_check"]
    assert check["capacity_req_s"] is None
    assert check["lowest_rate"]["kind"] == check["highest_rate"]["kind"] == "short"
    assert "the load cannot be judged" in capsys.readouterr().err
