"""The default sampler: greedy, temperature, top-k and top-p, with per-request seeds.

Works on a torch tensor of logits (one row per sequence) or on plain lists of floats. A request
with a `seed` samples reproducibly: its generator is seeded from (seed, position), so the same
request gives the same tokens whatever else is in the batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence as Seq
from typing import Any

from .request import SamplingParams
from .sequence import Sequence

_rng = random.Random(0)


def sample_rows(seqs: list[Sequence], logits: Any) -> list[int]:
    """One token per sequence from its row of `logits`."""
    if hasattr(logits, "dim"):
        return _sample_torch(seqs, logits)
    return [_sample_list(s, row) for s, row in zip(seqs, logits, strict=True)]


def _generator_seed(seq: Sequence) -> int | None:
    seed = seq.sampling.seed
    if seed is None:
        return None
    return (seed * 1_000_003 + seq.index * 7_919 + len(seq.token_ids)) & 0x7FFFFFFFFFFFFFFF


def _filtered_probs(row: Seq[float], p: SamplingParams) -> list[tuple[int, float]]:
    scaled = sorted(((x / p.temperature, i) for i, x in enumerate(row)), reverse=True)
    if p.top_k:
        scaled = scaled[: p.top_k]
    top = scaled[0][0]
    weights = [(i, math.exp(x - top)) for x, i in scaled]
    total = sum(w for _, w in weights)
    kept, mass = [], 0.0
    for i, w in weights:
        kept.append((i, w / total))
        mass += w / total
        if mass >= p.top_p:
            break
    return kept


def _sample_list(seq: Sequence, row: Seq[float]) -> int:
    p = seq.sampling
    if p.temperature == 0.0:
        return max(range(len(row)), key=row.__getitem__)
    kept = _filtered_probs(row, p)
    seed = _generator_seed(seq)
    rng = random.Random(seed) if seed is not None else _rng
    ids, weights = zip(*kept)
    return rng.choices(ids, weights=weights)[0]


def _sample_torch(seqs: list[Sequence], logits: Any) -> list[int]:
    import torch

    logits = logits.float()
    out = logits.argmax(dim=-1).tolist()
    for i, seq in enumerate(seqs):
        p = seq.sampling
        if p.temperature == 0.0:
            continue
        row = logits[i] / p.temperature
        if p.top_k and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= p.top_p
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        seed = _generator_seed(seq)
        gen = torch.Generator(device=probs.device).manual_seed(seed) if seed is not None else None
        out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
    return out
