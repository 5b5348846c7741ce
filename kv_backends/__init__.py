"""The paged KV block pool and the host swap space."""

from metroline.kv_backends.block_ops import COPY, SWAP_IN, SWAP_OUT
from metroline.kv_backends.block_pool import BlockPool, PrefixHit
from metroline.kv_backends.swap_space import SwapSpace

__all__ = ["COPY", "SWAP_IN", "SWAP_OUT", "BlockPool", "PrefixHit", "SwapSpace"]
