"""The paged KV block pool and the host swap space."""

from .block_ops import COPY, SWAP_IN, SWAP_OUT
from .block_pool import BlockPool, PrefixHit
from .swap_space import SwapSpace

__all__ = ["COPY", "SWAP_IN", "SWAP_OUT", "BlockPool", "PrefixHit", "SwapSpace"]
