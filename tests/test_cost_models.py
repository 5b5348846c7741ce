"""Cost models: exact arithmetic, roofline regimes, presets, validation, calibration."""

from __future__ import annotations

import csv
import random

import numpy as np

import pytest
from pydantic import ValidationError

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence
from metroline.core.step.plan import StepPlan
from metroline.executors.cost_models import (
    COST_MODELS,
    GPU_PRESETS,
    MODEL_PRESETS,
    CalibratedCostModel,
    LinearCostModel,
    RooflineCostModel,
    StepsCostModel,
    attention_pairs,
    fit_linear,
    make_cost_model,
)
from metroline.executors.cost_models.scaled import ScaledCostModel
from metroline.kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT


def make_plan(prefills=(), decodes=(), block_ops=(), block_size=16) -> StepPlan:
    """A plan with prefill chunks `(start, n)` and decodes of sequences with `ctx` cached tokens."""
    plan = StepPlan(0, block_size)
    for i, (start, n) in enumerate(prefills):
        s = Sequence(f"p{i}", [1] * (start + n), SamplingParams(), 0.0)
        s.num_computed_tokens = start
        plan.scheduled[s] = n
        plan.num_prefill_tokens += n
        plan.num_context_tokens += start + n
    for i, ctx in enumerate(decodes):
        s = Sequence(f"d{i}", [1] * ctx, SamplingParams(), 0.0)
        s.token_ids.append(2)
        s.num_computed_tokens = ctx
        plan.scheduled[s] = 1
        plan.num_decode_tokens += 1
        plan.num_context_tokens += ctx + 1
    plan.block_ops = list(block_ops)
    return plan


EMPTY = StepPlan(0, 16)


@pytest.mark.parametrize("name", ["steps", "linear", "roofline"])
def test_empty_step_costs_nothing(name):
    assert make_cost_model(name).step_time(EMPTY) == 0.0


def test_make_cost_model_unknown_name_lists_valid_names():
    valid = "valid: steps, linear, roofline, calibrated"
    with pytest.raises(ValueError, match=f"unknown cost model 'nope'; {valid}"):
        make_cost_model("nope")
    assert set(COST_MODELS) == {"steps", "linear", "roofline", "calibrated"}


# ---------------------------------------------------------------------------------------- steps


def test_steps_model():
    m = make_cost_model("steps", step_time=0.25)
    assert isinstance(m, StepsCostModel)
    assert m.step_time(make_plan(decodes=[3])) == 0.25
    assert m.step_time(make_plan(block_ops=[(COPY, 1, 2)])) == 0.25
    assert make_cost_model("steps").step_time(make_plan(prefills=[(0, 9)])) == 0.01
    assert m.describe() == {"name": "steps", "step_time": 0.25}


@pytest.mark.parametrize("name", ["steps", "linear", "roofline"])
def test_a_cost_models_parameters_are_frozen(name):
    """A model derives its constants from its config when built (roofline's FLOP/s and bytes per
    token): a parameter changed afterwards would be silently ignored, so changing one is an error
    naming it."""
    m = make_cost_model(name)
    field = next(iter(type(m.config).model_fields))
    with pytest.raises(ValidationError, match=rf"{field}\n.*frozen"):
        setattr(m.config, field, getattr(m.config, field))


def test_steps_model_rejects_bad_params():
    with pytest.raises(ValidationError, match=r"step_time\n.*greater than 0"):
        make_cost_model("steps", step_time=0)
    with pytest.raises(ValidationError, match=r"step_tme\n.*Extra inputs"):
        make_cost_model("steps", step_tme=1.0)


# --------------------------------------------------------------------------------------- linear

COEF = dict(per_step=1.0, per_prefill_token=0.5, per_decode_token=0.25, per_kv_token=0.125,
            per_swap_block=2.0, per_copy_block=4.0)


def test_linear_arithmetic():
    m = make_cost_model("linear", **COEF)
    ops = [(COPY, 1, 2), (SWAP_OUT, 3, 0), (SWAP_IN, 0, 4), (COPY, 5, 6), (SWAP_OUT, 7, 1)]
    plan = make_plan(prefills=[(0, 10), (16, 4)], decodes=[7, 30, 2], block_ops=ops)
    assert (plan.num_prefill_tokens, plan.num_decode_tokens, plan.num_context_tokens) == (14, 3, 72)
    assert m.step_time(plan) == 1.0 + 0.5 * 14 + 0.25 * 3 + 0.125 * 72 + 2.0 * 3 + 4.0 * 2


def test_linear_counters_without_sequences_and_block_ops_alone():
    m = LinearCostModel(**COEF)
    plan = StepPlan(3, 16)
    plan.num_prefill_tokens, plan.num_decode_tokens, plan.num_context_tokens = 8, 2, 40
    assert m.step_time(plan) == 1.0 + 4.0 + 0.5 + 5.0
    assert m.step_time(make_plan(block_ops=[(SWAP_IN, 0, 1)])) == 1.0 + 2.0


def test_linear_defaults_and_validation():
    d = LinearCostModel().describe()
    assert d["name"] == "linear" and set(d) == {"name", *COEF}
    assert all(v > 0 for k, v in d.items() if k != "name")
    with pytest.raises(ValidationError, match=r"per_kv_token\n.*greater than or equal to 0"):
        make_cost_model("linear", per_kv_token=-1e-9)


# ------------------------------------------------------------------------------------- roofline

A100 = GPU_PRESETS["A100"]
FLOPS_EFF, BW_EFF = 0.65, 0.7
"""roofline's default efficiencies (fitted to measured GPU timings: tests/test_default_cost_model.py)"""


def test_presets_named_and_shapes_plausible():
    assert set(MODEL_PRESETS) == {"llama-3-8b", "llama-2-7b", "llama-2-70b", "llama-3-70b", "smollm2-135m"}
    assert set(GPU_PRESETS) == {"A100", "H100", "H200"}
    assert (A100.flops, A100.bandwidth) == (312e12, 2.039e12)
    assert (GPU_PRESETS["H100"].flops, GPU_PRESETS["H100"].bandwidth) == (989e12, 3.35e12)
    assert (GPU_PRESETS["H200"].flops, GPU_PRESETS["H200"].bandwidth) == (989e12, 4.8e12)
    params = {k: s.num_params for k, s in MODEL_PRESETS.items()}
    for name, expected in [("llama-3-8b", 8.03e9), ("llama-2-7b", 6.74e9), ("llama-3-70b", 70.6e9), ("llama-2-70b", 68.98e9),
                           ("smollm2-135m", 134.5e6)]:
        assert params[name] == pytest.approx(expected, rel=0.005), name
    assert MODEL_PRESETS["llama-3-8b"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_every_preset_splits_its_hidden_size_over_its_heads():
    """In each model's config.json the attention heads split the hidden size: num_heads x head_dim
    = hidden_size; llama-2-7b's KV heads are all 32 of its heads (no grouping)."""
    for name, s in MODEL_PRESETS.items():
        assert s.num_heads * s.head_dim == s.hidden_size, name
    assert MODEL_PRESETS["llama-2-7b"].kv_bytes_per_token == 2 * 32 * 32 * 128 * 2


@pytest.mark.parametrize("factor", [0, 0.0, -1.0, float("inf"), float("nan"), "1.03", None])
def test_a_slowdown_must_be_a_finite_number_above_zero(factor):
    with pytest.raises(ValueError, match=r"slowdown: must be a number > 0 \(1.03 is 3% slower\), got "):
        ScaledCostModel(make_cost_model("steps"), factor)


def test_a_slowdown_scales_every_step_and_the_fixed_step_time():
    m = ScaledCostModel(make_cost_model("steps", step_time=0.25), 1.5)
    assert m.step_time(make_plan(decodes=[3])) == 0.375 and m.fixed_step_time == 0.375
    assert m.describe() == {"name": "steps", "step_time": 0.25, "slowdown": 1.5}


def test_roofline_decode_is_memory_bound():
    m = RooflineCostModel()
    shape = MODEL_PRESETS["llama-3-8b"]
    for batch in (1, 32):
        plan = make_plan(decodes=[128] * batch)
        compute, memory, transfer = m.breakdown(plan)
        assert compute < memory and transfer == 0.0
        kv = shape.kv_bytes_per_token * (plan.num_context_tokens + batch)
        expected = (shape.weight_bytes + kv) / (A100.bandwidth * BW_EFF) + 5e-4
        assert m.step_time(plan) == pytest.approx(expected)
        assert kv < 0.05 * shape.weight_bytes
    kv_read = 64 * 4097 * shape.kv_bytes_per_token
    long_ctx = make_plan(decodes=[4096] * 64)
    assert m.breakdown(long_ctx)[1] > (shape.weight_bytes + kv_read) / (A100.bandwidth * BW_EFF)


def test_roofline_large_prefill_is_compute_bound():
    m = RooflineCostModel()
    shape = MODEL_PRESETS["llama-3-8b"]
    plan = make_plan(prefills=[(0, 8192)])
    compute, memory, _ = m.breakdown(plan)
    assert compute > 10 * memory
    flops = 2 * shape.num_layers * shape.layer_params * 8192
    assert m.step_time(plan) == pytest.approx(flops / (A100.flops * FLOPS_EFF), rel=0.2)
    assert m.step_time(plan) > flops / (A100.flops * FLOPS_EFF) + 5e-4


def test_roofline_monotonic_in_tokens():
    m = RooflineCostModel()
    for plans in (
        [make_plan(prefills=[(0, n)]) for n in (1, 16, 256, 1024, 4096, 16384)],
        [make_plan(decodes=[512] * b) for b in (1, 8, 64, 256, 1024, 4096)],
        [make_plan(decodes=[c] * 64) for c in (1, 1000, 10000, 100000)],
        [make_plan(prefills=[(s, 512)], decodes=[100] * 8) for s in (0, 4096, 32768)],
    ):
        times = [m.step_time(p) for p in plans]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_rooflineattention_pairs_are_causal():
    assert attention_pairs(make_plan(prefills=[(100, 50)])) == 50 * 100 + 50 * 51 // 2
    assert attention_pairs(make_plan(prefills=[(0, 4)], decodes=[9, 19])) == 10 + 10 + 20
    assert attention_pairs(make_plan(decodes=[9, 19])) == 30
    counters_only = StepPlan(0, 16)
    counters_only.num_prefill_tokens, counters_only.num_context_tokens = 8, 8
    assert attention_pairs(counters_only) == 64


TOY = dict(num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4, intermediate_size=16,
           vocab_size=100)
"""A shape small enough to price by hand: a layer's matmuls hold 8 x (2 x 8 + 2 x 4) + 3 x 8 x 16 = 576
weights; an LM-head row is 100 x 8."""


def drafting_decode(ctx: int, k: int) -> StepPlan:
    """One decode after `ctx` computed tokens verifying `k` drafts: `1 + k` tokens at positions
    `ctx .. ctx + k`, counted as the scheduler counts them (`StepPlan`'s docstring)."""
    plan = StepPlan(0, 16)
    s = Sequence("d", [1] * ctx, SamplingParams(), 0.0)
    s.token_ids.append(2)
    s.num_computed_tokens = ctx
    plan.scheduled[s] = 1 + k
    plan.decodes.add(s)
    plan.drafts[s] = k
    plan.num_draft_tokens = k
    plan.num_decode_tokens = 1 + k
    plan.num_context_tokens = ctx + 1 + k
    return plan


def test_roofline_prices_each_draft_as_a_token_an_attention_row_and_a_logit_row():
    """A decode after 10 tokens verifying 3 drafts computes 4 tokens, attends 4 x 10 + 4 x 5 / 2 = 50
    query-key pairs under the causal mask (not the 14 context tokens a plain decode reads), and
    needs a logit row per draft besides its own: 4 rows. On a GPU of 1e6 FLOP/s at full
    efficiency (compute-bound): 2 x 2 x 576 FLOP a token, 2 x 100 x 8 a logit row, 4 x 2 layers
    x 2 heads x 4 dims a pair: (4 x 2,304 + 4 x 1,600 + 50 x 64) / 1e6 s."""
    m = make_cost_model("roofline", model=TOY, gpu={"flops": 1e6, "bandwidth": 1e12}, flops_efficiency=1.0,
                        bandwidth_efficiency=1.0, overhead=0.0)
    plan = drafting_decode(10, 3)
    assert attention_pairs(plan) == 50
    compute, memory, transfer = m.breakdown(plan)
    assert compute == pytest.approx((4 * 2_304 + 4 * 1_600 + 50 * 64) / 1e6, rel=1e-12)
    assert compute > memory and transfer == 0.0
    # the same 4 tokens as a prefill chunk: the same pairs, one logit row
    chunk = make_plan(prefills=[(10, 4)])
    assert attention_pairs(chunk) == 50
    assert m.breakdown(chunk)[0] == pytest.approx((4 * 2_304 + 1 * 1_600 + 50 * 64) / 1e6, rel=1e-12)
    assert m.step_time(plan) - m.step_time(chunk) == pytest.approx(3 * 1_600 / 1e6, rel=1e-9)
    # without drafts a decode is one token, one row, and its context's pairs
    assert attention_pairs(drafting_decode(10, 0)) == 11
    assert m.breakdown(drafting_decode(10, 0))[0] == pytest.approx((2_304 + 1_600 + 11 * 64) / 1e6, rel=1e-12)


def test_roofline_gpus_models_and_block_ops():
    decode = make_plan(decodes=[1000] * 16)
    times = {g: make_cost_model("roofline", gpu=g).step_time(decode) for g in GPU_PRESETS}
    assert times["A100"] > times["H100"] > times["H200"]
    assert (make_cost_model("roofline", model="llama-3-70b").step_time(decode)
            > make_cost_model("roofline").step_time(decode)
            > make_cost_model("roofline", model="smollm2-135m").step_time(decode))
    m = make_cost_model("roofline", overhead=0.0, host_bandwidth=1e9)
    block = 2 * 32 * 8 * 128 * 2 * 16
    swaps = make_plan(block_ops=[(SWAP_OUT, 0, 0), (SWAP_IN, 1, 1)])
    assert m.step_time(swaps) == pytest.approx(2 * block / 1e9)
    copy = make_plan(block_ops=[(COPY, 0, 1)])
    assert m.step_time(copy) == pytest.approx(2 * block / (A100.bandwidth * BW_EFF))


def test_roofline_custom_shape_and_describe():
    shape = dict(MODEL_PRESETS["smollm2-135m"].model_dump(), num_layers=60)
    m = make_cost_model("roofline", model=shape, gpu={"flops": 1e12, "bandwidth": 1e11})
    assert m.shape.num_layers == 60 and m.gpu.flops == 1e12
    d = make_cost_model("roofline", model="llama-2-7b", gpu="H100").describe()
    assert d["name"] == "roofline" and d["model"] == "llama-2-7b" and d["gpu"] == "H100"
    assert d["model_shape"]["num_kv_heads"] == 32 and d["gpu_spec"]["bandwidth"] == 3.35e12
    assert (d["flops_efficiency"], d["bandwidth_efficiency"], d["overhead"]) == (FLOPS_EFF, BW_EFF, 5e-4)


def test_roofline_rejects_bad_params():
    valid = "valid: llama-3-8b, llama-2-7b, llama-2-70b, llama-3-70b, smollm2-135m"
    with pytest.raises(ValueError, match=rf"model\n.*unknown model preset 'gpt-5'; {valid}"):
        make_cost_model("roofline", model="gpt-5")
    with pytest.raises(ValueError, match=r"gpu\n.*unknown gpu preset 'V100'; valid: A100, H100"):
        make_cost_model("roofline", gpu="V100")
    with pytest.raises(ValidationError, match=r"flops_efficiency\n.*less than or equal to 1"):
        make_cost_model("roofline", flops_efficiency=1.5)
    with pytest.raises(ValidationError, match=r"bandwidth_efficiency\n.*greater than 0"):
        make_cost_model("roofline", bandwidth_efficiency=0)
    with pytest.raises(ValidationError, match=r"num_layers\n.*greater than 0"):
        shape = dict(MODEL_PRESETS["llama-3-8b"].model_dump(), num_layers=0)
        make_cost_model("roofline", model=shape)


# ----------------------------------------------------------------------------------- calibrated

TRUE = {"per_step": 4e-3, "per_prefill_token": 1.2e-4, "per_decode_token": 3e-5,
        "per_kv_token": 5e-8}


def write_log(path, coef, n=200, context=True, seed=0, noise=0.0, prefill=True):
    rng = random.Random(seed)
    cols = ["prefill_tokens", "decode_tokens", "duration_s"] + ["context_tokens"] * context
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols + ["step"])
        for i in range(n):
            p, d = (rng.randint(0, 2048) if prefill else 0), rng.randint(0, 256)
            c = rng.randint(p + d, p + d + 200_000)
            y = (coef["per_step"] + coef["per_prefill_token"] * p + coef["per_decode_token"] * d
                 + (coef["per_kv_token"] * c if context else 0.0))
            y *= 1.0 + rng.gauss(0.0, noise)
            w.writerow([p, d, repr(y)] + ([c] if context else []) + [i])
    return path


def test_calibrated_recovers_coefficients(tmp_path):
    m = CalibratedCostModel.from_steps_csv(write_log(tmp_path / "steps.csv", TRUE))
    d = m.describe()
    for k, v in TRUE.items():
        assert d[k] == pytest.approx(v, rel=1e-9), k
    assert d["r2"] == pytest.approx(1.0, abs=1e-12) and d["num_samples"] == 200
    assert d["name"] == "calibrated" and d["source"].endswith("steps.csv")
    assert d["per_swap_block"] == 0.0 and d["per_copy_block"] == 0.0
    plan = make_plan(prefills=[(0, 100)], decodes=[50, 60])
    expected = (TRUE["per_step"] + TRUE["per_prefill_token"] * 100 + TRUE["per_decode_token"] * 2
                + TRUE["per_kv_token"] * plan.num_context_tokens)
    assert m.step_time(plan) == pytest.approx(expected, rel=1e-9)


def test_calibrated_without_context_or_prefill(tmp_path):
    m = make_cost_model("calibrated", path=str(write_log(tmp_path / "a.csv", TRUE, context=False)),
                        per_swap_block=1e-4)
    d = m.describe()
    assert d["per_kv_token"] == 0.0 and d["per_swap_block"] == 1e-4
    for k in ("per_step", "per_prefill_token", "per_decode_token"):
        assert d[k] == pytest.approx(TRUE[k], rel=1e-9)
    log = write_log(tmp_path / "b.csv", TRUE, prefill=False)
    d = CalibratedCostModel.from_steps_csv(log).describe()
    assert d["per_prefill_token"] == 0.0
    assert d["per_decode_token"] == pytest.approx(TRUE["per_decode_token"], rel=1e-9)


def test_calibrated_clamps_negative_coefficients_and_refits(tmp_path):
    neg = dict(TRUE, per_decode_token=-2e-6)
    d = CalibratedCostModel.from_steps_csv(write_log(tmp_path / "n.csv", neg)).describe()
    assert d["per_decode_token"] == 0.0
    assert all(d[k] >= 0.0 for k in TRUE) and 0.9 < d["r2"] < 1.0


def test_calibrated_noisy_fit(tmp_path):
    log = write_log(tmp_path / "z.csv", TRUE, n=2000, noise=0.02)
    d = CalibratedCostModel.from_steps_csv(log).describe()
    assert 0.9 < d["r2"] < 1.0
    for k, v in TRUE.items():
        assert d[k] == pytest.approx(v, rel=0.1), k


def test_calibrated_fits_relative_errors_as_numpy_weighted_least_squares_does(tmp_path):
    """The fit minimises squared relative errors: numpy's least squares on the rows divided by
    their durations gives the same coefficients (all positive here, so no clamping), and an
    absolute fit of the same noisy log gives other ones (the long steps would dominate it)."""
    path = write_log(tmp_path / "steps.csv", TRUE, n=120, seed=5, noise=0.2)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    x = np.array([[1.0, float(r["prefill_tokens"]), float(r["decode_tokens"]), float(r["context_tokens"])]
                  for r in rows])
    y = np.array([float(r["duration_s"]) for r in rows])
    relative = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)[0]
    absolute = np.linalg.lstsq(x, y, rcond=None)[0]
    assert np.all(relative > 0) and np.all(absolute > 0)
    fitted = CalibratedCostModel.from_steps_csv(path).coefficients()
    got = np.array([fitted[k] for k in ("per_step", "per_prefill_token", "per_decode_token", "per_kv_token")])
    assert got == pytest.approx(relative, rel=1e-6)
    assert np.max(np.abs(absolute / relative - 1)) > 0.01


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_fit_linear_equals_numpys_least_squares(k):
    """Unconstrained (every coefficient positive), the fit is the least-squares solution: numpy's
    `lstsq` on the same rows, to 1e-10, for 2 to 5 columns of mixed scales."""
    rng = np.random.default_rng(k)
    x = np.column_stack([np.ones(40)] + [rng.uniform(0, 10.0 ** j, 40) for j in range(1, k)])
    y = x @ (np.linspace(1.0, 2.0, k) / 10.0 ** np.arange(k)) + rng.normal(0, 0.01, 40)
    expected = np.linalg.lstsq(x, y, rcond=None)[0]
    assert np.all(expected > 0)
    coef, r2 = fit_linear(x.tolist(), y.tolist())
    assert coef == pytest.approx(expected, rel=1e-10)
    assert r2 == pytest.approx(1 - np.sum((y - x @ expected) ** 2) / np.sum((y - y.mean()) ** 2), rel=1e-10)


def test_the_gaussian_elimination_equals_numpys_solve():
    """`_solve` alone (its caller's refinement step would mask an error in one component): numpy's
    `solve` on random well-conditioned systems of 1 to 5 unknowns, to 1e-10."""
    from metroline.executors.cost_models.least_squares import _solve

    rng = np.random.default_rng(0)
    for k in range(1, 6):
        a = rng.normal(size=(k, k)) + k * np.eye(k)
        b = rng.normal(size=k)
        assert _solve(a.tolist(), b.tolist()) == pytest.approx(np.linalg.solve(a, b), rel=1e-10, abs=1e-12)
    # a zero on the diagonal needs the row swap of partial pivoting (the largest pivot)
    assert _solve([[0.0, 1.0], [1.0, 0.0]], [2.0, 3.0]) == [3.0, 2.0]
    assert _solve([[1e-3, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], [1.0, 2.0, 3.0]) == pytest.approx(
        np.linalg.solve([[1e-3, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0]], [1.0, 2.0, 3.0]), rel=1e-10)


def test_calibrated_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("prefill_tokens,duration_s\n1,0.1\n")
    with pytest.raises(ValueError, match="missing column.*decode_tokens"):
        CalibratedCostModel.from_steps_csv(bad)
    bad.write_text("prefill_tokens,decode_tokens,duration_s\n1,2,x\n")
    with pytest.raises(ValueError, match=r"bad.csv:2"):
        CalibratedCostModel.from_steps_csv(bad)
    bad.write_text("prefill_tokens,decode_tokens,duration_s\n")
    with pytest.raises(ValueError, match="no rows"):
        CalibratedCostModel.from_steps_csv(bad)
    with pytest.raises(ValidationError, match=r"path\n.*Field required"):
        make_cost_model("calibrated")
    with pytest.raises(ValueError, match="cannot separate"):
        fit_linear([[1.0, 2.0, 2.0], [1.0, 3.0, 3.0], [1.0, 5.0, 5.0]], [1.0, 2.0, 3.0])


def test_a_relative_fit_minimises_the_relative_errors():
    """y ~ b x on the points (1, 1) and (1, 2): absolutely, b = sum(x y) / sum(x^2) = 1.5;
    relatively, minimising sum((b x / y - 1)^2) gives b = sum(x / y) / sum((x / y)^2) = 1.5 / 1.25
    = 1.2. R2 stays that of the data as given: 1 - ((0.2)^2 + (0.8)^2) / 0.5 = -0.36."""
    b, r2 = fit_linear([[1.0], [1.0]], [1.0, 2.0])
    assert b == pytest.approx([1.5]) and r2 == pytest.approx(0.0)
    b, r2 = fit_linear([[1.0], [1.0]], [1.0, 2.0], relative=True)
    assert b == pytest.approx([1.2]) and r2 == pytest.approx(-0.36)
    # a y of 0 is weighted as the smallest positive y (1): minimising b^2 + (b - 1)^2 + (b / 2 - 1)^2
    # gives 2.25 b = 1.5
    b, _ = fit_linear([[1.0], [1.0], [1.0]], [0.0, 1.0, 2.0], relative=True)
    assert b == pytest.approx([2 / 3])


@pytest.mark.parametrize("delta, separable", [(3e-5, False), (1e-4, True)])
def test_the_collinearity_tolerance_is_relative_to_the_largest_column(delta, separable):
    """1,000 steps where two columns are equal but for `delta` in one step, and one step where
    only a third column is set (orthogonal to both). Scaled to a max of 1, the Gram matrix has the
    diagonal (1000, ~1000, 1); eliminating the first column leaves the second a pivot of
    delta^2 * 999 / 1000 (8.99e-10 for 3e-5, 9.99e-9 for 1e-4), against a tolerance of 1e-12 times
    the largest diagonal entry, 1e-9: the first is refused as collinear, the second is fitted. (A
    tolerance taken from the smallest entry, 1e-12, would fit both.)"""
    n = 1000
    xs = [[1.0, 1.0 - (delta if i == 0 else 0.0), 0.0] for i in range(n)] + [[0.0, 0.0, 1.0]]
    ys = [2.0 * x[0] + 3.0 * x[1] + 5.0 * x[2] for x in xs]
    if not separable:
        with pytest.raises(ValueError, match="cannot separate"):
            fit_linear(xs, ys)
        return
    coef, r2 = fit_linear(xs, ys)
    assert coef == pytest.approx([2.0, 3.0, 5.0], rel=1e-6) and r2 == pytest.approx(1.0)
