"""The block operations a step plan asks the executor to run before the forward pass.

Each operation is a plain tuple `(kind, src, dst)`. Operations run in the order they were planned,
which is what makes a block freed and reused within one step safe: a copy or swap that reads a block
always runs before a later one that overwrites it.
"""

COPY = 0
"""Copy device block `src` into device block `dst` (copy-on-write)."""
SWAP_OUT = 1
"""Copy device block `src` into host block `dst`."""
SWAP_IN = 2
"""Copy host block `src` into device block `dst`."""

NAMES = {COPY: "copy", SWAP_OUT: "swap_out", SWAP_IN: "swap_in"}
