"""Hardware for the roofline model: a transformer's shape, a GPU's peaks, and named presets of each."""

from __future__ import annotations

from pydantic import Field

from .base import StrictConfig


class ModelShape(StrictConfig):
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


class GpuSpec(StrictConfig):
    """`flops`: peak dense bf16 FLOP/s; `bandwidth`: peak device memory bytes/s."""

    flops: float = Field(gt=0.0)
    bandwidth: float = Field(gt=0.0)


MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                             head_dim=128, intermediate_size=14336, vocab_size=128256),
    "llama-2-7b": ModelShape(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=32,
                             head_dim=128, intermediate_size=11008, vocab_size=32000),
    "llama-2-70b": ModelShape(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                              head_dim=128, intermediate_size=28672, vocab_size=32000),
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


class NodeSpec(StrictConfig):
    """A multi-GPU node: its `gpu` preset, how many (`gpus`), and the GPU-to-GPU link that tensor
    and pipeline parallelism talk over: `link_bandwidth` (bytes/s one way, per GPU) and
    `link_latency` (seconds per collective or transfer)."""

    gpu: str
    gpus: int = Field(gt=0)
    link_bandwidth: float = Field(gt=0.0)
    link_latency: float = Field(ge=0.0)


NODE_PRESETS: dict[str, NodeSpec] = {
    "DGX-A100": NodeSpec(gpu="A100", gpus=8, link_bandwidth=300e9, link_latency=8e-6),
    "DGX-H100": NodeSpec(gpu="H100", gpus=8, link_bandwidth=450e9, link_latency=8e-6),
    "HGX-H200": NodeSpec(gpu="H200", gpus=8, link_bandwidth=450e9, link_latency=8e-6),
}
"""8-GPU nodes on NVLink (NVSwitch): NVLink 3 (A100) 600 GB/s and NVLink 4 (H100, H200) 900 GB/s
per GPU both ways together, half each way; the latency of a small all-reduce (`link_latency`)
as Vidur measured on H100s (`h100_pairwise_nvlink_all_reduce.csv`: 7-30 us for a few KB)."""
