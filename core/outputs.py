"""`RequestOutput`: what one step produced for one sequence (its new token, or its end)."""

from __future__ import annotations

from .sequence import FinishReason, Sequence


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
