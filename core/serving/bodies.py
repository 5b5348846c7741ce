"""The OpenAI request bodies (pydantic): completions and chat completions, `response_format`.

Metroline's own fields ride along in the body (the `openai` client sends them with `extra_body`):
`priority` (lower is more urgent), `deadline_s` (seconds from now), `expected_output_tokens`
and `stop_token_ids`; they reach the plugins on the request's `Sequence` (`deadline_s` as
`seq.deadline`, the absolute engine-clock time arrival + `deadline_s`; the others unchanged), and so does
OpenAI's own `metadata` (string keys and values, numbers and booleans too: `Sequence.metadata`),
the place for any field a plugin of one's own reads.

Every field is checked here, so a malformed body answers 400 naming the field; the numbers that
reach plugins are bounded (`priority`, `expected_output_tokens` and the other integers within 32
bits, `seed` within a generator's 64, `deadline_s` finite and at most `MAX_DEADLINE_S`): a chat message's
content parts must be `{"type": "text", "text": str}`; `stop` holds at most `MAX_STOP` strings of
at most `MAX_STOP_CHARS` characters each (each stop string is searched for after every token).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..requests.request import (
    INT32_MAX,
    INT32_MIN,
    METADATA_MAX_KEYS,
    SEED_MAX,
    SEED_MIN,
    MetadataKey,
    MetadataValue,
    StructuredOutput,
)

MAX_STOP = 16
"""The most stop strings a request may give (OpenAI allows 4)."""
MAX_STOP_CHARS = 256
"""The longest stop string, in characters."""
MAX_DEADLINE_S = 365 * 24 * 3600.0
"""The longest `deadline_s`, a year in seconds."""

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
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    min_tokens: int = Field(default=0, ge=0, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    n: int = Field(default=1, ge=1, le=INT32_MAX)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] = Field(default_factory=list, max_length=1024)
    ignore_eos: bool = False
    priority: int | None = Field(default=None, ge=INT32_MIN, le=INT32_MAX)
    deadline_s: float | None = Field(default=None, gt=0.0, le=MAX_DEADLINE_S, allow_inf_nan=False)
    expected_output_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=METADATA_MAX_KEYS)

    echo: Any = None
    suffix: Any = None
    logit_bias: Any = None
    best_of: Any = None
    tools: Any = None
    functions: Any = None
    response_format: ResponseFormat | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: Any) -> Any:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings (got {len(stops)})")
        longest = max(map(len, stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string is at most {MAX_STOP_CHARS} characters (got {longest})")
        return value

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


class TextPart(BaseModel):
    """A part of a message's content: only text (`{"type": "text", "text": "..."}`)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = ""

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
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
