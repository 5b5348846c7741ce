"""The deterministic mode's sampler: `RowwiseTorchSampler`, `TorchSampler` one row at a time.

`TorchSampler` processes a step's rows together: its penalties, filters, softmaxes and Gumbel
noise run on `[rows, vocab]` tensors, whose kernels (and their vector tails) depend on how many
rows there are. Here each row is sampled alone, on a `[1, vocab]` tensor, so a request's draw sees
the same shapes whatever its companions. A request without a seed draws from a generator keyed on
(the engine's seed, its request id, its sample index, its position) instead of the generator the
unseeded requests share, whose stream depends on which requests drew before: its tokens are then
reproducible too, run after run and whatever the schedule.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from ...core.requests.sampling import _mix64, request_seed
from ...core.requests.sequence import Sequence
from .sampling import TorchSampler, sample_tensor


def unseeded_key(engine_seed: int, seq: Sequence) -> int:
    """The seed of an unseeded request's draw at its current position: a hash of (engine seed,
    request id, sample index, number of tokens so far), below 2**63."""
    rid = int.from_bytes(hashlib.blake2b(seq.request_id.encode(), digest_size=8).digest(), "little")
    h = _mix64(engine_seed ^ rid)
    h = _mix64(h ^ seq.index)
    return _mix64(h ^ len(seq.token_ids)) >> 1


class RowwiseTorchSampler(TorchSampler):
    """`TorchSampler` row by row, with per-request streams for unseeded requests (see the module)."""

    def sample(self, seqs: list[Sequence], logits: Any, eos_token_id: int | None = None) -> list[int]:
        if not isinstance(logits, torch.Tensor):
            return super().sample(seqs, logits, eos_token_id)
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {len(seqs)} sequences")
        tokens = []
        for i, seq in enumerate(seqs):
            generator = self.torch_generator(logits.device)
            if not seq.sampling.greedy and request_seed(seq) is None:
                generator = torch.Generator(device=logits.device)
                generator.manual_seed(unseeded_key(self.seed, seq))
            tokens.extend(sample_tensor([seq], logits[i:i + 1], eos_token_id, generator))
        return tokens
