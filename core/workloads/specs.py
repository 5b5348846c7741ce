"""Synthetic workload specs: `SyntheticSpec` (how many requests, arrival process, length
distributions, tenants, priorities, shared prefixes, seed), its length distributions, and
`load_spec`, which reads one from a TOML or JSON file. `metroline.core.workloads.generators` turns a spec
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
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from .items import MAX_ITEM_TOKENS, MAX_REQUESTS, WorkloadError


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


def share_of(v: Any) -> float:
    """The share of a `tenants` entry: the number itself, or a `TenantSpec`'s `share`."""
    return v.share if isinstance(v, TenantSpec) else v


def _normalised(shares: dict, what: str) -> dict:
    total = sum(map(share_of, shares.values()))
    if not shares or total <= 0:
        raise ValueError(f"{what} shares must be >= 0 and sum to more than 0")
    return {
        k: v.model_copy(update={"share": v.share / total}) if isinstance(v, TenantSpec) else v / total
        for k, v in shares.items()
    }


MAX_SHARE = 1e12
Share = Annotated[float, Field(ge=0, le=MAX_SHARE, allow_inf_nan=False)]


class TenantSpec(BaseModel):
    """A tenant with its own lengths: its `share` of the requests and, optionally, its own
    `prompt_len` and `output_len` distributions (None: the spec's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    share: Share
    prompt_len: LengthDist | None = None
    output_len: LengthDist | None = None


def _tenant_kind(v: Any) -> str:
    return "tenant" if isinstance(v, (dict, TenantSpec)) else "share"


TenantEntry = Annotated[
    Union[Annotated[Share, Tag("share")], Annotated[TenantSpec, Tag("tenant")]],
    Discriminator(_tenant_kind),
]
"""A tenant of a spec: its share (a number), or a `TenantSpec` table with its own lengths."""


class SyntheticSpec(BaseModel):
    """A synthetic workload.

    - `rate`: mean arrivals per second; None puts every request at t=0. The first request arrives
      at t=0 and the gaps follow `arrival`: "poisson" (exponential gaps) or "gamma" (gamma gaps
      of shape `burstiness`, so CV² = 1/burstiness: below 1 is burstier than poisson).
    - `prompt_len`: the length of each request's own prompt, *after* the shared system prompt of
      `shared_prefix_len` tokens (one of `num_prefixes`, picked uniformly); so a prompt is
      shared_prefix_len + prompt_len tokens.
    - `tenants` ({name: share, or name: `TenantSpec` with its share and its own length
      distributions}) and `priorities` ({priority: share}): shares, normalised.
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
    tenants: dict[Annotated[str, Field(min_length=1)], TenantEntry] = Field(
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

    def lengths_of(self, tenant: str) -> tuple[LengthDist, LengthDist]:
        """The prompt and output length distributions of `tenant`'s requests."""
        t = self.tenants[tenant]
        if not isinstance(t, TenantSpec):
            return self.prompt_len, self.output_len
        return t.prompt_len or self.prompt_len, t.output_len or self.output_len

    @model_validator(mode="after")
    def _consistent(self) -> SyntheticSpec:
        if self.arrival == "poisson" and self.burstiness != 1.0:
            raise ValueError("burstiness applies to arrival='gamma' only")
        if self.num_prefixes > 1 and self.shared_prefix_len == 0:
            raise ValueError(f"num_prefixes={self.num_prefixes} needs shared_prefix_len >= 1")
        return self


_DIST_TAGS = frozenset({"fixed", "uniform", "lognormal"})


def _key_path(loc: tuple) -> str:
    """An error's location as the file's keys: without the tags pydantic puts in it for the
    tenant entry union (number or table) and the length distribution union."""
    keys = []
    for i, p in enumerate(loc):
        if i == 2 and loc[0] == "tenants" and p in ("share", "tenant"):
            continue
        if i >= 1 and loc[i - 1] in ("prompt_len", "output_len") and p in _DIST_TAGS:
            continue
        keys.append(str(p))
    return ".".join(keys) or "(spec)"


def _validation_lines(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        lines.append(f"  {_key_path(e['loc'])}: {e['msg']}")
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
    from ..config import ConfigError, read_text

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

