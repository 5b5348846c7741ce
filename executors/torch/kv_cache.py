"""`PagedKVCache`: the model's keys and values in metroline's block layout, and the block ops.

One tensor per kind holds every layer, `[num_layers, num_blocks, block_size, num_kv_heads, head_dim]`,
so layer `l`'s cache is the contiguous view `k[l]` and a block op moves a block of every layer at once.
Host blocks (the swap space) live in CPU memory of the same shape, pinned when the device is CUDA.
"""

from __future__ import annotations

import torch

from ...kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of KV one token takes: 2 (K and V) x layers x KV heads x head dim x dtype size."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class PagedKVCache:
    """The device KV blocks of every layer and the host swap blocks.

    Blocks start zeroed: attention masks the slots past each sequence's length, and a masked
    slot must still hold a finite value (0 x NaN would leak into the output).
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        swap_blocks: int = 0,
    ) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        host_shape = (num_layers, swap_blocks, block_size, num_kv_heads, head_dim)
        pin = device.type == "cuda"
        self.host_k = torch.zeros(host_shape, dtype=dtype, pin_memory=pin)
        self.host_v = torch.zeros(host_shape, dtype=dtype, pin_memory=pin)
        self.k_layers = list(self.k.unbind(0))
        self.v_layers = list(self.v.unbind(0))

    def run_block_ops(self, block_ops: list[tuple[int, int, int]]) -> None:
        """Run copies and swaps `(kind, src, dst)` in the order given (a block freed and reused
        within one step relies on that order)."""
        k, v, hk, hv = self.k, self.v, self.host_k, self.host_v
        for kind, src, dst in block_ops:
            if kind == COPY:
                k[:, dst].copy_(k[:, src])
                v[:, dst].copy_(v[:, src])
            elif kind == SWAP_OUT:
                hk[:, dst].copy_(k[:, src])
                hv[:, dst].copy_(v[:, src])
            elif kind == SWAP_IN:
                k[:, dst].copy_(hk[:, src])
                v[:, dst].copy_(hv[:, src])
            else:
                raise ValueError(f"unknown block op kind {kind}")
