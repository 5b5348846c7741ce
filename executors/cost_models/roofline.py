"""The `roofline` cost model: the slower of compute and memory traffic for a model on a GPU."""

from __future__ import annotations

from typing import Any, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ...core.step.plan import StepPlan
from ..base import count_block_ops
from .base import StrictConfig, is_empty
from .hardware import GPU_PRESETS, MODEL_PRESETS, NODE_PRESETS, GpuSpec, ModelShape


class RooflineConfig(StrictConfig):
    """`model` and `gpu`: a preset name or a full `ModelShape` / `GpuSpec`. The efficiencies scale
    the peaks (fitted to measured GPU timings: see `RooflineCostModel`); `overhead` is seconds per
    step (launches, scheduling); `host_bandwidth` is the host link in bytes/s for swaps (25e9: what
    a PCIe 4.0 x16 link, the A100's, sustains; about 50e9 for the PCIe 5.0 of H100 and H200).

    Scaling out (`RooflineCostModel` says how each is priced): `tensor_parallel` (T GPUs share
    every layer), `pipeline_parallel` (P stages of consecutive layers), over a link of
    `link_bandwidth` bytes/s one way and `link_latency` seconds per collective; `node` (a
    `NODE_PRESETS` name) sets the GPU and the link at once. `layer_overhead` is seconds per layer
    per step (kernel launches and tails of the small matmuls a layer splits into; 0 by default:
    fitted to Vidur's H100 timings it is 60 us, see the table of docs/guide/running.md).
    """

    model: Union[str, ModelShape] = "llama-3-8b"
    gpu: Union[str, GpuSpec] = "A100"
    flops_efficiency: float = Field(default=0.65, gt=0.0, le=1.0)
    bandwidth_efficiency: float = Field(default=0.7, gt=0.0, le=1.0)
    overhead: float = Field(default=5e-4, ge=0.0)
    host_bandwidth: float = Field(default=25e9, gt=0.0)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    pipeline_parallel: int = Field(default=1, ge=1, le=64)
    link_bandwidth: float = Field(default=450e9, gt=0.0)
    link_latency: float = Field(default=8e-6, ge=0.0)
    layer_overhead: float = Field(default=0.0, ge=0.0)
    node: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _node(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("node") is not None:
            if data["node"] not in NODE_PRESETS:
                raise ValueError(f"unknown node preset {data['node']!r}; valid: {', '.join(NODE_PRESETS)}")
            node = NODE_PRESETS[data["node"]]
            data = {"gpu": node.gpu, "link_bandwidth": node.link_bandwidth, "link_latency": node.link_latency, **data}
        return data

    @model_validator(mode="after")
    def _fits(self) -> "RooflineConfig":
        if self.node is not None and self.tensor_parallel * self.pipeline_parallel > NODE_PRESETS[self.node].gpus:
            raise ValueError(f"tensor_parallel x pipeline_parallel: {self.tensor_parallel * self.pipeline_parallel} GPUs, "
                             f"more than the {NODE_PRESETS[self.node].gpus} of node {self.node}")
        return self

    @field_validator("model", "gpu")
    @classmethod
    def _known_preset(cls, v: Any, info: ValidationInfo) -> Any:
        presets = _PRESETS[info.field_name]
        if isinstance(v, str) and v not in presets:
            raise ValueError(f"unknown {info.field_name} preset {v!r}; valid: {', '.join(presets)}")
        return v


_PRESETS: dict[str, dict] = {"model": MODEL_PRESETS, "gpu": GPU_PRESETS}
"""`RooflineConfig` field -> the presets a name in it may refer to."""


def _resolve(field: str, value: Any) -> Any:
    """The preset a name refers to, or the full shape / spec as given."""
    return _PRESETS[field][value] if isinstance(value, str) else value


def attention_pairs(plan: StepPlan) -> float:
    """Query-key pairs the step's attention computes under the causal mask.

    A sequence computing `n` tokens after `start` cached ones attends `n x start + n(n+1)/2` pairs.
    A decode-only step without drafts (n = 1 each) has exactly `num_context_tokens` pairs, found in O(1); a step
    with prefill walks its sequences. A hand-built plan with counters but no `scheduled` falls back
    to `num_tokens x num_context_tokens / max(1, num_seqs)` (exact for one full-context sequence,
    ignoring the mask).
    """
    if not plan.num_prefill_tokens and not plan.num_draft_tokens:
        return plan.num_context_tokens
    if plan.scheduled:
        return sum(n * s.num_computed_tokens + n * (n + 1) // 2 for s, n in plan.scheduled.items())
    return plan.num_tokens * plan.num_context_tokens / max(1, plan.num_seqs)


class RooflineCostModel:
    """Step time = max(compute time, memory time) + overhead + block-op transfer time.

    - compute: `2 x layer params x tokens + 2 x LM-head params x rows` (logits for each
      scheduled sequence, and for each draft token it verifies) `+ 4 x layers x num_heads x head_dim x attention pairs` (QK^T and AV; see
      `attention_pairs`), at `gpu.flops x flops_efficiency`.
    - memory: the weights once, plus KV read (`kv_bytes_per_token x num_context_tokens`) and
      written (`kv_bytes_per_token x num_tokens`), at `gpu.bandwidth x bandwidth_efficiency`.
      Activations are ignored.
    - block ops, run before the forward and not overlapped with it: each swap moves one block
      (`kv_bytes_per_token x block_size`) over the host link; each copy reads and writes one block
      in device memory.

    A recomputed sequence (preempted by recompute) comes back as a prefill of its prompt and the
    tokens it had generated, so each recomputed token costs prefill compute here, and each
    swapped block costs its bytes over the host link: preemption costs what it costs.

    The default efficiencies were fitted to the per-layer operator timings Vidur measured on real
    GPUs (`../shared/profiles/vidur`, tensor parallelism 1): the profile's token-wise operators
    (QKV and O projections, the gated MLP, norms, rope, activation, residual add) over all layers,
    plus the embedding, plus the LM head scaled from the measured up-projection of the same number
    of rows, against this model's compute and memory terms without attention (the profiles hold
    none). Predicted / measured, with the defaults (0.65, 0.7; the earlier 0.6, 0.8 in brackets):

    | model, GPU | decode 1 | decode 32 | decode 128 | prefill 512 | prefill 2048 |
    | --- | --- | --- | --- | --- | --- |
    | llama-3-8b, A100 | 1.02 (0.89) | 0.90 (0.79) | 0.75 (0.73) | 1.00 (1.08) | 0.98 (1.06) |
    | llama-2-7b, A100 | 0.98 (0.86) | 0.95 (0.83) | 0.74 (0.72) | 0.97 (1.06) | 0.98 (1.06) |
    | llama-2-7b, H100 | 0.99 (0.87) | 0.96 (0.84) | 0.87 (0.76) | 0.85 (0.92) | 1.02 (1.10) |

    Parallelism, as Vidur models it: with tensor parallelism T every matmul, the attention heads
    and the LM head are split T ways (compute and weights / T), each GPU reads the KV of its
    `min(T, num_kv_heads)`-th share of the KV heads, and every layer adds two all-reduces of the
    step's activations (`tokens x hidden x bytes`), each `link_latency + 2 (T - 1) / T x bytes /
    link_bandwidth` (a ring), not overlapped with compute. With pipeline parallelism P the stages
    run one after the other for a step's batch (one batch in flight: the step's latency is the
    sum of the stages, so the compute and weight terms are unchanged) and P - 1 hand-offs of the
    activations (`link_latency + bytes / link_bandwidth`) are added. `layer_overhead` x layers is
    added to every step.

    (llama-3-8b on A100: a decode step of 1 sequence 10.5 ms against 10.3 measured, 128 sequences
    10.5 against 14.1; a 2,048-token prefill 141 ms against 144.) Decodes of about a hundred
    sequences are where a roofline is weakest: the matmuls are neither bandwidth- nor
    compute-bound, and the `max` undershoots by about a quarter. `tests/test_default_cost_model.py`
    recomputes the table from the CSVs and keeps every ratio within 0.7..1.3.
    """

    name = "roofline"

    def __init__(self, **params: Any) -> None:
        self.config = c = RooflineConfig(**params)
        self.shape: ModelShape = _resolve("model", c.model)
        self.gpu: GpuSpec = _resolve("gpu", c.gpu)
        s, g, t = self.shape, self.gpu, c.tensor_parallel
        self._flops = g.flops * c.flops_efficiency
        self._bandwidth = g.bandwidth * c.bandwidth_efficiency
        self._flops_per_token = 2.0 * s.layer_params * s.num_layers / t
        self._flops_per_logit_row = 2.0 * s.vocab_size * s.hidden_size / t
        self._flops_per_pair = 4.0 * s.num_layers * s.num_heads * s.head_dim / t
        self._weight_bytes = s.weight_bytes / t
        self._kv_bytes = s.kv_bytes_per_token  # a block's bytes (swaps, copies): all of it, over the GPUs
        self._kv_read = s.kv_bytes_per_token / min(t, s.num_kv_heads)  # what one GPU reads or writes
        self._fixed = c.overhead + c.layer_overhead * s.num_layers
        activation = s.hidden_size * s.bytes_per_param  # bytes per token of a layer's output
        ring = 2 * (t - 1) / t / c.link_bandwidth if t > 1 else 0.0
        self._comm_per_token = activation * (2 * s.num_layers * ring + (c.pipeline_parallel - 1) / c.link_bandwidth)
        self._comm_fixed = c.link_latency * ((2 * s.num_layers if t > 1 else 0) + c.pipeline_parallel - 1)

    def breakdown(self, plan: StepPlan) -> tuple[float, float, float]:
        """`(compute_s, memory_s, block_ops_s)` of the plan, before the overhead."""
        compute = memory = transfer = 0.0
        n = plan.num_tokens
        if n:
            rows = plan.num_seqs + plan.num_draft_tokens  # a drafting decode verifies a row per draft
            flops = (self._flops_per_token * n + self._flops_per_logit_row * rows
                     + self._flops_per_pair * attention_pairs(plan))
            compute = flops / self._flops
            kv_bytes = self._kv_read * (plan.num_context_tokens + n)
            memory = (self._weight_bytes + kv_bytes) / self._bandwidth
        if plan.block_ops:
            copies, outs, ins = count_block_ops(plan.block_ops)
            block = self._kv_bytes * plan.block_size
            transfer = (block * (outs + ins) / self.config.host_bandwidth
                        + 2 * block * copies / self._bandwidth)
        return compute, memory, transfer

    def communication(self, plan: StepPlan) -> float:
        """Seconds the step's tensor- and pipeline-parallel traffic takes (0 on one GPU)."""
        return self._comm_fixed + self._comm_per_token * plan.num_tokens if plan.num_tokens else 0.0

    def step_time(self, plan: StepPlan) -> float:
        if is_empty(plan):
            return 0.0
        compute, memory, transfer = self.breakdown(plan)
        return max(compute, memory) + transfer + self.communication(plan) + self._fixed

    def describe(self) -> dict:
        return {
            "name": self.name,
            **self.config.model_dump(),
            "model_shape": self.shape.model_dump(),
            "gpu_spec": self.gpu.model_dump(),
            "num_params": self.shape.num_params,
        }
