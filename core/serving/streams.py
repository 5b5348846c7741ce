"""What a request's handler reads: its `RequestStream` (one `Choice` per sample), fed by the
`AsyncEngine` loop; and `Rejected`, a request refused before it reached the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..requests.request import Request
from ..requests.sequence import FinishReason


class Rejected(Exception):
    """A request refused before it reached the engine: HTTP `status`, and `retry_after` seconds
    for a 429."""

    def __init__(self, message: str, status: int = 429, retry_after: float | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.reason = reason or ("queue_full" if status == 429 else "unavailable")


class Choice:
    """One sample of a request: its output `tokens`, the engine's `text` of them (None without a
    tokenizer), its `finish_reason` once it ended and, when asked for, its `logprobs` (the
    sequence's `Sequence.logprobs`, one entry per token; None otherwise)."""

    __slots__ = ("index", "tokens", "text", "finish_reason", "logprobs")

    def __init__(self, index: int) -> None:
        self.index = index
        self.tokens: list[int] = []
        self.text: str | None = None
        self.finish_reason: FinishReason | None = None
        self.logprobs: list | None = None


class RequestStream:
    """One request's output as the engine produces it, for the handler that streams it.

    `choices` has one `Choice` per sample (`sampling.n`); `unread` counts the tokens produced since
    the handler last called `wait()`; `finish_reason` and `error` are set when the whole request
    has ended (every sample, or the request failed or was cancelled). `on_read(stream)` is told
    each time the handler has taken everything (backpressure resumes a paused request there)."""

    __slots__ = ("request", "choices", "unread", "finish_reason", "error", "cached_tokens", "_live", "_event",
                 "_on_read")

    def __init__(self, request: Request, on_read: Callable[[RequestStream], None] | None = None,
                 event: asyncio.Event | None = None) -> None:
        self.request = request
        self.choices = [Choice(i) for i in range(request.sampling.n)]
        self.unread = 0
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.cached_tokens = 0  # prompt tokens served from the prefix cache (known at the first token)
        self._live = {0}  # samples not ended (the others appear at the first token)
        self._event = event or asyncio.Event()  # a `StreamGroup`'s streams share theirs
        self._on_read = on_read

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def request_ids(self) -> list[str]:
        return [self.request.request_id]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def tokens(self) -> list[int]:
        """The output tokens of the first sample."""
        return self.choices[0].tokens

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.choices)

    async def wait(self) -> None:
        """Wait for output not taken yet (or the end), and take it: the reader has caught up."""
        while not self.unread and not self.finished:
            self._event.clear()
            await self._event.wait()
        self.unread = 0
        if self._on_read is not None:
            self._on_read(self)

    async def result(self) -> list[int]:
        """Wait for the end; the first sample's output tokens."""
        while not self.finished:
            await self.wait()
        return self.tokens


class StreamGroup:
    """The streams of one completion request with several prompts (`prompt: [...]`), read as one:
    `choices` are theirs in order (prompt by prompt, each prompt's `n` samples), so a choice's
    OpenAI index is its place in that list. The streams share one wake-up event."""

    def __init__(self, streams: list[RequestStream]) -> None:
        self.streams = streams
        self.choices = [c for s in streams for c in s.choices]

    @property
    def request_ids(self) -> list[str]:
        return [s.request_id for s in self.streams]

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.streams)

    @property
    def finish_reason(self) -> FinishReason | None:
        """None until every stream ended; then failed or cancelled if one was, else the first's."""
        if not self.finished:
            return None
        return end_of([s.finish_reason for s in self.streams])

    @property
    def error(self) -> str | None:
        return next((s.error for s in self.streams if s.error), None)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(s.num_prompt_tokens for s in self.streams)

    @property
    def cached_tokens(self) -> int:
        return sum(s.cached_tokens for s in self.streams)

    @property
    def num_output_tokens(self) -> int:
        return sum(s.num_output_tokens for s in self.streams)

    async def wait(self) -> None:
        """Wait for output of any stream not taken yet (or the end of all), and take it."""
        event = self.streams[0]._event
        while not any(s.unread for s in self.streams) and not self.finished:
            event.clear()
            await event.wait()
        for s in self.streams:
            if s.unread or s.finished:
                await s.wait()

    async def result(self) -> None:
        """Wait for the end of every stream."""
        while not self.finished:
            await self.wait()


def end_of(reasons: list[FinishReason | None]) -> FinishReason:
    """One end from several (a request's samples, a batch's requests): failed if one failed, else
    cancelled if one was, else the first one's (stop, eos, length: each keeps its own)."""
    for bad in (FinishReason.FAILED, FinishReason.CANCELLED):
        if bad in reasons:
            return bad
    return reasons[0] or FinishReason.FAILED


def request_end(choices: list[Choice]) -> FinishReason:
    """A request's end from its samples' ends (`end_of`)."""
    return end_of([c.finish_reason for c in choices])
