"""The OpenAI wire format: request bodies (pydantic), response and chunk bodies, errors, SSE.

Metroline's own fields ride along in the body (the `openai` client sends them with `extra_body`):
`priority` (lower is more urgent), `deadline_s` (seconds from now), `expected_output_tokens`
and `stop_token_ids`; they reach the plugins on the request's `Sequence` (`deadline_s` as
`seq.deadline`, the absolute engine-clock time arrival + `deadline_s`; the others unchanged), and so does
OpenAI's own `metadata` (string keys and values, numbers and booleans too: `Sequence.metadata`),
the place for any field a plugin of one's own reads.
"""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ..requests.request import METADATA_MAX_KEYS, MetadataKey, MetadataValue, StructuredOutput

UNSUPPORTED = ("echo", "suffix", "logit_bias", "best_of", "tools", "functions")
"""OpenAI fields this server does not implement: a request that asks for one (a value other than
null, false, 0 or empty) answers 400 naming it rather than a reply that silently lacks it."""


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`: `name` (1 to 64 of a-z, A-Z, 0-9, _ and -, as
    OpenAI's), `description`, `schema` (the JSON Schema the output validates against) and
    `strict` (accepted; the output follows the schema whatever its value)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: `{"type": "text"}` (the default: no constraint),
    `{"type": "json_object"}` (any JSON object) or `{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": ...}}`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(default=None, validate_default=True)

    @field_validator("json_schema")
    @classmethod
    def _schema_given(cls, value: JsonSchemaFormat | None, info: ValidationInfo) -> JsonSchemaFormat | None:
        if value is None and info.data.get("type") == "json_schema":
            raise ValueError("required when type is 'json_schema'")
        return value

    def structured_output(self) -> StructuredOutput | None:
        """The engine's `StructuredOutput` for this format (None for text)."""
        if self.type == "json_object":
            return StructuredOutput(json_object=True)
        if self.type == "json_schema" and self.json_schema is not None:
            return StructuredOutput(json_schema=self.json_schema.schema_)
        return None

    @property
    def schema_param(self) -> str:
        """The body field a problem with the grammar is about."""
        return "response_format.json_schema.schema" if self.type == "json_schema" else "response_format"


class _Body(BaseModel):
    # unknown fields (user, store, ...) are accepted and ignored, as OpenAI's are; fields of
    # features not implemented here (`UNSUPPORTED`) are refused when they ask for something
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    priority: int | None = None
    deadline_s: float | None = Field(default=None, gt=0.0)
    expected_output_tokens: int | None = Field(default=None, ge=0)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=METADATA_MAX_KEYS)

    echo: Any = None
    suffix: Any = None
    logit_bias: Any = None
    best_of: Any = None
    tools: Any = None
    functions: Any = None
    response_format: ResponseFormat | None = None

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _refuse_unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        if value in (None, False, 0, "", [], {}):
            return value
        if info.field_name == "best_of" and value == info.data.get("n"):
            return value
        raise ValueError(f"not supported by this server (got {value!r})")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    @property
    def structured(self) -> ResponseFormat | None:
        """`response_format` when it constrains the output (json_object, json_schema), else None."""
        rf = self.response_format
        return rf if rf is not None and rf.type != "text" else None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.get("text", "") for part in self.content if isinstance(part, dict))
        return self.content or ""


class ChatCompletionBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    @property
    def logprobs_k(self) -> int | None:
        """`SamplingParams.logprobs`: the top alternatives to return, None for no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionBody(_Body):
    prompt: Any
    """A text, a list of token ids, or a batch: a list of texts or of token-id lists (none empty)."""
    logprobs: int | None = Field(default=None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(type(t) is int for t in x)

        def text(x: Any) -> bool:
            return isinstance(x, str) and bool(x)

        if text(value) or ids(value) or (isinstance(value, list) and value and (
                all(map(text, value)) or all(map(ids, value)))):
            return value
        raise ValueError("must be a text, a list of token ids, or a list of texts or of token-id lists, "
                         "none empty")

    @property
    def logprobs_k(self) -> int | None:
        return self.logprobs


def prompts_of(prompt: Any) -> list[str | list[int]]:
    """The prompts of a completion body's `prompt`: a text or a token list is one; a list of texts
    or of token lists is several (OpenAI's batch of prompts)."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class Shapes:
    """Builds the response and chunk bodies of one request (`chat` or plain completion).

    The chunks that carry text, one per token or so, are the server's hottest path: `delta` writes
    their SSE frame from a prefix encoded once per request and the text quoted by the json module's
    C string encoder, with no dict built and no general `json.dumps` (it equals `sse(chunk(...))`
    byte for byte). The rare chunks (a choice's end, usage) go through `chunk`."""

    __slots__ = ("id", "model", "chat", "created", "_head_json")

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())
        head = json.dumps(self._head(True), separators=(",", ":"))
        self._head_json = "data: " + head[:-1] + ',"choices":[{"index":'

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

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
