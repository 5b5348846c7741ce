"""The default sampler's rules (see `sampling.py`) on a logits tensor, vectorised.

Rows are grouped by what they need, so a step pays one batched pass per group: one argmax for the
greedy rows, one softmax and one draw for the sampled rows; only the rows with penalties build
token counts, only those with `min_p` take the extra softmax, only those with `top_k`/`top_p` sort.
The draw is an exponential race (`argmax(probs / q)`, `q ~ Exp(1)`), an exact sample of `probs`;
a seeded row fills its `q` from its own generator (`request_seed`), so its token does not depend
on the other rows. One `.tolist()` at the end is the only synchronisation with the device.
"""

from __future__ import annotations

from typing import Any

import torch

from .sampling import banned_tokens, request_seed
from .sequence import Sequence


def sample_tensor(
    seqs: list[Sequence], logits: torch.Tensor, eos_token_id: int | None, generator: torch.Generator
) -> list[int]:
    """One token per row of `logits` (`[len(seqs), vocab]`); `generator` serves unseeded rows."""
    vocab = logits.shape[1]
    greedy: list[int] = []
    drawn: list[int] = []
    penalised: list[int] = []
    ban_rows: list[int] = []
    ban_cols: list[int] = []
    for i, seq in enumerate(seqs):
        p = seq.sampling
        (greedy if p.temperature == 0.0 else drawn).append(i)
        if p.needs_penalties:
            penalised.append(i)
        if p.min_tokens:
            for t in banned_tokens(seq, eos_token_id):
                if t < vocab:
                    ban_rows.append(i)
                    ban_cols.append(t)
    device = logits.device
    if not (drawn or penalised or ban_rows):
        return logits.argmax(dim=-1).tolist()
    x = logits.to(torch.float32, copy=True)
    if ban_rows:
        x[_index(ban_rows, device), _index(ban_cols, device)] = -torch.inf
    if penalised:
        rows = _index(penalised, device)
        x[rows] = apply_penalties(x[rows], [seqs[i] for i in penalised])
    if not drawn:
        return x.argmax(dim=-1).tolist()
    tokens = torch.empty(len(seqs), dtype=torch.long, device=device)
    if greedy:
        rows = _index(greedy, device)
        tokens[rows] = x[rows].argmax(dim=-1)
    if len(drawn) == len(seqs):
        tokens = draw(x, seqs, generator)
    else:
        rows = _index(drawn, device)
        tokens[rows] = draw(x[rows], [seqs[i] for i in drawn], generator)
    return tokens.tolist()


def _index(values: list[int], device: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def apply_penalties(x: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition, frequency and presence penalties on the rows `x` (one per sequence of `seqs`),
    in place; returns `x`."""
    rows, vocab = x.shape
    device = x.device
    outputs = [s.token_ids[s.num_prompt_tokens:] for s in seqs]
    counts = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
    flat = [t for out in outputs for t in out]
    if flat:
        row_of = torch.repeat_interleave(
            torch.arange(rows, device=device), _index([len(out) for out in outputs], device)
        )
        counts.index_put_((row_of, _index(flat, device)), torch.ones(len(flat), device=device), accumulate=True)
    params = [s.sampling for s in seqs]
    reps = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in reps):
        seen = counts > 0
        prompts = [s.token_ids[: s.num_prompt_tokens] for s in seqs]
        row_of = torch.repeat_interleave(
            torch.arange(rows, device=device), _index([len(pr) for pr in prompts], device)
        )
        seen[row_of, _index([t for pr in prompts for t in pr], device)] = True
        r = torch.tensor(reps, dtype=torch.float32, device=device)[:, None]
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=device)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=device)
    x -= freq[:, None] * counts + pres[:, None] * (counts > 0)
    return x


def draw(x: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p, then one token per row of processed logits `x`."""
    rows, vocab = x.shape
    device = x.device
    params = [s.sampling for s in seqs]
    x = x / torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)[:, None]
    min_ps = [p.min_p for p in params]
    if any(min_ps):
        probs = x.softmax(dim=-1)
        cut = probs.amax(dim=-1, keepdim=True) * torch.tensor(min_ps, device=device)[:, None]
        x = x.masked_fill(probs < cut, -torch.inf)
    ks = [min(p.top_k or vocab, vocab) for p in params]
    filtered = [i for i, p in enumerate(params) if ks[i] < vocab or p.top_p < 1.0]
    if filtered:
        if len(filtered) == rows:
            x = top_k_top_p(x, ks, [p.top_p for p in params])
        else:
            idx = _index(filtered, device)
            x[idx] = top_k_top_p(x[idx], [ks[i] for i in filtered], [params[i].top_p for i in filtered])
    probs = x.softmax(dim=-1)
    q = torch.empty_like(probs)
    unseeded = []
    for i, seq in enumerate(seqs):
        seed = request_seed(seq)
        if seed is None:
            unseeded.append(i)
        else:
            g = torch.Generator(device=device)
            g.manual_seed(seed)
            q[i].exponential_(generator=g)
    if len(unseeded) == rows:
        q.exponential_(generator=generator)
    elif unseeded:
        q[_index(unseeded, device)] = torch.empty(len(unseeded), vocab, device=device).exponential_(generator=generator)
    return (probs / q).argmax(dim=-1)


def top_k_top_p(x: torch.Tensor, ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Rows `x` with the logits outside each row's top k (ties kept) and top p set to -inf."""
    rows, vocab = x.shape
    device = x.device
    ordered, order = x.sort(dim=-1)  # ascending: the kept tokens are at the end
    if any(k < vocab for k in ks):
        kth = ordered.gather(1, vocab - _index(ks, device)[:, None])
        ordered = ordered.masked_fill(ordered < kth, -torch.inf)
    if any(p < 1.0 for p in top_ps):
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - torch.tensor(top_ps, device=device)[:, None]
        drop[:, -1] = False
        ordered = ordered.masked_fill(drop, -torch.inf)
    return torch.empty_like(x).scatter_(1, order, ordered)
