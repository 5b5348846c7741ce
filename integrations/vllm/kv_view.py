"""What a `StepContext` shows plugins of vLLM's KV cache: its size and its free blocks."""

from __future__ import annotations

from typing import Any


class VllmKVView:
    """The pool a `StepContext` reads (`num_free_blocks`, `block_size`, `num_blocks`), backed by
    vLLM's block pool. vLLM's null block is not counted. A prefix lookup
    (`ctx.cached_prefix_tokens`) is not offered: vLLM's lookup records cache statistics, so the
    bridge does not call it for plugins (it raises, naming the call)."""

    def __init__(self, block_pool: Any, block_size: int) -> None:
        self._blocks = block_pool
        self.block_size = block_size
        self.num_blocks = block_pool.num_gpu_blocks - 1

    def num_free_blocks(self) -> int:
        return self._blocks.get_num_free_blocks()

    def lookup(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ctx.cached_prefix_tokens is not available inside vLLM (metroline.integrations.vllm): "
            "vLLM's prefix lookup records cache statistics")
