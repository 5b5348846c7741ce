"""The default sampler's rules (see `core/requests/sampling.py`) on a logits tensor, vectorised:
`TorchSampler`, the sampler the torch executor gives the engine (`TorchExecutor.sampler_class`).

Rows are grouped by what they need, so a step pays one batched pass per group: one argmax for the
greedy rows, one draw for the sampled rows; only the rows with penalties touch their history's
tokens (a gather and a scatter, never a pass over the vocabulary), only those with `min_p` take a
max, only those with `top_k`/`top_p` take a partial sort (`topk` of at most `CANDIDATES` values;
the full sort only for a row whose nucleus is wider). Every filter is a threshold on the logits
(ties at a threshold all stay).

The draw is the Gumbel-max trick, `argmax(logits / T - log(-log(u)))` with `u ~ U(0, 1)` per
token: an exact sample of the filtered softmax. A seeded row fills its `u` from its own generator
(`request_seed`), so its token does not depend on the other rows. The final `.tolist()` is the only
synchronisation with the device.
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.requests.sampling import Sampler, banned_tokens, request_seed
from ...core.requests.sequence import Sequence


class TorchSampler(Sampler):
    """`Sampler` for logits tensors `[len(seqs), vocab]` (rows of floats still work); keeps one
    generator per device for the unseeded requests, seeded with `seed`."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._generators: dict[Any, torch.Generator] = {}

    def sample(self, seqs: list[Sequence], logits: Any, eos_token_id: int | None = None) -> list[int]:
        """One token per sequence from its row of `logits`."""
        if not isinstance(logits, torch.Tensor):
            return super().sample(seqs, logits, eos_token_id)
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits of shape {tuple(logits.shape)} for {len(seqs)} sequences")
        return sample_tensor(seqs, logits, eos_token_id, self.torch_generator(logits.device))

    def torch_generator(self, device: Any) -> torch.Generator:
        """The shared generator of unseeded requests on `device`."""
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
            gen.manual_seed(self.seed)
        return gen


CANDIDATES = 1024
"""Tokens sorted per `top_p` row (without a smaller `top_k`) before falling back to a full sort."""


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
        (greedy if p.greedy else drawn).append(i)
        if p.needs_penalties:
            penalised.append(i)
        if p.min_tokens:
            for t in banned_tokens(seq, eos_token_id):
                if t < vocab:
                    ban_rows.append(i)
                    ban_cols.append(t)
    device = logits.device
    x = logits if logits.dtype == torch.float32 else logits.float()
    if ban_rows or penalised:
        x = x.clone()  # never modify the executor's tensor
    if ban_rows:
        x[_index(ban_rows, device), _index(ban_cols, device)] = -torch.inf
    if penalised:
        if len(penalised) == len(seqs):
            apply_penalties(x, seqs)
        else:
            rows = _index(penalised, device)
            x[rows] = apply_penalties(x[rows], [seqs[i] for i in penalised])
    if not drawn:
        return x.argmax(dim=-1).tolist()
    if not greedy:
        return draw(x, seqs, generator).tolist()
    tokens = x.argmax(dim=-1)  # one pass over every row costs less than gathering the greedy ones
    rows = _index(drawn, device)
    tokens[rows] = draw(x[rows], [seqs[i] for i in drawn], generator)
    return tokens.tolist()


def _index(values: list[int], device: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _flat_keys(lists: list[list[int]], rows: list[int], vocab: int, device: Any) -> torch.Tensor:
    """`row * vocab + token` for every token of `lists[j]` in row `rows[j]`."""
    flat = [t for ids in lists for t in ids]
    if not flat:
        return torch.empty(0, dtype=torch.long, device=device)
    row_of = torch.repeat_interleave(_index(rows, device), _index([len(ids) for ids in lists], device))
    return row_of * vocab + _index(flat, device)


def apply_penalties(x: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition, frequency and presence penalties on the rows `x` (one per sequence of `seqs`),
    in place on the tokens each row has seen; returns `x`."""
    rows, vocab = x.shape
    device = x.device
    flat = x.view(-1)
    params = [s.sampling for s in seqs]
    outputs = [s.token_ids[s.num_prompt_tokens:] for s in seqs]
    out_keys, counts = torch.unique(_flat_keys(outputs, list(range(rows)), vocab, device), return_counts=True)
    repeating = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if repeating:
        prompts = [seqs[i].token_ids[: seqs[i].num_prompt_tokens] for i in repeating]
        seen = torch.unique(torch.cat([_flat_keys(prompts, repeating, vocab, device), out_keys]))
        r = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)[seen // vocab]
        vals = flat[seen]
        flat[seen] = torch.where(vals > 0, vals / r, vals * r)
    freq = torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=device)
    pres = torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=device)
    row_of = out_keys // vocab
    flat[out_keys] -= freq[row_of] * counts + pres[row_of]
    return x


def draw(x: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p, then one token per row of processed logits `x`."""
    rows, vocab = x.shape
    device = x.device
    params = [s.sampling for s in seqs]
    x = x / torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)[:, None]
    thresholds = [
        i for i, p in enumerate(params) if p.min_p > 0.0 or (p.top_k and p.top_k < vocab) or p.top_p < 1.0
    ]
    if thresholds:
        if len(thresholds) == rows:
            x = x.masked_fill(x < cut_offs(x, params)[:, None], -torch.inf)
        else:
            idx = _index(thresholds, device)
            sub = x[idx]
            x[idx] = sub.masked_fill(sub < cut_offs(sub, [params[i] for i in thresholds])[:, None], -torch.inf)
    noise = torch.empty_like(x)
    unseeded = []
    for i, seq in enumerate(seqs):
        seed = request_seed(seq)
        if seed is None:
            unseeded.append(i)
        else:
            g = torch.Generator(device=device)
            g.manual_seed(seed)
            noise[i].uniform_(generator=g)
    if len(unseeded) == rows:
        noise.uniform_(generator=generator)
    elif unseeded:
        noise[_index(unseeded, device)] = torch.empty(len(unseeded), vocab, device=device).uniform_(generator=generator)
    return x.sub_(noise.log_().neg_().log_()).argmax(dim=-1)


def cut_offs(x: torch.Tensor, params: list[Any]) -> torch.Tensor:
    """Per row of temperature-scaled logits `x`, the smallest logit that `min_p`, `top_k` and
    `top_p` keep (-inf: all)."""
    rows, vocab = x.shape
    device = x.device
    cut = torch.full((rows,), -torch.inf, device=device)
    min_ps = [p.min_p for p in params]
    if any(min_ps):  # p < min_p * p_max  <=>  logit < max logit + log(min_p)
        cut = x.amax(dim=-1) + torch.tensor(min_ps, device=device).log()
    ks = [min(p.top_k or vocab, vocab) for p in params]
    top_ps = [p.top_p for p in params]
    if all(k == vocab for k in ks) and all(p == 1.0 for p in top_ps):
        return cut
    wanted = max(k for k in ks if k < vocab) if any(k < vocab for k in ks) else 0
    if any(p < 1.0 and k == vocab for p, k in zip(top_ps, ks)):
        wanted = max(wanted, CANDIDATES)
    top = x.topk(min(wanted, vocab), dim=-1).values  # descending
    k_idx = _index(ks, device)[:, None] - 1
    limited = _index([k < vocab for k in ks], device).bool()
    kth = top.gather(1, k_idx.clamp(max=top.shape[1] - 1)).squeeze(1)
    cut = torch.where(limited, torch.maximum(cut, kth), cut)
    if all(p == 1.0 for p in top_ps):
        return cut
    p = torch.tensor(top_ps, device=device)[:, None]
    kept = top.masked_fill(top < cut[:, None], -torch.inf)
    lse = kept.logsumexp(dim=-1, keepdim=True)  # a top_k row's mass is in its candidates
    unlimited = [i for i, (k, q) in enumerate(zip(ks, top_ps)) if k == vocab and q < 1.0]
    if len(unlimited) == rows:
        lse = x.masked_fill(x < cut[:, None], -torch.inf).logsumexp(dim=-1, keepdim=True)
    elif unlimited:
        idx = _index(unlimited, device)
        sub = x[idx]
        lse[idx] = sub.masked_fill(sub < cut[idx, None], -torch.inf).logsumexp(dim=-1, keepdim=True)
    probs = (kept - lse).exp()
    cumulative = probs.cumsum(dim=-1)
    # before each token: mass < top_p; the most likely token always stays (a top_p that float32
    # rounds to 0 keeps it alone)
    n_keep = ((cumulative - probs) < p).sum(dim=-1, keepdim=True).clamp_(min=1)
    nucleus = top.gather(1, n_keep - 1).squeeze(1)
    before_top_p = cut
    cut = torch.where(p.squeeze(1) < 1.0, torch.maximum(cut, nucleus), cut)
    if top.shape[1] < vocab:  # a nucleus wider than the candidates: those rows again, fully sorted
        wide = ((cumulative[:, -1:] < p) & (n_keep == top.shape[1])).squeeze(1).nonzero().squeeze(1).tolist()
        if wide:
            full = _full_sort_cut(x[_index(wide, device)], before_top_p[wide], [top_ps[i] for i in wide])
            cut[_index(wide, device)] = full
    return cut


def _full_sort_cut(x: torch.Tensor, cut: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    """`cut_offs`' top_p threshold for rows `x` whose nucleus needs every token sorted."""
    ordered = x.masked_fill(x < cut[:, None], -torch.inf).sort(dim=-1, descending=True).values
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    n_keep = (before < torch.tensor(top_ps, device=x.device)[:, None]).sum(dim=-1, keepdim=True).clamp_(min=1)
    return torch.maximum(cut, ordered.gather(1, n_keep - 1).squeeze(1))
