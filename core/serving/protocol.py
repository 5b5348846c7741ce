"""The OpenAI wire format out: response and chunk bodies, usage, errors, server-sent events
(the request bodies are `metroline.core.serving.bodies`'s, re-exported here)."""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from pydantic import ValidationError

from .bodies import (  # noqa: F401  (the request bodies, where they were)
    UNSUPPORTED, ChatCompletionBody, ChatMessage, CompletionBody, JsonSchemaFormat, ResponseFormat, prompts_of,
)


def token_text(tokenizer: Any, token: int) -> str:
    """One token's text as the logprobs show it."""
    return tokenizer.decode([token])


def logprobs_body(chat: bool, entries: list, tokenizer: Any, offset: int = 0) -> dict:
    """OpenAI's `logprobs` of a chunk or a choice from `Sequence.logprobs` entries: chat's
    `{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`, a completion's `{"tokens",
    "token_logprobs", "top_logprobs", "text_offset"}` (offsets from `offset` characters into the
    text)."""
    def item(token: int, lp: float) -> dict:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    if chat:
        return {"content": [{**item(tok, lp), "top_logprobs": [item(t, v) for t, v in top]}
                            for tok, (lp, top) in entries]}
    tokens = [token_text(tokenizer, tok) for tok, _ in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [lp for _, (lp, _) in entries],
            "top_logprobs": [{token_text(tokenizer, t): v for t, v in top} for _, (_, top) in entries],
            "text_offset": offsets}


def field_of(exc: ValidationError) -> str:
    """The first invalid field of a pydantic error, dotted (`messages.0.role`)."""
    errors = exc.errors()
    return ".".join(str(p) for p in errors[0]["loc"]) if errors and errors[0]["loc"] else ""


def describe(exc: ValidationError) -> str:
    """One line per problem: `field: message`."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse_text(data: dict | str) -> str:
    """One server-sent event, as text."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n"


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    return sse_text(data).encode()


DONE_TEXT = sse_text("[DONE]")
DONE = DONE_TEXT.encode()


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's `usage`, with `prompt_tokens_details.cached_tokens` (prompt tokens served from the
    prefix cache)."""
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def fingerprint(*parts: Any) -> str:
    """A `system_fingerprint`: `fp_` and a short hash of what shapes the outputs (the version, the
    model, the engine's configuration), so that a client sees when the backend changed."""
    import hashlib

    return "fp_" + hashlib.sha256(repr(parts).encode()).hexdigest()[:10]


class Shapes:
    """Builds the response and chunk bodies of one request (`chat` or plain completion).

    The chunks that carry text, one per token or so, are the server's hottest path: `delta` writes
    their SSE frame from a prefix encoded once per request and the text quoted by the json module's
    C string encoder, with no dict built and no general `json.dumps` (it equals `sse(chunk(...))`
    byte for byte). The rare chunks (a choice's end, usage) go through `chunk`."""

    __slots__ = ("id", "model", "chat", "created", "fingerprint", "_head_json")

    def __init__(self, request_id: str, model: str, chat: bool, fingerprint: str | None = None) -> None:
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.chat = chat
        self.fingerprint = fingerprint
        self.created = int(time.time())
        head = json.dumps(self._head(True), separators=(",", ":"))
        self._head_json = "data: " + head[:-1] + ',"choices":[{"index":'

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def delta(self, index: int, text: str, first: bool = False) -> str:
        """The SSE frame of a chunk carrying `text` for choice `index` (not its last)."""
        if self.chat:
            role = '"role":"assistant",' if first else ""
            return (f'{self._head_json}{index},"delta":{{{role}"content":{_quote(text)}}},'
                    '"logprobs":null,"finish_reason":null}]}\n\n')
        return f'{self._head_json}{index},"text":{_quote(text)},"logprobs":null,"finish_reason":null}}]}}\n\n'

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False, use: dict | None = None,
              index: int = 0, logprobs: dict | None = None) -> dict:
        body = self._head(True)
        if self.chat:
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        body["choices"] = [choice]
        if use is not None:
            body["usage"] = use
        return body

    def usage_chunk(self, use: dict) -> dict:
        return {**self._head(True), "choices": [], "usage": use}

    def response(self, choices: list[tuple[str, str, dict | None]], use: dict) -> dict:
        """The whole (not streamed) answer: one (text, finish reason, logprobs) per choice."""
        body = self._head(False)
        if self.chat:
            body["choices"] = [
                {"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                 "finish_reason": reason}
                for i, (text, reason, lp) in enumerate(choices)
            ]
        else:
            body["choices"] = [
                {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
                for i, (text, reason, lp) in enumerate(choices)
            ]
        body["usage"] = use
        return body
