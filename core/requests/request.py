"""What a client submits: a `Request` and its `SamplingParams`, validated by pydantic at the edge.

Inside the scheduler a request lives on as a `Sequence` (see `sequence.py`); nothing in the step
touches these models again.
"""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

_ids = itertools.count()


def _next_id() -> str:
    return f"req-{next(_ids)}"


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""The bounds of `priority` (a 32-bit signed integer, as a wire format would carry it) and of the
other integers that reach plugins (`expected_output_tokens`, `top_k`, `min_tokens`, the stop
token ids, a `metadata` integer): a policy computes with them in floats, so nothing larger gets in."""
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""The seeds a generator takes (`torch.Generator.manual_seed`'s range)."""
MAX_DEADLINE = 1e12
"""The latest `deadline` (seconds on the engine's clock, about 31,700 years): any finite float
computes, this keeps every sum and product of deadlines finite."""

GREEDY_TEMPERATURE = 1e-5
"""Below this temperature sampling is greedy (vLLM's threshold)."""

STRUCTURED_OUTPUT_PLUGIN = "structured_output"
"""The name of the plugin that enforces `SamplingParams.structured_output` (the torch executor
brings one, `metroline.plugins_contrib.structured_output`); without a plugin of that name loaded,
an engine refuses structured requests."""


class StructuredOutput(BaseModel):
    """What a request's output must be, enforced by a grammar on the model's logits (vLLM's
    `structured_outputs`; the server fills it from OpenAI's `response_format`). Exactly one of:

    - `json_schema`: a JSON Schema (a dict, or its JSON text; kept as text) the output validates
      against: `{"type": "object", "properties": {...}, "required": [...]}`;
    - `json_object`: True for any JSON object.

    Whether a schema compiles is checked when the request is submitted, by the plugin that enforces
    it (`STRUCTURED_OUTPUT_PLUGIN`): one it cannot compile refuses the request.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: str | None = None
    json_object: Annotated[bool, Field(strict=True)] = False

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_text(cls, v: Any) -> Any:
        if isinstance(v, dict):
            try:
                return json.dumps(v, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"is not JSON: {exc}") from None
        if isinstance(v, str):
            try:
                parsed = json.loads(v)
            except ValueError as exc:
                raise ValueError(f"is not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise ValueError(f"must be a JSON object (a schema), got {type(parsed).__name__}")
        elif v is not None:
            raise ValueError(f"must be a JSON schema (an object), got {type(v).__name__}")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutput:
        if (self.json_schema is not None) == self.json_object:
            raise ValueError("give exactly one of json_schema and json_object")
        return self

    def schema_dict(self) -> dict[str, Any]:
        """The schema the output validates against (`{"type": "object"}` for `json_object`)."""
        return json.loads(self.json_schema) if self.json_schema is not None else {"type": "object"}


class SamplingParams(BaseModel):
    """How the tokens of a request are chosen and when it stops (vLLM / OpenAI semantics).

    - `temperature` below `GREEDY_TEMPERATURE` (1e-5, vLLM's threshold; 0 included) is greedy: the
      argmax after the penalties (dividing by a tinier one would overflow float32 logits to ties
      at infinity); otherwise logits are divided by it, then `min_p` (drop tokens whose probability is below `min_p` x the top one's), `top_k`
      (keep the k largest logits; 0 or None: all) and `top_p` (keep the smallest set of tokens whose
      probability reaches `top_p`; 1: all) filter the distribution, in that order.
    - `repetition_penalty` (> 0, 1 = off) divides the positive logits and multiplies the negative
      ones of every token seen in the prompt or the output; `frequency_penalty` subtracts
      penalty x count and `presence_penalty` subtracts penalty once for every token of the output.
    - `seed`: the tokens depend only on (seed, sample index, position), never on the batch.
    - `stop` strings end the request when they appear in the detokenised output (the text is cut
      before them; the tokens are kept); `stop_token_ids` and EOS end it on that token, unless
      `ignore_eos` (EOS only). Before `min_tokens` output tokens, EOS and the stop token ids are
      never sampled and no stop condition applies.
    - `n > 1` asks for several completions of one prompt; they share the prompt's KV blocks.
    - `logprobs = k` (0 to 20) records, for every output token, its log-probability and the `k`
      most likely tokens with theirs, from the model's raw logits (before temperature, penalties
      and filters, as vLLM's default): `Sequence.logprobs`. It needs an executor that produces
      logits (a real model); the simulated one records nothing.
    - `structured_output` (`StructuredOutput`: a JSON schema, or any JSON object) holds the output
      to a grammar: at every token only what the grammar allows may be sampled, and EOS only where
      it is complete. It needs a plugin that enforces it on a model's logits (the torch executor
      brings one); an engine without one refuses the request. Not with `ignore_eos` (the output
      ends where the grammar does).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    # types are strict (a bool is not an int, "1" is not a number); lists still make tuples

    max_new_tokens: Annotated[int, Field(ge=1, strict=True)] = 16
    temperature: Annotated[float, Field(ge=0.0, strict=True, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int | None, Field(ge=0, le=INT32_MAX, strict=True)] = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, strict=True)] = 1.0
    min_p: Annotated[float, Field(ge=0.0, le=1.0, strict=True)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0, strict=True, allow_inf_nan=False)] = 1.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True)] = 0.0
    seed: Annotated[int | None, Field(ge=SEED_MIN, le=SEED_MAX, strict=True)] = None
    stop: tuple[Annotated[str, Field(min_length=1, strict=True)], ...] = ()
    stop_token_ids: tuple[Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)], ...] = ()
    ignore_eos: Annotated[bool, Field(strict=True)] = False
    min_tokens: Annotated[int, Field(ge=0, le=INT32_MAX, strict=True)] = 0
    n: Annotated[int, Field(ge=1, strict=True)] = 1
    logprobs: Annotated[int | None, Field(ge=0, le=20, strict=True)] = None
    structured_output: StructuredOutput | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, v: object) -> object:
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _min_below_max(self) -> SamplingParams:
        if self.min_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_new_tokens ({self.max_new_tokens})"
            )
        if self.structured_output is not None and self.ignore_eos:
            raise ValueError("ignore_eos: a structured output ends where its grammar does, with EOS")
        return self

    @property
    def greedy(self) -> bool:
        """True when the argmax is taken: `temperature < GREEDY_TEMPERATURE`."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def needs_penalties(self) -> bool:
        """True when a penalty changes the logits."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


METADATA_MAX_KEYS = 16
MetadataKey = Annotated[str, Field(min_length=1, max_length=64, strict=True)]
MetadataValue = Annotated[str, Field(max_length=512, strict=True)] | Annotated[
    bool, Field(strict=True)] | Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX, strict=True)] | Annotated[
    float, Field(strict=True, allow_inf_nan=False)]
"""A `Request.metadata` key and value: OpenAI's limits for strings, plus numbers (integers within
32 bits, finite floats) and booleans."""


class Request(BaseModel):
    """One generation request as submitted.

    `priority`: lower is more urgent, a 32-bit integer (`INT32_MIN` to `INT32_MAX`). `arrival_time`: seconds on the engine's clock; None means
    "now" when submitted. `expected_output_tokens`: an optional hint for policies such as SRPT.
    `deadline`: seconds on the engine's clock by which the client wants the request finished.
    `cache_salt`: an extra key for the prefix cache; requests only share KV with the same salt.
    `metadata`: fields for plugins, passed through unchanged (OpenAI's `metadata`, with its
    limits: at most `METADATA_MAX_KEYS` keys of 1 to 64 characters; values are strings of at most
    512 characters, or numbers or booleans), read on the `Sequence` as a read-only mapping.

    The limits that depend on the engine (prompt + max_new_tokens <= max_model_len) are checked
    when the request is validated with the engine's config as context (`Engine.add_request`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(default_factory=_next_id, min_length=1, strict=True)
    tenant: str = Field(default="default", min_length=1, strict=True)
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX, strict=True)
    arrival_time: float | None = Field(default=None, ge=0.0, allow_inf_nan=False, strict=True)
    prompt_token_ids: list[Annotated[int, Field(ge=0, strict=True)]] = Field(min_length=1)
    expected_output_tokens: Annotated[int | None, Field(ge=0, le=INT32_MAX, strict=True)] = None
    deadline: float | None = Field(default=None, ge=0.0, le=MAX_DEADLINE, allow_inf_nan=False, strict=True)
    cache_salt: str | None = Field(default=None, strict=True)
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=METADATA_MAX_KEYS)
    sampling: SamplingParams = Field(default_factory=SamplingParams)

    @model_validator(mode="after")
    def _fits_engine(self, info: ValidationInfo) -> Request:
        problem = engine_limit_problem(self, info.context)
        if problem:
            raise ValueError(problem)
        return self


def engine_limit_problem(request: Request, context: dict | None) -> str | None:
    """What makes `request` unfit for an engine whose limits are in `context` (`max_model_len`,
    `max_kv_tokens`, `max_num_seqs`, `vocab_size`, `tokenizer`: whether there is one,
    `structured_output`: whether a plugin enforces structured outputs), or None."""
    if not context:
        return None
    prompt = request.prompt_token_ids
    problem = length_problem(len(prompt), request.sampling.max_new_tokens, request.sampling.n, context)
    if problem is not None:
        return problem
    if request.sampling.stop and context.get("tokenizer") is False:
        return "sampling.stop: stop strings need a tokenizer and this engine's executor has none"
    if request.sampling.structured_output is not None and context.get("structured_output") is False:
        return (f"sampling.structured_output: no plugin enforces it here (a {STRUCTURED_OUTPUT_PLUGIN!r} plugin on "
                "a model's logits; the torch executor brings one, the simulated executor has no logits)")
    vocab = context.get("vocab_size")
    if vocab is not None and max(prompt) >= vocab:
        return f"prompt_token_ids: token id {max(prompt)} is not below vocab_size={vocab}"
    return None


def length_problem(prompt_len: int, max_new_tokens: int, n: int, context: dict) -> str | None:
    """What makes a request of these lengths unfit for an engine whose limits are in `context`
    (see `engine_limit_problem`), or None; cheap enough to check before a prompt is made."""
    total = prompt_len + max_new_tokens
    max_len = context.get("max_model_len")
    if max_len is not None and total > max_len:
        why = context.get("max_model_len_reason")
        return (
            f"prompt_token_ids ({prompt_len} tokens) + sampling.max_new_tokens "
            f"({max_new_tokens}) = {total} exceeds max_model_len={max_len}" + (f" ({why})" if why else "")
        )
    max_tokens = context.get("max_kv_tokens")
    if max_tokens is not None and total > max_tokens:
        return (
            f"prompt_token_ids + sampling.max_new_tokens = {total} tokens exceeds the KV pool "
            f"(num_blocks * block_size = {max_tokens})"
        )
    max_seqs = context.get("max_num_seqs")
    if max_seqs is not None and n > max_seqs:
        return f"sampling.n ({n}) exceeds max_num_seqs={max_seqs}: its samples could never run together"
    return None
