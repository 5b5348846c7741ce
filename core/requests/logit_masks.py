"""`LogitMasks`: what `sample` wrappers ask to change in the logits before a sampler chooses, the
same on every executor.

A wrapper calls, before it yields, `ctx.ban_tokens(seq, token_ids)` (the sequence may not take those
tokens), `ctx.bias_tokens(seq, {token_id: bias})` (added to its logits, OpenAI's `logit_bias`; a bias
of -inf bans) or `ctx.add_logits_bias(rows, bias)` (a tensor `[len(rows), vocab]` added to the rows
`rows` of the logits: a grammar's whole mask in one call). Nothing is changed in place: a sampler
reads `ctx.adjusted_logits(logits)`, a new tensor with every change applied in one batched
operation per kind (made once per step and shared: the default sampler, the logprobs the engine
records), or the rows of floats with them applied; in simulation (no logits) the default sampler's
stand-in tokens skip the banned ones. After the hook the engine refuses an answer whose token a
sequence was banned (`PluginError` naming the sampler), unless that sequence was ended by `ctx.fail`.
"""

from __future__ import annotations

import math
from typing import Any

from .sequence import Sequence


class LogitMasks:
    """The bans and biases registered in one `sample` call, by row of the call's `seqs`."""

    __slots__ = ("seqs", "_row", "banned", "biases", "row_biases", "_applied", "_source")

    def __init__(self, seqs: list[Sequence]) -> None:
        self.seqs = seqs
        self._row: dict[int, int] | None = None
        self.banned: dict[int, set[int]] = {}
        """Row -> the token ids banned there."""
        self.biases: dict[int, dict[int, float]] = {}
        """Row -> token id -> the bias added there (finite ones; -inf goes to `banned`)."""
        self.row_biases: list[tuple[list[int], Any]] = []
        """`(rows, bias tensor)` pairs, in the order they were added."""
        self._applied: Any = None
        self._source: Any = None

    def __bool__(self) -> bool:
        return bool(self.banned or self.biases or self.row_biases)

    def row_of(self, seq: Sequence) -> int:
        """The row of `seq` in the call (ValueError if it is not one of the sequences sampled)."""
        if self._row is None:
            self._row = {id(s): i for i, s in enumerate(self.seqs)}
        row = self._row.get(id(seq))
        if row is None:
            raise ValueError(f"sequence {seq.request_id!r} is not one of the sequences being sampled")
        return row

    def ban(self, seq: Sequence, token_ids: Any) -> None:
        self._changed()
        self.banned.setdefault(self.row_of(seq), set()).update(int(t) for t in token_ids)

    def bias(self, seq: Sequence, biases: dict[int, float]) -> None:
        self._changed()
        row = self.row_of(seq)
        for tok, b in biases.items():
            b = float(b)
            if math.isnan(b):
                raise ValueError(f"bias of token {tok} is NaN")
            if b == -math.inf:
                self.banned.setdefault(row, set()).add(int(tok))
            else:
                into = self.biases.setdefault(row, {})
                into[int(tok)] = into.get(int(tok), 0.0) + b

    def add_rows(self, rows: list[int], bias: Any) -> None:
        if not hasattr(bias, "dim") or bias.dim() != 2 or bias.shape[0] != len(rows):
            raise ValueError(f"add_logits_bias wants a tensor [len(rows)={len(rows)}, vocab], got {_shape(bias)}")
        if any(not 0 <= r < len(self.seqs) for r in rows):
            raise ValueError(f"add_logits_bias rows must be in [0, {len(self.seqs)})")
        self._changed()
        self.row_biases.append((list(rows), bias))

    def _changed(self) -> None:
        self._applied = self._source = None

    # --- for samplers and the engine ------------------------------------------------------------

    def apply(self, logits: Any) -> Any:
        """`logits` with every change applied (a new tensor or new rows; `logits` itself when
        nothing was registered); None stays None."""
        if logits is None or not self:
            return logits
        if self._source is logits and self._applied is not None:
            return self._applied
        out = _apply_tensor(self, logits) if hasattr(logits, "dim") else _apply_rows(self, logits)
        self._applied, self._source = out, logits
        return out

    def violation(self, tokens: list[int], adjusted: Any, skip: Any = ()) -> str | None:
        """Why `tokens` break the masks (a token banned for its sequence, or one whose adjusted
        logit is -inf), or None; sequences in `skip` (ended by `ctx.fail`) are not checked."""
        for row, banned in self.banned.items():
            if tokens[row] in banned and self.seqs[row] not in skip:
                return self._message(row, tokens[row])
        if self.row_biases and hasattr(adjusted, "dim"):
            import torch

            idx = torch.tensor(tokens, device=adjusted.device)[:, None]
            bad = (adjusted.gather(1, idx).squeeze(1) == -torch.inf).nonzero().flatten().tolist()
            for row in bad:
                if self.seqs[row] not in skip:
                    return self._message(row, tokens[row])
        return None

    def _message(self, row: int, tok: int) -> str:
        rid = getattr(self.seqs[row], "request_id", row)
        return (f"token {tok} for request {rid!r} is masked (banned by a sample wrapper); "
                "a sampler must choose from ctx.adjusted_logits(logits)")


def _shape(x: Any) -> str:
    return str(tuple(x.shape)) if hasattr(x, "shape") else type(x).__name__


def _apply_rows(masks: LogitMasks, logits: Any) -> list[list[float]]:
    rows = [list(map(float, r)) for r in logits]
    for row, biases in masks.biases.items():
        for tok, b in biases.items():
            if 0 <= tok < len(rows[row]):
                rows[row][tok] += b
    for row, banned in masks.banned.items():
        for tok in banned:
            if 0 <= tok < len(rows[row]):
                rows[row][tok] = -math.inf
    for rws, bias in masks.row_biases:
        for j, row in enumerate(rws):
            rows[row] = [v + float(b) for v, b in zip(rows[row], bias[j].tolist())]
    return rows


def _apply_tensor(masks: LogitMasks, logits: Any) -> Any:
    """One clone, then one scatter per kind of change (never a loop over the vocabulary)."""
    import torch

    with torch.inference_mode(logits.is_inference()):
        vocab, device = logits.shape[1], logits.device
        x = logits.clone()
        if masks.biases:
            keys = [(r, t, b) for r, d in masks.biases.items() for t, b in d.items() if 0 <= t < vocab]
            if keys:
                r, t, b = zip(*keys)
                x.index_put_((_long(r, device), _long(t, device)),
                             torch.tensor(b, dtype=x.dtype, device=device), accumulate=True)
        for rws, bias in masks.row_biases:
            x.index_add_(0, _long(rws, device), bias.to(device=device, dtype=x.dtype))
        if masks.banned:
            keys2 = [(r, t) for r, s in masks.banned.items() for t in s if 0 <= t < vocab]
            if keys2:
                r2, t2 = zip(*keys2)
                x[_long(r2, device), _long(t2, device)] = -torch.inf
        return x


def _long(values: Any, device: Any) -> Any:
    import torch

    return torch.tensor(list(values), dtype=torch.long, device=device)
