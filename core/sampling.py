"""The default sampler: greedy, temperature, top-k and top-p, with per-request seeds.

Works on rows of floats, one per sequence. A request with a `seed` samples reproducibly: its
generator is seeded from (seed, sample index, position), so the same request gives the same tokens
whatever else is in the batch.
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
    """One token per sequence from its row of `logits` (any sequence of indexable rows of floats;
    a vectorised tensor path comes with the real executor)."""
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
