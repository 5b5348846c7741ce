"""Token masks on logits: a batch of grammar bitmasks (one bit per vocabulary token, packed in
int32 words, as llguidance fills them) turned into a bias of -inf on the forbidden logits, one
bias for the whole batch (`bias_of`), which `structured_output`'s `sample` wrapper registers on the
hook context (`ctx.add_logits_bias`)."""

from __future__ import annotations

from typing import Any

NEG_INF_BITS = -8388608
"""0xFF800000 as an int32: the bits of float32 -inf (0 is the bits of 0.0)."""


def bias_of(bitmask: Any, logits: Any) -> Any:
    """The bias of `bitmask` for `logits` (`[rows, vocab]`, on the logits' device and dtype): -inf
    where a bit is 0, 0 where it is 1. The `sample` wrapper registers it with
    `ctx.add_logits_bias`, and the engine adds it to those rows in one batched operation, without
    touching the executor's tensor."""
    vocab = logits.shape[1]
    bias = bias_cpu(bitmask, vocab) if logits.device.type == "cpu" else bias_on(bitmask, vocab, logits.device)
    return bias if bias.dtype == logits.dtype else bias.to(logits.dtype)


def bias_cpu(bitmask: Any, vocab: int) -> Any:
    """The float32 bias `[rows, vocab]` of `bitmask`: -inf for a 0 bit, 0.0 for a 1. The bits are
    unpacked by numpy and multiplied into -inf's bit pattern (a masked fill over the vocabulary
    costs several times more on a CPU)."""
    import numpy as np
    import torch

    forbidden = np.unpackbits((~bitmask.numpy()).view(np.uint8), axis=1, count=vocab, bitorder="little")
    return torch.from_numpy(np.multiply(forbidden, np.int32(NEG_INF_BITS), dtype=np.int32)).view(torch.float32)


def bias_on(bitmask: Any, vocab: int, device: Any) -> Any:
    """`bias_cpu`'s bias computed on `device` (an accelerator): the bitmask goes there, not the bias."""
    import torch

    words = bitmask.to(device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    forbidden = ((words.unsqueeze(-1) >> shifts) & 1).view(words.shape[0], -1)[:, :vocab] == 0
    return torch.zeros(forbidden.shape, device=device).masked_fill_(forbidden, -torch.inf)
