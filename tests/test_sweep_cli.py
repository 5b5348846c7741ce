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


def test_knee_interpolates_the_crossing_in_log_rate():
    from metroline.core.experiments.sweep_seeds import knee

    # 95% at 10, 85% at 40: 90% is halfway in log rate, at 20
    assert knee([5.0, 10.0, 40.0], [1.0, 0.95, 0.85], 0.9) == pytest.approx(20.0)
    assert knee([5.0, 10.0], [0.5, 0.2], 0.9) is None  # below the grid
    assert knee([5.0, 10.0], [1.0, 0.95], 0.9) is None  # above it
    assert knee([5.0, 10.0], [0.95, None], 0.9) == pytest.approx(5.0 * 2 ** (0.05 / 0.95))  # None counts as 0


def test_sweep_over_seeds_gives_each_draws_knee_its_interval_and_the_paired_ratio(tmp_path, spec, capsys):
    out, report = tmp_path / "sweep.json", tmp_path / "report"
    rates = [0.9 * CAPACITY, 1.1 * CAPACITY, 1.5 * CAPACITY]
    argv = ["sweep", "--policies", "fcfs,srpt", "--rates", ",".join(map(str, rates)), "--slo", "ttft=0.06,tpot=0.015",
            "--seeds", "2", *common(spec), "--json", str(out), "--report", str(report)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["sweep"]["seeds"] == [0, 1]  # the spec has no seed: draws 0 and 1
    assert len(doc["points"]) == 2 * 2 * 3 and len({p["workload"]["seed"] for p in doc["points"]}) == 2
    for policy in ("fcfs", "srpt"):
        cap = doc["capacity"][policy]
        # the capacity is C on every draw (fixed lengths): each knee lies between 0.9 C and 1.1 C
        assert cap["out_of_range"] == 0 and all(rates[0] <= k <= rates[1] for k in cap["knee_req_s"])
        knee = cap["knee"]
        assert knee["low"] <= knee["estimate"] <= knee["high"] and knee["n"] == 2
        assert knee["estimate"] == pytest.approx(sum(cap["knee_req_s"]) / 2)
        assert [row["rate_req_s"] for row in doc["bands"][policy]] == rates
    ratio = doc["ratio"]["srpt"]
    assert ratio["vs"] == "fcfs"
    assert ratio["per_draw"] == pytest.approx([s / f for s, f in zip(doc["capacity"]["srpt"]["knee_req_s"],
                                                                      doc["capacity"]["fcfs"]["knee_req_s"])])
    assert ratio["ratio"]["low"] <= ratio["ratio"]["estimate"] <= ratio["ratio"]["high"]
    printed = capsys.readouterr().out
    assert "knee ratio srpt/fcfs" in printed and "2 draws" in printed
    assert (report / "attainment_bands.png").stat().st_size > 0 and "knee ratio" in (report / "report.md").read_text()


def test_sweep_without_a_seed_replays_the_trace_as_recorded(tmp_path):
    from test_compare_seeds import write_trace

    trace = write_trace(tmp_path / "trace.csv", n=120)
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--policies", "fcfs", "--rates", "5,10", "--slo", "e2e=10", "--workload", str(trace),
                     "--cost-model", "steps", "--step-time", "0.01", "--no-progress", "--jobs", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    times = [float(line.split(",")[0]) for line in trace.read_text().splitlines()[1:]]
    assert doc["sweep"]["native_rate_req_s"] == pytest.approx((len(times) - 1) / (times[-1] - times[0]))
    assert "seed" not in doc["sweep"]["workload"]


@pytest.mark.parametrize("argv, problem", [
    (["--rates", "auto", "--seeds", "3"], "--seeds: give --rates r1,r2,..."),
    (["--rates", "10", "--seeds", "3"], "--seeds: give at least two --rates"),
    (["--rates", "10,20", "--seeds", "1"], "--seeds: must be at least 2"),
])
def test_bad_seeded_sweeps_are_refused(spec, capsys, argv, problem):
    assert cli.main(["sweep", "--policies", "fcfs", "--slo", "ttft=1", *argv, *common(spec)]) == 2
    assert problem in capsys.readouterr().err
