"""Synthetic workload specs: `SyntheticSpec` (how many requests, arrival process, length
distributions, tenants, priorities, shared prefixes, seed), its length distributions, and
`load_spec`, which reads one from a TOML or JSON file. `core/workload_generators.py` turns a spec
into requests.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .workload_items import MAX_ITEM_TOKENS, MAX_REQUESTS, WorkloadError


class FixedLength(BaseModel):
    """Always `value` tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_ITEM_TOKENS)

    def sample(self, rng: random.Random) -> int:
        return self.value


class UniformLength(BaseModel):
    """An integer drawn uniformly from [low, high]."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dist: Literal["uniform"]
    low: int = Field(ge=1, le=MAX_ITEM_TOKENS)
    high: int = Field(ge=1, le=MAX_ITEM_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


class LognormalLength(BaseModel):
    """A lognormal length whose mean (before rounding and clipping) is `mean` tokens.

    `sigma` is the standard deviation of the underlying normal; samples are rounded and clipped
    to [min, max].
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    dist: Literal["lognormal"]
    mean: float = Field(gt=0, le=MAX_ITEM_TOKENS, allow_inf_nan=False)
    sigma: float = Field(ge=0, le=10, allow_inf_nan=False)
    min: int = Field(default=1, ge=1, le=MAX_ITEM_TOKENS)
    max: int | None = Field(default=None, ge=1, le=MAX_ITEM_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def sample(self, rng: random.Random) -> int:
        high = MAX_ITEM_TOKENS if self.max is None else self.max
        x = rng.lognormvariate(math.log(self.mean) - self.sigma**2 / 2, self.sigma)
        return max(self.min, min(high, round(x))) if x < high else high


def _int_is_fixed(v: Any) -> Any:
    return {"dist": "fixed", "value": v} if isinstance(v, int) and not isinstance(v, bool) else v


LengthDist = Annotated[
    Union[FixedLength, UniformLength, LognormalLength],
    Field(discriminator="dist"),
    BeforeValidator(_int_is_fixed),
]
"""A length distribution: `{"dist": "fixed", "value"}`, `{"dist": "uniform", "low", "high"}`,
`{"dist": "lognormal", "mean", "sigma", "min", "max"}`, or a bare integer (fixed)."""


def _normalised(shares: dict, what: str) -> dict:
    total = sum(shares.values())
    if not shares or total <= 0:
        raise ValueError(f"{what} shares must be >= 0 and sum to more than 0")
    return {k: v / total for k, v in shares.items()}


MAX_SHARE = 1e12
Share = Annotated[float, Field(ge=0, le=MAX_SHARE, allow_inf_nan=False)]


class SyntheticSpec(BaseModel):
    """A synthetic workload.

    - `rate`: mean arrivals per second; None puts every request at t=0. The first request arrives
      at t=0 and the gaps follow `arrival`: "poisson" (exponential gaps) or "gamma" (gamma gaps
      of shape `burstiness`, so CV² = 1/burstiness: below 1 is burstier than poisson).
    - `prompt_len`: the length of each request's own prompt, *after* the shared system prompt of
      `shared_prefix_len` tokens (one of `num_prefixes`, picked uniformly); so a prompt is
      shared_prefix_len + prompt_len tokens.
    - `tenants` ({name: share}) and `priorities` ({priority: share}): shares, normalised.
    - `seed`: everything is a function of the spec; each attribute (arrivals, lengths, tenants,
      ...) draws from its own stream, so changing one leaves the others as they were.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_requests: int = Field(ge=1, le=MAX_REQUESTS)
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    arrival: Literal["poisson", "gamma"] = "poisson"
    burstiness: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    prompt_len: LengthDist
    output_len: LengthDist
    tenants: dict[Annotated[str, Field(min_length=1)], Share] = Field(
        default_factory=lambda: {"default": 1.0}
    )
    priorities: dict[int, Share] = Field(default_factory=lambda: {0: 1.0})
    shared_prefix_len: int = Field(default=0, ge=0)
    num_prefixes: int = Field(default=1, ge=1)
    seed: int = Field(default=0, ge=-(2**63), lt=2**63)

    @field_validator("tenants")
    @classmethod
    def _tenant_shares(cls, v: dict) -> dict:
        return _normalised(v, "tenant")

    @field_validator("priorities")
    @classmethod
    def _priority_shares(cls, v: dict) -> dict:
        return _normalised(v, "priority")

    @model_validator(mode="after")
    def _consistent(self) -> SyntheticSpec:
        if self.arrival == "poisson" and self.burstiness != 1.0:
            raise ValueError("burstiness applies to arrival='gamma' only")
        if self.num_prefixes > 1 and self.shared_prefix_len == 0:
            raise ValueError(f"num_prefixes={self.num_prefixes} needs shared_prefix_len >= 1")
        return self



def _validation_lines(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(spec)"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def spec_namespace(spec: SyntheticSpec) -> str:
    """The namespace of a spec's requests (`generate`): a digest of its content, so a spec file's
    workload does not depend on the file's name, and two files with the same content give the
    same workload. The seed (already in every stream's key) and `num_requests` are left out, so
    the first k requests of a spec are those of the same spec cut to k requests."""
    content = json.dumps(spec.model_dump(mode="json", exclude={"seed", "num_requests"}), sort_keys=True)
    return "spec-" + hashlib.blake2b(content.encode(), digest_size=8).hexdigest()


def load_spec(path: str | Path) -> SyntheticSpec:
    """Read a `SyntheticSpec` from a TOML or JSON file; errors name the file and the field."""
    from .config import ConfigError, read_text

    path = Path(path)
    try:
        text = read_text(path, "workload spec")
    except ConfigError as e:
        raise WorkloadError(str(e)) from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise WorkloadError(f"{path}: cannot read workload spec: {e}") from None
    try:
        return SyntheticSpec.model_validate(data)
    except ValidationError as e:
        raise WorkloadError(f"{path}: invalid workload spec:\n{_validation_lines(e)}") from None

