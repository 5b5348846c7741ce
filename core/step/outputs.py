"""What a step produces for its requests: `Appender` appends the sampled tokens and ends the
sequences they stop; `RequestOutput` reports each new token, or an end."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..requests.sequence import FinishReason, Sequence

if TYPE_CHECKING:
    from ..requests.detokenizer import Detokenizer
    from .scheduler import Scheduler


class RequestOutput:
    """What one step produced for one sequence: its new token, or its end.

    `token_ids` is the whole output so far; `index` tells the samples of an `n > 1` request apart.
    """

    __slots__ = ("seq", "new_token_ids", "finished")

    def __init__(self, seq: Sequence, new_token_ids: list[int], finished: bool) -> None:
        self.seq = seq
        self.new_token_ids = new_token_ids
        self.finished = finished

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def index(self) -> int:
        return self.seq.index

    @property
    def token_ids(self) -> list[int]:
        return self.seq.output_token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.seq.finish_reason

    @property
    def text(self) -> str | None:
        """The detokenised output so far (None when the executor has no tokenizer)."""
        return self.seq.text

    def __repr__(self) -> str:
        return (
            f"RequestOutput({self.seq.seq_id!r}, new={self.new_token_ids}, finished={self.finished}, "
            f"reason={self.finish_reason})"
        )


class Appender:
    """Appends each sampled token to its sequence, stamps its time, ends the sequence when the
    token stops it (`stops`), and reports it as a `RequestOutput`."""

    __slots__ = ("scheduler", "eos_token_id", "max_model_len", "detokenizer")

    def __init__(
        self, scheduler: Scheduler, eos_token_id: int | None, max_model_len: int, detokenizer: Detokenizer | None
    ) -> None:
        self.scheduler = scheduler
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.detokenizer = detokenizer

    def append(self, seqs: list[Sequence], tokens: list[int], now: float, outputs: list[RequestOutput] | None) -> None:
        """Append `tokens[i]` to `seqs[i]` at time `now`; `outputs` (None: no outputs) gets one
        `RequestOutput` for each."""
        eos, max_len, detok = self.eos_token_id, self.max_model_len, self.detokenizer
        for seq, tok in zip(seqs, tokens):
            token_ids = seq.token_ids
            token_ids.append(tok)
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = seq.prefill_done_time = now
            p = seq.sampling
            n = len(token_ids)
            if (  # the cheap test first: most tokens stop nothing
                detok is not None or n - seq.num_prompt_tokens >= p.max_new_tokens or n >= max_len
                or tok == eos or p.stop_token_ids
            ) and self.stops(seq, tok, now):
                if outputs is not None:
                    outputs.append(RequestOutput(seq, [tok], True))
            elif outputs is not None:
                outputs.append(RequestOutput(seq, [tok], False))

    def stops(self, seq: Sequence, tok: int, now: float) -> bool:
        """End `seq` if its new token `tok` stops it (stop token or string, EOS, or length); True if
        so. Before `min_tokens` outputs only the length stops it; with a tokenizer the new token is
        detokenised here (every token, so `seq.text` grows)."""
        p = seq.sampling
        num_out = seq.num_output_tokens
        stops = num_out >= p.min_tokens
        detok = self.detokenizer
        stop_hit = detok is not None and detok.append(seq, p.stop if stops else ())
        reason = None
        if stops:
            if tok in p.stop_token_ids or stop_hit:
                reason = FinishReason.STOP
            elif tok == self.eos_token_id and not p.ignore_eos:
                reason = FinishReason.EOS
        if reason is None and (num_out >= p.max_new_tokens or len(seq.token_ids) >= self.max_model_len):
            reason = FinishReason.LENGTH
        if reason is None:
            return False
        self.scheduler.finish(seq, reason, now)
        return True
