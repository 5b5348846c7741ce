"""Token masks on logits: a batch of grammar bitmasks (one bit per vocabulary token, packed in
int32 words, as llguidance fills them) turned into -inf on the forbidden logits, in place, with
one bias for the whole batch (`mask_rows`); `structured_output`'s `sample` wrapper applies it."""

from __future__ import annotations

from typing import Any

NEG_INF_BITS = -8388608
"""0xFF800000 as an int32: the bits of float32 -inf (0 is the bits of 0.0)."""


def mask_rows(logits: Any, rows: list[int], bitmask: Any) -> None:
    """Add -inf, in place, to every logit of row `rows[j]` whose bit in `bitmask[j]` is 0, and 0
    to the others: one bias for the whole batch, added in one operation."""
    import torch

    n, vocab = len(rows), logits.shape[1]
    with torch.inference_mode():  # the executor's logits are inference tensors
        bias = bias_cpu(bitmask, vocab) if logits.device.type == "cpu" else bias_on(bitmask, vocab, logits.device)
        if bias.dtype != logits.dtype:
            bias = bias.to(logits.dtype)
        if n == logits.shape[0]:
            logits.add_(bias)
        else:
            logits.index_add_(0, torch.tensor(rows, dtype=torch.long, device=logits.device), bias)


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
