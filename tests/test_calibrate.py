"""`metroline calibrate` and the `calibrated` cost model: the fit file round-trips, the fit is exact
on linear data, metroline's own `--steps-csv` is a step log the model fits, and the sweep times
the steps it should. No timing is asserted."""

from __future__ import annotations

import json
import random

import pytest

from metroline.cli import main
from metroline.executors.calibrate import QUICK_SWEEP, fit, fit_errors, predict
from metroline.executors.cost_models import FITTED, CalibratedCostModel, make_cost_model

TRUE = {"per_step": 3e-3, "per_prefill_token": 2.5e-4, "per_decode_token": 4e-4, "per_kv_token": 2e-7}


def _linear_samples(n: int = 60, seed: int = 1):
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        p, d = rng.choice([0, rng.randint(1, 2048)]), rng.randint(0, 64)
        if p == d == 0:
            d = 1
        c = p + d * rng.randint(16, 600)
        y = TRUE["per_step"] + TRUE["per_prefill_token"] * p + TRUE["per_decode_token"] * d + TRUE["per_kv_token"] * c
        samples.append((p, d, c, y))
    return samples


def test_fit_is_exact_on_linear_data_and_the_file_round_trips(tmp_path):
    samples = _linear_samples()
    model = fit(samples)
    for k in FITTED:
        assert model.coefficients()[k] == pytest.approx(TRUE[k], rel=1e-9), k
    assert model.r2 == pytest.approx(1.0, abs=1e-12) and model.num_samples == 60
    assert fit_errors(model, samples)["max_step_error"] < 1e-9
    path = tmp_path / "fit.json"
    model.save(path, note="extra keys are kept")
    loaded = make_cost_model("calibrated", path=str(path), per_copy_block=1e-5)
    assert loaded.coefficients() == model.coefficients()  # exactly: JSON floats round-trip
    assert (loaded.r2, loaded.num_samples) == (model.r2, 60)
    assert json.loads(path.read_text())["note"] == "extra keys are kept"
    d = loaded.describe()
    assert d["name"] == "calibrated" and d["source"] == str(path) and d["per_copy_block"] == 1e-5


def test_a_bad_fit_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"coefficients": {"per_step": 1.0}, "r2": 1, "num_samples": 3}')
    with pytest.raises(ValueError, match="bad.json: not a calibrated fit file.*per_prefill_token"):
        CalibratedCostModel.from_file(bad)


def test_metroline_steps_csv_is_a_step_log_calibrated_fits(tmp_path, capsys):
    # a simulated run on the linear model without context and block-op terms writes step
    # durations exactly linear in its prefill and decode tokens: the fit must give them back
    coef = {"per_step": 2e-3, "per_prefill_token": 1e-4, "per_decode_token": 5e-5}
    steps = tmp_path / "steps.csv"
    params = [f"--cost-param={k}={v}" for k, v in coef.items()]
    params += ["--cost-param=per_kv_token=0", "--cost-param=per_swap_block=0", "--cost-param=per_copy_block=0"]
    argv = ["run", "--workload", "mixed-64", "--groups", "1", "--max-num-seqs", "16", "--cost-model", "linear",
            *params, "--steps-csv", str(steps)]
    assert main(argv) == 0
    model = make_cost_model("calibrated", path=str(steps))
    for k, v in coef.items():
        assert model.coefficients()[k] == pytest.approx(v, rel=1e-6), k
    assert model.coefficients()["per_kv_token"] == 0.0  # no context_tokens column
    assert model.r2 == pytest.approx(1.0, abs=1e-9)
    # and the same run on the calibrated model takes the same (virtual) time
    argv_cal = ["run", "--workload", "mixed-64", "--groups", "1", "--max-num-seqs", "16",
                "--cost-model", "calibrated", "--cost-param", f"path={steps}", "--json", str(tmp_path / "c.json")]
    assert main(argv_cal) == 0
    assert main([*argv[:-2], "--json", str(tmp_path / "l.json")]) == 0
    cal = json.loads((tmp_path / "c.json").read_text())["summary"]
    lin = json.loads((tmp_path / "l.json").read_text())["summary"]
    assert cal["e2e_s"]["mean"] == pytest.approx(lin["e2e_s"]["mean"], rel=1e-6)


def test_calibrate_cli_times_the_sweep_on_a_tiny_model(tmp_path, capsys):
    from torch_helpers import tiny_llama

    tiny_llama(seed=0).save_pretrained(tmp_path / "tiny")
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--model", str(tmp_path / "tiny"), "--quick", "--repeats", "1", "--out", str(out),
            "--kv-memory", str(1 / 1024)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "fit error: mean" in printed and f"saved {out}" in printed
    doc = json.loads(out.read_text())
    # every quick shape (batch B, context C) fits one 2048-token prefill step, then 4 decode steps
    # whose sequences each attend to C + 1 .. C + 4 tokens
    expected = []
    for b, c in QUICK_SWEEP:
        assert b * c <= 2048
        expected.append((b, c, b * c, 0, b * c))
        expected += [(b, c, 0, b, b * (c + j)) for j in range(1, 5)]
    got = [(s["batch"], s["context"], s["prefill_tokens"], s["decode_tokens"], s["context_tokens"])
           for s in doc["samples"]]
    assert got == expected
    assert doc["num_samples"] == len(expected) == 25 and all(s["seconds"] > 0 for s in doc["samples"])
    model = make_cost_model("calibrated", path=str(out))
    samples = [(s["prefill_tokens"], s["decode_tokens"], s["context_tokens"], s["seconds"]) for s in doc["samples"]]
    refit = fit(samples)
    assert model.coefficients() == pytest.approx(refit.coefficients(), rel=1e-12)
    assert doc["fit_error"]["mean_step_error"] == pytest.approx(fit_errors(refit, samples)["mean_step_error"])
    assert predict(model, samples[0]) > 0
    assert main(["run", "--workload", "mixed-64", "--groups", "1", "--cost-model", "calibrated",
                 "--cost-param", f"path={out}"]) == 0
