"""The default sampler: a request's `SamplingParams` applied to its row of logits.

The rules, in vLLM's order, for each row:

1. while the output is shorter than `min_tokens`, EOS and the stop token ids get -inf;
2. penalties: `repetition_penalty` r over the tokens of prompt and output (a positive logit is
   divided by r, a negative one multiplied), then `frequency_penalty` x count and
   `presence_penalty` x (count > 0) subtracted for the tokens of the output;
3. `temperature` below 1e-5 (`GREEDY_TEMPERATURE`, 0 included): the argmax (the first one on
   ties); otherwise the logits are divided by the temperature, then `min_p` drops the tokens
   whose probability is below `min_p` x the largest, `top_k` keeps the logits at least as large as the k-th largest (ties at the k-th all stay),
   `top_p` keeps the smallest set of most likely tokens whose probability reaches `top_p` (the
   probabilities renormalised after top-k), and one token is drawn from what is left.

Logits come as a torch tensor `[len(seqs), vocab]` (the torch executor: vectorised by its
`TorchSampler`, `executors/torch/sampling.py`) or as rows of floats (lists: plain Python, the same
rules, for tests and plugins: `Sampler` here). A request with a `seed` draws from a generator keyed on
(seed, sample index, position), so its tokens never depend on the batch it is in; the sample
`index` of an `n > 1` request makes each child's stream its own. Requests without a seed share one
generator per sampler, seeded from the engine's `seed`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence as Seq
from typing import Any

from .sequence import Sequence

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an int."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def request_seed(seq: Sequence) -> int | None:
    """The seed of `seq`'s draw at its current position (None when its request has no seed): a
    hash of (seed, sample index, number of tokens so far), below 2**63."""
    seed = seq.sampling.seed
    if seed is None:
        return None
    h = _mix64(seed & _MASK64)
    h = _mix64(h ^ seq.index)
    return _mix64(h ^ len(seq.token_ids)) >> 1


def banned_tokens(seq: Sequence, eos_token_id: int | None) -> tuple[int, ...]:
    """The tokens `seq` may not sample now: EOS (unless `ignore_eos`) and the stop token ids
    while its output is shorter than `min_tokens`; otherwise none."""
    p = seq.sampling
    if not p.min_tokens or len(seq.token_ids) - seq.num_prompt_tokens >= p.min_tokens:
        return ()
    if eos_token_id is None or p.ignore_eos:
        return p.stop_token_ids
    return (*p.stop_token_ids, eos_token_id)


class Sampler:
    """Samples one token per sequence from rows of floats; keeps the generator of the unseeded
    requests. Logits that are tensors are the executor's to sample: an executor that returns them
    gives the engine its sampler class (`sampler_class`, e.g. the torch executor's `TorchSampler`,
    a subclass of this one), which the default `sample` hook uses.

    `seed`: the seed of that shared generator (the engine's `config.seed`).
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def sample(self, seqs: list[Sequence], logits: Any, eos_token_id: int | None = None) -> list[int]:
        """One token per sequence from its row of `logits` (rows of floats)."""
        if hasattr(logits, "dim"):
            raise TypeError(
                "logits are a tensor: sample them with the executor's sampler (the torch executor's is "
                "metroline.executors.torch.sampling.TorchSampler)"
            )
        return [self._sample_list(s, row, eos_token_id) for s, row in zip(seqs, logits, strict=True)]

    def _sample_list(self, seq: Sequence, row: Seq[float], eos_token_id: int | None) -> int:
        x = processed_logits(seq, row, eos_token_id)
        if seq.sampling.greedy:
            return max(range(len(x)), key=x.__getitem__)
        probs = filtered_probs(x, seq)
        seed = request_seed(seq)
        rng = random.Random(seed) if seed is not None else self._rng
        ids = [i for i, q in enumerate(probs) if q > 0.0]
        return rng.choices(ids, weights=[probs[i] for i in ids])[0]


def processed_logits(seq: Sequence, row: Seq[float], eos_token_id: int | None = None) -> list[float]:
    """Steps 1 and 2 of the rules (min_tokens mask, penalties) on one row of floats."""
    x = [float(v) for v in row]
    for t in banned_tokens(seq, eos_token_id):
        if t < len(x):
            x[t] = -math.inf
    p = seq.sampling
    if not p.needs_penalties:
        return x
    r = p.repetition_penalty
    if r != 1.0:
        for t in set(seq.token_ids):
            x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t, count in Counter(seq.token_ids[seq.num_prompt_tokens:]).items():
        x[t] -= p.frequency_penalty * count + p.presence_penalty
    return x


def filtered_probs(x: Seq[float], seq: Sequence) -> list[float]:
    """Step 3's distribution (temperature, min_p, top_k, top_p) over processed logits `x`: one
    probability per token, 0 for the filtered ones."""
    p = seq.sampling
    scaled = [v / p.temperature for v in x]
    top = max(scaled)
    weights = [math.exp(v - top) for v in scaled]
    if p.min_p > 0.0:
        total = sum(weights)
        cut = p.min_p * max(weights) / total
        weights = [w if w / total >= cut else 0.0 for w in weights]
    if p.top_k and p.top_k < len(x):
        kth = sorted(scaled, reverse=True)[p.top_k - 1]
        weights = [w if v >= kth else 0.0 for w, v in zip(weights, scaled)]
    total = sum(weights)
    probs = [w / total for w in weights]
    if p.top_p < 1.0:
        before, keep = 0.0, set()
        for i in sorted(range(len(probs)), key=probs.__getitem__, reverse=True):
            if before >= p.top_p or probs[i] == 0.0:
                break
            keep.add(i)
            before += probs[i]
        kept = sum(probs[i] for i in keep)
        probs = [q / kept if i in keep else 0.0 for i, q in enumerate(probs)]
    return probs


_default = Sampler()


def sample_rows(seqs: list[Sequence], logits: Any, eos_token_id: int | None = None) -> list[int]:
    """One token per sequence with a module-wide `Sampler` (seed 0)."""
    return _default.sample(seqs, logits, eos_token_id)
