"""What a client submits: a `Request` and its `SamplingParams`, validated by pydantic at the edge.

Inside the scheduler a request lives on as a `Sequence` (see `sequence.py`); nothing in the step
touches these models again.
"""

from __future__ import annotations

import itertools
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

_ids = itertools.count()


def _next_id() -> str:
    return f"req-{next(_ids)}"


GREEDY_TEMPERATURE = 1e-5
"""Below this temperature sampling is greedy (vLLM's threshold)."""


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
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    # types are strict (a bool is not an int, "1" is not a number); lists still make tuples

    max_new_tokens: Annotated[int, Field(ge=1, strict=True)] = 16
    temperature: Annotated[float, Field(ge=0.0, strict=True, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int | None, Field(ge=0, strict=True)] = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, strict=True)] = 1.0
    min_p: Annotated[float, Field(ge=0.0, le=1.0, strict=True)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0, strict=True, allow_inf_nan=False)] = 1.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0, strict=True)] = 0.0
    seed: Annotated[int | None, Field(strict=True)] = None
    stop: tuple[Annotated[str, Field(min_length=1, strict=True)], ...] = ()
    stop_token_ids: tuple[Annotated[int, Field(ge=0, strict=True)], ...] = ()
    ignore_eos: Annotated[bool, Field(strict=True)] = False
    min_tokens: Annotated[int, Field(ge=0, strict=True)] = 0
    n: Annotated[int, Field(ge=1, strict=True)] = 1
    logprobs: Annotated[int | None, Field(ge=0, le=20, strict=True)] = None

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
    bool, Field(strict=True)] | Annotated[int, Field(strict=True)] | Annotated[
    float, Field(strict=True, allow_inf_nan=False)]
"""A `Request.metadata` key and value: OpenAI's limits for strings, plus numbers and booleans."""


class Request(BaseModel):
    """One generation request as submitted.

    `priority`: lower is more urgent. `arrival_time`: seconds on the engine's clock; None means
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
    priority: int = Field(default=0, strict=True)
    arrival_time: float | None = Field(default=None, ge=0.0, allow_inf_nan=False, strict=True)
    prompt_token_ids: list[Annotated[int, Field(ge=0, strict=True)]] = Field(min_length=1)
    expected_output_tokens: Annotated[int | None, Field(ge=0, strict=True)] = None
    deadline: float | None = Field(default=None, ge=0.0, allow_inf_nan=False, strict=True)
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
    `max_kv_tokens`, `max_num_seqs`, `vocab_size`, `tokenizer`: whether there is one), or None."""
    if not context:
        return None
    prompt = request.prompt_token_ids
    problem = length_problem(len(prompt), request.sampling.max_new_tokens, request.sampling.n, context)
    if problem is not None:
        return problem
    if request.sampling.stop and context.get("tokenizer") is False:
        return "sampling.stop: stop strings need a tokenizer and this engine's executor has none"
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
