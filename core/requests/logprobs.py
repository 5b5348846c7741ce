"""Log-probabilities of sampled tokens, for requests that ask for them (`SamplingParams.logprobs`).

Computed after sampling from the raw logits the executor returned (before temperature, penalties
and filters: what vLLM returns by default; a structured output's rows after its grammar's mask, as
vLLM's), only for the rows whose sequence asked, so a batch without such requests pays one list
scan. Torch is imported only when there is a logits tensor.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .sequence import Sequence


def record_logprobs(seqs: list[Sequence], logits: Any, tokens: list[int], rowwise: bool = False,
                    skip: Collection[Sequence] = ()) -> None:
    """Append to each `seq.logprobs` that is not None the log-probability of `tokens[i]` under
    row i of `logits` and the `seq.sampling.logprobs` most likely tokens with theirs. Nothing
    without logits (a simulated executor), nothing for the sequences in `skip` (failed rows, whose
    token is dropped). `rowwise` (the deterministic mode) computes each row alone, on a
    `[1, vocab]` tensor, so its numbers do not depend on how many rows asked."""
    if logits is None:
        return
    rows = [i for i, seq in enumerate(seqs) if seq.logprobs is not None and seq not in skip]
    if not rows:
        return
    import torch

    if rowwise and len(rows) > 1:
        for i in rows:
            record_logprobs([seqs[i]], logits[i:i + 1], [tokens[i]])
        return
    with torch.no_grad():
        index = torch.tensor(rows, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
        chosen = lp.gather(1, torch.tensor([[tokens[i]] for i in rows], device=lp.device)).squeeze(1).tolist()
        k = min(max(seqs[i].sampling.logprobs for i in rows), lp.shape[-1])  # a vocabulary under 20
        top_lp, top_ids = (t.tolist() for t in lp.topk(k, dim=-1))
    for j, i in enumerate(rows):
        seq = seqs[i]
        want = seq.sampling.logprobs
        seq.logprobs.append((chosen[j], tuple(zip(top_ids[j][:want], top_lp[j][:want]))))
