"""Cost models: how many seconds a step plan takes, for the simulated executor.

`make_cost_model(name, **params)` builds one by name:

- `steps`: a fixed time per step.
- `linear`: per-step, per-token and per-block terms added up.
- `roofline`: the slower of compute and memory traffic for a model shape on a GPU.
- `calibrated`: the linear model fitted to a real executor (a `metroline calibrate` fit file, or a
  real run's step log).

Every model costs an empty step (nothing scheduled, no block ops) 0 seconds. Parameters are checked
by pydantic (`extra="forbid"`), so a typo or an out-of-range value is an error naming the field.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Protocol, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.plan import StepPlan
from .base import count_block_ops


class CostModel(Protocol):
    """`step_time(plan)`: seconds the plan takes; `describe()`: name and parameters, JSON-ready."""

    def step_time(self, plan: StepPlan) -> float: ...

    def describe(self) -> dict: ...


def _is_empty(plan: StepPlan) -> bool:
    return not plan.scheduled and not plan.block_ops and not plan.num_tokens


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------- steps


class StepsConfig(_Config):
    """`step_time`: seconds per non-empty step."""

    step_time: float = Field(default=0.01, gt=0.0)


class StepsCostModel:
    """Every non-empty step costs `step_time` seconds: the clock counts steps.

    `fixed_step_time` tells the simulated executor that every non-empty step costs the same, so
    it keeps an integer step count and its clock reads exact multiples of the step time."""

    name = "steps"

    def __init__(self, **params: Any) -> None:
        self.config = StepsConfig(**params)
        self._dt = self.config.step_time
        self.fixed_step_time = self._dt

    def step_time(self, plan: StepPlan) -> float:
        return 0.0 if _is_empty(plan) else self._dt

    def describe(self) -> dict:
        return {"name": self.name, **self.config.model_dump()}


# --------------------------------------------------------------------------------------- linear


class LinearConfig(_Config):
    """Coefficients of the linear model, in seconds.

    The defaults are estimates for Llama-3-8B in bf16 on one A100 80GB SXM, derived from its
    datasheet (312 TFLOP/s dense bf16, 2.039 TB/s HBM) at 60% of peak FLOP/s and 80% of peak
    bandwidth, not measured:

    - `per_step` 9 ms: reading ~15 GB of matmul weights once per forward.
    - `per_prefill_token` 86 us: 2 x 8e9 FLOPs per token at 187 TFLOP/s.
    - `per_decode_token` 40 us: decode batches sit between memory-bound (marginal cost ~0) and
      compute-bound (86 us); halfway.
    - `per_kv_token` 80 ns: 128 KiB of K and V per context token (2 x 32 layers x 8 KV heads x 128
      x 2 bytes) read at 1.6 TB/s.
    - `per_swap_block` 84 us: a 16-token block (2 MiB) over a 25 GB/s host link, per swap out or in.
    - `per_copy_block` 2.6 us: reading and writing 2 MiB in HBM (copy-on-write).
    """

    per_step: float = Field(default=9e-3, ge=0.0)
    per_prefill_token: float = Field(default=8.6e-5, ge=0.0)
    per_decode_token: float = Field(default=4e-5, ge=0.0)
    per_kv_token: float = Field(default=8e-8, ge=0.0)
    per_swap_block: float = Field(default=8.4e-5, ge=0.0)
    per_copy_block: float = Field(default=2.6e-6, ge=0.0)


class LinearCostModel:
    """`per_step + per_prefill_token x prefill + per_decode_token x decode + per_kv_token x context
    tokens + per_swap_block x (swap outs + swap ins) + per_copy_block x copies`.

    Coefficients and their defaults: `LinearConfig`.
    """

    name = "linear"

    def __init__(self, **params: Any) -> None:
        self.config = c = LinearConfig(**params)
        self._coef = (c.per_step, c.per_prefill_token, c.per_decode_token, c.per_kv_token)
        self._swap, self._copy = c.per_swap_block, c.per_copy_block

    def step_time(self, plan: StepPlan) -> float:
        if _is_empty(plan):
            return 0.0
        step, prefill, decode, kv = self._coef
        t = (step + prefill * plan.num_prefill_tokens + decode * plan.num_decode_tokens
             + kv * plan.num_context_tokens)
        if plan.block_ops:
            copies, outs, ins = count_block_ops(plan.block_ops)
            t += self._swap * (outs + ins) + self._copy * copies
        return t

    def describe(self) -> dict:
        return {"name": self.name, **self.config.model_dump()}


# ------------------------------------------------------------------------------------- roofline


class ModelShape(_Config):
    """A decoder-only transformer with grouped-query attention and a gated (SwiGLU) MLP."""

    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    bytes_per_param: float = Field(default=2.0, gt=0.0)
    tie_word_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        """Matmul weights of one layer: q, k, v, o projections and the gate, up, down MLP."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.hidden_size * (2 * q + 2 * kv) + 3 * self.hidden_size * self.intermediate_size

    @property
    def num_params(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.num_layers * self.layer_params + embeddings + norms

    @property
    def weight_bytes(self) -> float:
        """Bytes one forward reads: every layer's matmul weights and the LM head."""
        params = self.num_layers * self.layer_params + self.vocab_size * self.hidden_size
        return params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param


class GpuSpec(_Config):
    """`flops`: peak dense bf16 FLOP/s; `bandwidth`: peak device memory bytes/s."""

    flops: float = Field(gt=0.0)
    bandwidth: float = Field(gt=0.0)


MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                             head_dim=128, intermediate_size=14336, vocab_size=128256),
    "llama-2-7b": ModelShape(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                             head_dim=128, intermediate_size=11008, vocab_size=32000),
    "llama-3-70b": ModelShape(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                              head_dim=128, intermediate_size=28672, vocab_size=128256),
    "smollm2-135m": ModelShape(num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3,
                               head_dim=64, intermediate_size=1536, vocab_size=49152,
                               tie_word_embeddings=True),
}
"""Shapes from each model's Hugging Face `config.json`."""

GPU_PRESETS: dict[str, GpuSpec] = {
    "A100": GpuSpec(flops=312e12, bandwidth=2.039e12),
    "H100": GpuSpec(flops=989e12, bandwidth=3.35e12),
    "H200": GpuSpec(flops=989e12, bandwidth=4.8e12),
}
"""NVIDIA datasheet peaks, SXM parts (A100 is the 80GB one), dense bf16."""


class RooflineConfig(_Config):
    """`model` and `gpu`: a preset name or a full `ModelShape` / `GpuSpec`. The efficiencies scale
    the peaks; `overhead` is seconds per step (launches, scheduling); `host_bandwidth` is the host
    link in bytes/s for swaps.
    """

    model: Union[str, ModelShape] = "llama-3-8b"
    gpu: Union[str, GpuSpec] = "A100"
    flops_efficiency: float = Field(default=0.6, gt=0.0, le=1.0)
    bandwidth_efficiency: float = Field(default=0.8, gt=0.0, le=1.0)
    overhead: float = Field(default=5e-4, ge=0.0)
    host_bandwidth: float = Field(default=25e9, gt=0.0)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | ModelShape) -> str | ModelShape:
        if isinstance(v, str) and v not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {v!r}; valid: {', '.join(MODEL_PRESETS)}")
        return v

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | GpuSpec) -> str | GpuSpec:
        if isinstance(v, str) and v not in GPU_PRESETS:
            raise ValueError(f"unknown gpu preset {v!r}; valid: {', '.join(GPU_PRESETS)}")
        return v


def _attention_pairs(plan: StepPlan) -> float:
    """Query-key pairs the step's attention computes under the causal mask.

    A sequence computing `n` tokens after `start` cached ones attends `n x start + n(n+1)/2` pairs.
    A decode-only step (n = 1 each) has exactly `num_context_tokens` pairs, found in O(1); a step
    with prefill walks its sequences. A hand-built plan with counters but no `scheduled` falls back
    to `num_tokens x num_context_tokens / max(1, num_seqs)` (exact for one full-context sequence,
    ignoring the mask).
    """
    if not plan.num_prefill_tokens:
        return plan.num_context_tokens
    if plan.scheduled:
        return sum(n * s.num_computed_tokens + n * (n + 1) // 2 for s, n in plan.scheduled.items())
    return plan.num_tokens * plan.num_context_tokens / max(1, plan.num_seqs)


class RooflineCostModel:
    """Step time = max(compute time, memory time) + overhead + block-op transfer time.

    - compute: `2 x layer params x tokens + 2 x LM-head params x num_seqs` (logits for each
      scheduled sequence) `+ 4 x layers x num_heads x head_dim x attention pairs` (QK^T and AV; see
      `_attention_pairs`), at `gpu.flops x flops_efficiency`.
    - memory: the weights once, plus KV read (`kv_bytes_per_token x num_context_tokens`) and
      written (`kv_bytes_per_token x num_tokens`), at `gpu.bandwidth x bandwidth_efficiency`.
      Activations are ignored.
    - block ops, run before the forward and not overlapped with it: each swap moves one block
      (`kv_bytes_per_token x block_size`) over the host link; each copy reads and writes one block
      in device memory.
    """

    name = "roofline"

    def __init__(self, **params: Any) -> None:
        self.config = c = RooflineConfig(**params)
        self.shape = s = MODEL_PRESETS[c.model] if isinstance(c.model, str) else c.model
        self.gpu = g = GPU_PRESETS[c.gpu] if isinstance(c.gpu, str) else c.gpu
        self._flops = g.flops * c.flops_efficiency
        self._bandwidth = g.bandwidth * c.bandwidth_efficiency
        self._flops_per_token = 2.0 * s.layer_params * s.num_layers
        self._flops_per_logit_row = 2.0 * s.vocab_size * s.hidden_size
        self._flops_per_pair = 4.0 * s.num_layers * s.num_heads * s.head_dim
        self._weight_bytes = s.weight_bytes
        self._kv_bytes = s.kv_bytes_per_token

    def breakdown(self, plan: StepPlan) -> tuple[float, float, float]:
        """`(compute_s, memory_s, block_ops_s)` of the plan, before the overhead."""
        compute = memory = transfer = 0.0
        n = plan.num_tokens
        if n:
            flops = (self._flops_per_token * n + self._flops_per_logit_row * plan.num_seqs
                     + self._flops_per_pair * _attention_pairs(plan))
            compute = flops / self._flops
            kv_bytes = self._kv_bytes * (plan.num_context_tokens + n)
            memory = (self._weight_bytes + kv_bytes) / self._bandwidth
        if plan.block_ops:
            copies, outs, ins = count_block_ops(plan.block_ops)
            block = self._kv_bytes * plan.block_size
            transfer = (block * (outs + ins) / self.config.host_bandwidth
                        + 2 * block * copies / self._bandwidth)
        return compute, memory, transfer

    def step_time(self, plan: StepPlan) -> float:
        if _is_empty(plan):
            return 0.0
        compute, memory, transfer = self.breakdown(plan)
        return max(compute, memory) + transfer + self.config.overhead

    def describe(self) -> dict:
        return {
            "name": self.name,
            **self.config.model_dump(),
            "model_shape": self.shape.model_dump(),
            "gpu_spec": self.gpu.model_dump(),
            "num_params": self.shape.num_params,
        }


# ----------------------------------------------------------------------------------- calibrated


class CalibratedConfig(_Config):
    """`path`: a fit file (`.json`, written by `metroline calibrate`) or a step log CSV to fit
    (metroline's own `--steps-csv`, or any CSV with the `STEP_LOG_COLUMNS`). Block ops are not in
    a log: their costs are given here (seconds per swapped block and per copied block, 0 unless
    set)."""

    path: str
    per_swap_block: float = Field(default=0.0, ge=0.0)
    per_copy_block: float = Field(default=0.0, ge=0.0)


FITTED = ("per_step", "per_prefill_token", "per_decode_token", "per_kv_token")
STEP_LOG_COLUMNS = ("prefill_tokens", "decode_tokens", "duration_s")


class CalibratedCostModel(LinearCostModel):
    """The linear model with `FITTED` coefficients fitted to a real run's step log.

    Build it with `from_steps_csv(path)`. `r2` is the fit's coefficient of determination on the
    log, `num_samples` its number of steps, `source` where it came from.
    """

    name = "calibrated"

    def __init__(self, *, r2: float, num_samples: int, source: str | None = None, **params: Any):
        super().__init__(**params)
        self.r2, self.num_samples, self.source = r2, num_samples, source

    @classmethod
    def from_steps_csv(
        cls, path: str | Path, *, per_swap_block: float = 0.0, per_copy_block: float = 0.0
    ) -> CalibratedCostModel:
        """Fit a CSV with columns `prefill_tokens,decode_tokens,duration_s` and optionally
        `context_tokens` (without it, `per_kv_token` is 0); other columns are ignored.

        Ordinary least squares (see `fit_linear`); coefficients are kept at or above 0.
        """
        xs, ys = read_step_log(path)
        coef, r2 = fit_linear(xs, ys)
        coef += [0.0] * (len(FITTED) - len(coef))
        return cls(r2=r2, num_samples=len(ys), source=str(path), per_swap_block=per_swap_block,
                   per_copy_block=per_copy_block, **dict(zip(FITTED, coef)))

    @classmethod
    def from_file(
        cls, path: str | Path, *, per_swap_block: float = 0.0, per_copy_block: float = 0.0
    ) -> CalibratedCostModel:
        """A fit file (`.json`: its coefficients as saved, `save`) or a step log (fitted now)."""
        if str(path).lower().endswith(".json"):
            with open(path) as f:
                data = json.load(f)
            try:
                coef = {k: float(data["coefficients"][k]) for k in FITTED}
                r2, num_samples = float(data["r2"]), int(data["num_samples"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}: not a calibrated fit file (need coefficients "
                                 f"{', '.join(FITTED)}, r2, num_samples): {e!r}") from None
            return cls(r2=r2, num_samples=num_samples, source=str(path), per_swap_block=per_swap_block,
                       per_copy_block=per_copy_block, **coef)
        return cls.from_steps_csv(path, per_swap_block=per_swap_block, per_copy_block=per_copy_block)

    def coefficients(self) -> dict[str, float]:
        """The fitted coefficients by name (`FITTED`)."""
        return {k: getattr(self.config, k) for k in FITTED}

    def save(self, path: str | Path, **extra: Any) -> None:
        """Write the fit file `from_file` reads back: coefficients, r2, num_samples, and `extra`."""
        doc = {"cost_model": self.name, "coefficients": self.coefficients(), "r2": self.r2,
               "num_samples": self.num_samples, **extra}
        with open(path, "w") as f:
            json.dump(doc, f, indent=2, allow_nan=False)
            f.write("\n")

    def describe(self) -> dict:
        return {"name": self.name, "source": self.source, "num_samples": self.num_samples,
                "r2": self.r2, **self.config.model_dump()}


def read_step_log(path: str | Path) -> tuple[list[list[float]], list[float]]:
    """Rows `[1, prefill_tokens, decode_tokens(, context_tokens)]` and durations of a step log."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames or []
        missing = [c for c in STEP_LOG_COLUMNS if c not in fields]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; a step log needs "
                f"{', '.join(STEP_LOG_COLUMNS)} and optionally context_tokens"
            )
        cols = ["prefill_tokens", "decode_tokens"]
        if "context_tokens" in fields:
            cols.append("context_tokens")
        xs, ys = [], []
        for line, row in enumerate(reader, start=2):
            try:
                xs.append([1.0] + [float(row[c]) for c in cols])
                ys.append(float(row["duration_s"]))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: {e}") from None
    if not ys:
        raise ValueError(f"{path}: the step log has no rows")
    return xs, ys


def fit_linear(xs: list[list[float]], ys: list[float]) -> tuple[list[float], float]:
    """Least-squares coefficients `b >= 0` of `y ~ x . b`, and the fit's R².

    Solves the normal equations by Gaussian elimination. A column that is all zeros gets 0. When a
    coefficient comes out negative, the most negative one is fixed at 0 and the others are refitted,
    until none is negative.
    """
    k = len(xs[0])
    active = [j for j in range(k) if any(x[j] for x in xs)]
    coef = [0.0] * k
    while active:
        sol = _least_squares([[x[j] for j in active] for x in xs], ys)
        worst = min(range(len(active)), key=sol.__getitem__)
        if sol[worst] >= 0.0:
            for j, b in zip(active, sol):
                coef[j] = b
            break
        del active[worst]
    mean = math.fsum(ys) / len(ys)
    ss_tot = math.fsum((y - mean) ** 2 for y in ys)
    ss_res = math.fsum((y - _dot(x, coef)) ** 2 for x, y in zip(xs, ys))
    return coef, (1.0 - ss_res / ss_tot if ss_tot > 0.0 else 1.0)


def _dot(x: list[float], b: list[float]) -> float:
    return math.fsum(xi * bi for xi, bi in zip(x, b))


def _least_squares(xs: list[list[float]], ys: list[float]) -> list[float]:
    # Columns scaled to a max of 1 keep the normal equations well conditioned (token counts and
    # context tokens differ by orders of magnitude); one refinement step recovers the last digits.
    k = len(xs[0])
    scale = [max(abs(x[j]) for x in xs) for j in range(k)]
    zs = [[x[j] / scale[j] for j in range(k)] for x in xs]
    gram = [[math.fsum(z[i] * z[j] for z in zs) for j in range(k)] for i in range(k)]
    sol = _solve(gram, [math.fsum(z[i] * y for z, y in zip(zs, ys)) for i in range(k)])
    res = [math.fsum([y] + [-zj * sj for zj, sj in zip(z, sol)]) for z, y in zip(zs, ys)]
    delta = _solve(gram, [math.fsum(z[i] * r for z, r in zip(zs, res)) for i in range(k)])
    return [(s + d) / c for s, d, c in zip(sol, delta, scale)]


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting."""
    k = len(b)
    m = [row[:] + [bi] for row, bi in zip(a, b)]
    tol = 1e-12 * max(abs(m[i][i]) for i in range(k))
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) <= tol:
            raise ValueError(
                "the step log cannot separate the coefficients (collinear columns, or fewer "
                "distinct steps than coefficients)"
            )
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, k):
            f = m[r][c] / m[c][c]
            for j in range(c, k + 1):
                m[r][j] -= f * m[c][j]
    sol = [0.0] * k
    for r in range(k - 1, -1, -1):
        sol[r] = (m[r][k] - sum(m[r][j] * sol[j] for j in range(r + 1, k))) / m[r][r]
    return sol


# ------------------------------------------------------------------------------------- registry


def _calibrated(**params: Any) -> CalibratedCostModel:
    c = CalibratedConfig(**params)
    return CalibratedCostModel.from_file(c.path, per_swap_block=c.per_swap_block, per_copy_block=c.per_copy_block)


COST_MODELS = {
    "steps": StepsCostModel,
    "linear": LinearCostModel,
    "roofline": RooflineCostModel,
    "calibrated": _calibrated,
}
"""Cost model name -> factory taking the model's parameters as keywords."""


def make_cost_model(name: str, **params: Any) -> CostModel:
    """Build the cost model `name` (one of `COST_MODELS`) from its parameters.

    Raises ValueError for an unknown name, and pydantic's ValidationError (a ValueError) naming the
    field for a bad or unknown parameter or an unknown preset.
    """
    try:
        factory = COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; valid: {', '.join(COST_MODELS)}") from None
    return factory(**params)
