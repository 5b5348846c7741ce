"""`SpeculativeConfig`: speculative decoding in vLLM's shape (`--speculative-config`), and the
simulator's acceptance model and draft cost.

vLLM's fields: `method` (`"ngram"`: prompt lookup; `"draft_model"`: a smaller causal LM with the
same tokenizer, `model`), `num_speculative_tokens` (the most draft tokens a decode carries in one
step; the `num_draft_tokens` hook may give fewer), `prompt_lookup_min` / `prompt_lookup_max` (the
n-gram sizes the lookup tries, longest first) and `num_lookahead_tokens` (extra KV slots a drafting
decode holds beyond its verified tokens; by default `num_speculative_tokens` for a draft model,
whose own KV runs ahead of the target's, and 0 for n-gram lookup).

The simulator's fields (a real executor ignores them):

- `acceptance_rate`: the mean probability that a draft token is accepted, given that the ones
  before it were; `acceptance_concentration`: None gives every request exactly that rate, a number
  `c` draws each request's rate from Beta(rate * c, (1 - rate) * c); a request's own
  `metadata["acceptance_rate"]` (from the workload) overrides both; `acceptance_by_position`:
  the probability for the 1st, 2nd, ... draft position instead (the last repeats).
  The draws are keyed on (`seed`, request id, sample index, position), so two runs of one workload
  accept the same drafts of the same request (paired A/B runs).
- `draft_cost`: the draft model's forward as a fraction of the target's forward over the same
  decodes (None: 0.1 for `draft_model`, 0 for `ngram`, whose lookup costs about nothing).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SpeculativeMethod = Literal["ngram", "draft_model"]
MAX_SPECULATIVE_TOKENS = 32
"""The most draft tokens one decode may carry in a step."""
DEFAULT_DRAFT_COST = 0.1
"""A draft model's forward as a fraction of the target's, when `draft_cost` is not given."""


class SpeculativeConfig(BaseModel):
    """Speculative decoding's settings (see the module docstring); unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=1024)
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=1024)
    model: str | None = None
    num_lookahead_tokens: int | None = Field(default=None, ge=0, le=MAX_SPECULATIVE_TOKENS)
    acceptance_rate: float = Field(default=0.7, ge=0, le=1, allow_inf_nan=False)
    acceptance_concentration: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    acceptance_by_position: list[float] | None = Field(default=None, min_length=1)
    draft_cost: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _method_from_model(cls, data: Any) -> Any:
        """vLLM infers the method from the fields: `model` alone means a draft model."""
        if isinstance(data, dict) and "method" not in data and data.get("model") is not None:
            data = {**data, "method": "draft_model"}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative_config.model: method 'draft_model' needs the draft model's name or path")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo = hi = 5  # vLLM's default when neither is given
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            if lo > hi:
                raise ValueError(
                    f"speculative_config.prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})"
                )
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
        for i, p in enumerate(self.acceptance_by_position or ()):
            if not 0 <= p <= 1:
                raise ValueError(f"speculative_config.acceptance_by_position[{i}] must be in [0, 1], got {p}")
        return self

    @property
    def lookahead(self) -> int:
        """KV slots a drafting decode holds beyond its verified tokens (`num_lookahead_tokens`)."""
        if self.num_lookahead_tokens is not None:
            return self.num_lookahead_tokens
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    @property
    def draft_cost_ratio(self) -> float:
        """The draft model's forward as a fraction of the target's (see `draft_cost`)."""
        if self.draft_cost is not None:
            return self.draft_cost
        return DEFAULT_DRAFT_COST if self.method == "draft_model" else 0.0


def speculative_json(text: str) -> dict[str, Any]:
    """`--speculative-config`'s JSON object (vLLM's shape); ValueError naming the flag otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"--speculative-config: expected a JSON object, got {text!r:.60}")
    return value


def parse_speculative_config(text: str | dict[str, Any]) -> SpeculativeConfig:
    """`--speculative-config`'s JSON (or its dict) as a `SpeculativeConfig`; ValueError naming the
    field otherwise."""
    return SpeculativeConfig.model_validate(speculative_json(text) if isinstance(text, str) else text)
