"""Workloads: what arrives when, with which prompt and how many output tokens.

A `Workload` is a sorted list of `WorkloadItem`s. It comes from a named built-in, a synthetic
spec (`SyntheticSpec`, also readable from a TOML or JSON file) or a trace file (`core/traces.py`);
`build_workload` is the one entry point for all of them.

Prompts are lists of *segments* `(key, length)`: a key names an endless pseudo-random token stream
and a segment contributes the first `length` tokens of it. Equal keys give equal tokens, so
requests whose leading segments are equal share a real prompt prefix, which the KV pool's prefix
cache can find. Tokens are made lazily, when a request is submitted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import tomllib
from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .request import Request


class WorkloadError(ValueError):
    """A workload could not be built: bad spec, bad trace row, unknown name or missing file."""


MAX_REQUESTS = 1_000_000
"""The most requests a workload may hold (a spec's `num_requests`, mixed-64's groups x 64, a
trace's rows): about 200 bytes each before their prompts are made, so at most a few hundred MB."""
MAX_ITEM_TOKENS = 1 << 24
"""The most prompt or output tokens one request may have (16M), checked before a prompt is made."""


# ---------------------------------------------------------------------------------------------
# Token streams


@lru_cache(maxsize=8)
def _hi_lo_tables(vocab_size: int) -> tuple[bytes | None, bytes | None]:
    """Byte translation tables that fold a little-endian 16-bit value into [0, vocab_size)."""
    if vocab_size >= 1 << 16:
        return None, None
    if vocab_size >= 256:
        return bytes(h % (vocab_size // 256) for h in range(256)), None
    return bytes(256), bytes(b % vocab_size for b in range(256))


@lru_cache(maxsize=128)
def _segment_bytes(key: object, length: int, vocab_size: int) -> bytes:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(digest, "little"))
    # randbytes(n) is a prefix of randbytes(m > n) only when n is a multiple of 4.
    raw = bytearray(rng.randbytes(4 * ((length + 1) // 2)))
    del raw[2 * length :]
    hi, lo = _hi_lo_tables(vocab_size)
    if hi is not None:
        raw[1::2] = raw[1::2].translate(hi)
    if lo is not None:
        raw[0::2] = raw[0::2].translate(lo)
    return bytes(raw)


def segment_tokens(key: object, length: int, vocab_size: int = 32000) -> list[int]:
    """The first `length` tokens of the stream named by `key`, each in [0, vocab_size).

    The stream depends only on `repr(key)` (through a stable digest, never Python's salted hash),
    so it is the same in every process; a shorter segment of a key is a prefix of a longer one.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    return array("H", _segment_bytes(key, length, vocab_size)).tolist()


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(slots=True, frozen=True)
class WorkloadItem:
    """One request of a workload.

    `segments`: the prompt as `(key, length)` pieces (see the module docstring).
    `output_len`: the true output length; a simulated request ends there.
    `priority`: lower is more urgent (as in `Request`).
    """

    arrival_s: float
    segments: tuple[tuple[object, int], ...]
    output_len: int
    tenant: str = "default"
    priority: int = 0

    @property
    def prompt_len(self) -> int:
        return sum(length for _, length in self.segments)

    def prompt_token_ids(self, vocab_size: int = 32000) -> list[int]:
        """The prompt's token ids, made from the segments' streams."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        raw = b"".join(_segment_bytes(key, length, vocab_size) for key, length in self.segments)
        return array("H", raw).tolist()

    def request_data(self, request_id: str, *, vocab_size: int = 32000, oracle: bool = False) -> dict[str, Any]:
        """The fields of a greedy `Request` that generates exactly `output_len` tokens (EOS
        ignored), for `Request.model_validate` or `Engine.add_request` (which validates them
        against the engine's limits). `oracle=True` also tells policies the output length
        (`expected_output_tokens`)."""
        return {
            "request_id": request_id,
            "tenant": self.tenant,
            "priority": self.priority,
            "arrival_time": self.arrival_s,
            "prompt_token_ids": self.prompt_token_ids(vocab_size),
            "sampling": {"max_new_tokens": self.output_len, "ignore_eos": True, "temperature": 0.0},
            "expected_output_tokens": self.output_len if oracle else None,
        }

    def to_request(self, request_id: str, *, vocab_size: int = 32000, oracle: bool = False) -> Request:
        """The validated `Request` of `request_data`."""
        return Request.model_validate(self.request_data(request_id, vocab_size=vocab_size, oracle=oracle))


@dataclass
class Workload:
    """A named list of requests, sorted by arrival (stable: ties keep their order).

    `params` records what built it (source, seed, modifiers); it goes into result documents.
    """

    name: str
    items: list[WorkloadItem]
    description: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.items = sorted(self.items, key=lambda it: it.arrival_s)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[WorkloadItem]:
        return iter(self.items)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: name, size, description, params, mean lengths, duration."""
        n = len(self.items)
        return {
            "name": self.name,
            "requests": n,
            "description": self.description,
            **self.params,
            "mean_prompt_tokens": round(sum(it.prompt_len for it in self.items) / n, 2) if n else 0.0,
            "mean_output_tokens": round(sum(it.output_len for it in self.items) / n, 2) if n else 0.0,
            "duration_s": self.items[-1].arrival_s if n else 0.0,
        }


# ---------------------------------------------------------------------------------------------
# Synthetic workloads


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


def generate(spec: SyntheticSpec, *, namespace: str = "synthetic") -> list[WorkloadItem]:
    """The requests of `spec`, deterministic for its seed.

    `namespace` goes into the segment keys: workloads of different namespaces share no tokens.
    """
    n, seed = spec.num_requests, spec.seed

    def rng(stream: str) -> random.Random:
        return random.Random(f"{namespace}/{seed}/{stream}")

    arrivals = [0.0] * n
    if spec.rate is not None:
        r, t = rng("arrival"), 0.0
        for i in range(1, n):
            if spec.arrival == "poisson":
                t += r.expovariate(spec.rate)
            else:
                t += r.gammavariate(spec.burstiness, 1.0 / (spec.rate * spec.burstiness))
            arrivals[i] = t
        if not math.isfinite(t):
            raise WorkloadError(f"rate {spec.rate!r}: arrivals overflow the clock (give a larger rate)")
    r_prompt, r_out = rng("prompt_len"), rng("output_len")
    prompts = [spec.prompt_len.sample(r_prompt) for _ in range(n)]
    outputs = [spec.output_len.sample(r_out) for _ in range(n)]
    tenants = rng("tenant").choices(list(spec.tenants), list(spec.tenants.values()), k=n)
    priorities = rng("priority").choices(list(spec.priorities), list(spec.priorities.values()), k=n)
    prefixes = rng("prefix").choices(range(spec.num_prefixes), k=n)

    items = []
    for i in range(n):
        own = (("req", namespace, seed, i), prompts[i])
        if spec.shared_prefix_len:
            segments = ((("sys", namespace, seed, prefixes[i]), spec.shared_prefix_len), own)
        else:
            segments = (own,)
        items.append(WorkloadItem(arrivals[i], segments, outputs[i], tenants[i], priorities[i]))
    return items


def _validation_lines(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(spec)"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


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


# ---------------------------------------------------------------------------------------------
# Built-ins

# The default engine (max_num_seqs 256) under the `steps` cost model (0.01 s a step) finishes
# 256 requests every 128 steps at the chat workload's mean of 128 output tokens.
_CHAT_CAPACITY = 256 / (128 * 0.01)
_CHAT_RATE = round(1.1 * _CHAT_CAPACITY, 6)

BUILTIN_WORKLOADS: dict[str, str] = {
    "chat": (
        f"4000 chat requests, poisson at {_CHAT_RATE:g} req/s = 1.1 x the default engine's capacity "
        f"under the steps cost model (max_num_seqs 256 / (mean output 128 tokens x 0.01 s a step) "
        f"= {_CHAT_CAPACITY:g} req/s); prompt = one of 4 shared 128-token system prompts + "
        "lognormal(mean 256, sigma 0.8, 16..4096) tokens; output lognormal(mean 128, sigma 0.8, "
        "4..1024); tenants alpha/beta/gamma 50/30/20 %; priorities 0/1 20/80 %"
    ),
    "mixed-64": (
        "groups (default 10) of 64 requests, group g all arriving at t = 0.1 g s; per group 54 "
        "short (20 output tokens) and 10 long (2000) in shuffled order; unique 64-token prompts"
    ),
    "shared-prefix": (
        "200 requests, poisson at 50 req/s, sharing one 1000-token system prompt, each with a "
        "unique 32-token suffix and 32 output tokens"
    ),
    "long-burst": (
        "600 short chats (tenant 'chat', poisson 20 req/s, 256 prompt / 256 output tokens) plus "
        "16 requests with unique 8192-token prompts and 16 output tokens (tenant 'burst') all "
        "arriving at t = 10 s"
    ),
    "azure-conv": "Azure LLM inference trace 2023, conversation service (19,366 requests)",
    "azure-code": "Azure LLM inference trace 2023, code-completion service (8,819 requests)",
    "mooncake": "Mooncake (FAST'25) synthetic trace with prefix-sharing block ids (3,993 requests)",
}

_TRACE_FILES = {
    "azure-conv": "azure_conv_2023.csv",
    "azure-code": "azure_code_2023.csv",
    "mooncake": "mooncake_synthetic.jsonl",
}


def list_workloads() -> list[str]:
    """The names of the built-in workloads."""
    return list(BUILTIN_WORKLOADS)


def _chat(seed: int) -> list[WorkloadItem]:
    spec = SyntheticSpec(
        num_requests=4000,
        rate=_CHAT_RATE,
        prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.8, "min": 16, "max": 4096},
        output_len={"dist": "lognormal", "mean": 128, "sigma": 0.8, "min": 4, "max": 1024},
        tenants={"alpha": 0.5, "beta": 0.3, "gamma": 0.2},
        priorities={0: 0.2, 1: 0.8},
        shared_prefix_len=128,
        num_prefixes=4,
        seed=seed,
    )
    return generate(spec, namespace="chat")


MIXED_64_GROUP_INTERVAL_S = 0.1


def _mixed_64(seed: int, groups: int) -> list[WorkloadItem]:
    rng = random.Random(f"mixed-64/{seed}")
    items = []
    for g in range(groups):
        outputs = [20] * 54 + [2000] * 10
        rng.shuffle(outputs)
        for j, out in enumerate(outputs):
            items.append(WorkloadItem(g * MIXED_64_GROUP_INTERVAL_S, ((("mixed-64", seed, g * 64 + j), 64),), out))
    return items


def _shared_prefix(seed: int) -> list[WorkloadItem]:
    spec = SyntheticSpec(
        num_requests=200, rate=50.0, prompt_len=32, output_len=32, shared_prefix_len=1000, seed=seed
    )
    return generate(spec, namespace="shared-prefix")


def _long_burst(seed: int) -> list[WorkloadItem]:
    chats = SyntheticSpec(
        num_requests=600, rate=20.0, prompt_len=256, output_len=256, tenants={"chat": 1}, seed=seed
    )
    burst = [
        WorkloadItem(10.0, ((("long-burst", seed, i), 8192),), 16, tenant="burst") for i in range(16)
    ]
    return generate(chats, namespace="long-burst") + burst


def find_traces_dir(traces_dir: str | Path | None = None) -> Path:
    """The traces folder: `traces_dir`, else $METROLINE_TRACES, else `../shared/traces` next to
    the repository root or the working directory."""
    if traces_dir is not None or os.environ.get("METROLINE_TRACES"):
        path = Path(traces_dir if traces_dir is not None else os.environ["METROLINE_TRACES"])
        if not path.is_dir():
            raise WorkloadError(f"traces directory {path} does not exist")
        return path
    candidates = [
        Path(__file__).resolve().parents[1] / "../shared/traces",
        Path.cwd() / "../shared/traces",
    ]
    for path in candidates:
        if path.is_dir():
            return path.resolve()
    raise WorkloadError(
        "no traces directory found: pass traces_dir or set METROLINE_TRACES "
        f"(looked in {', '.join(str(p) for p in candidates)})"
    )


# ---------------------------------------------------------------------------------------------
# Entry point


def scale_items(
    items: list[WorkloadItem], rate_scale: float = 1.0, length_scale: float = 1.0
) -> list[WorkloadItem]:
    """Arrivals divided by `rate_scale` (2.0 doubles the rate); every segment length and output
    length multiplied by `length_scale` (rounded, at least 1), so shared prefixes stay shared."""
    if rate_scale == 1.0 and length_scale == 1.0:
        return list(items)
    longest = max((max(it.output_len, *(n for _, n in it.segments)) for it in items), default=0)
    if longest * length_scale > MAX_ITEM_TOKENS:
        raise WorkloadError(
            f"length_scale {length_scale:g}: a length of {longest} tokens would become "
            f"{longest * length_scale:.4g}, above the limit of {MAX_ITEM_TOKENS}"
        )
    latest = max((it.arrival_s for it in items), default=0.0)
    if not math.isfinite(latest / rate_scale):
        raise WorkloadError(f"rate_scale {rate_scale:g}: the arrival at {latest:g} s overflows the clock")

    def scaled(n: int) -> int:
        return max(1, round(n * length_scale))

    return [
        WorkloadItem(
            it.arrival_s / rate_scale,
            tuple((key, scaled(n)) for key, n in it.segments) if length_scale != 1.0 else it.segments,
            scaled(it.output_len) if length_scale != 1.0 else it.output_len,
            it.tenant,
            it.priority,
        )
        for it in items
    ]


def build_workload(
    source: str,
    *,
    seed: int | None = None,
    rate_scale: float = 1.0,
    length_scale: float = 1.0,
    max_requests: int | None = None,
    groups: int | None = None,
    traces_dir: str | Path | None = None,
    tokenizer: Any = None,
) -> Workload:
    """Build a workload from a built-in name (see `BUILTIN_WORKLOADS`) or a file path.

    Files: `.csv` (Azure trace), `.jsonl` (Mooncake trace, or a request file with prompts: see
    `core/text_requests.py`; its text prompts need `tokenizer`), `.toml` / `.json` (a `SyntheticSpec`).
    `seed` drives the synthetic built-ins (default 0); for a spec file, a seed given here
    overrides the file's. `groups` is for `mixed-64` only. Then, for any source: the first
    `max_requests` by arrival are kept and `rate_scale` / `length_scale` applied (`scale_items`).
    """
    from . import text_requests, traces

    if not (isinstance(rate_scale, (int, float)) and math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"rate_scale must be a number > 0, got {rate_scale!r}")
    if not (isinstance(length_scale, (int, float)) and math.isfinite(length_scale) and length_scale > 0):
        raise WorkloadError(f"length_scale must be a number > 0, got {length_scale!r}")
    if max_requests is not None and max_requests < 1:
        raise WorkloadError(f"max_requests must be >= 1, got {max_requests}")
    if groups is not None and source != "mixed-64":
        raise WorkloadError(f"groups applies to the mixed-64 workload only, not {source!r}")
    if groups is not None and not 1 <= groups <= MAX_REQUESTS // 64:
        raise WorkloadError(f"groups must be in [1, {MAX_REQUESTS // 64}] (64 requests each), got {groups}")

    params: dict[str, Any] = {"source": source}
    builders: dict[str, Callable[[int], list[WorkloadItem]]] = {
        "chat": _chat,
        "shared-prefix": _shared_prefix,
        "long-burst": _long_burst,
    }
    if source in builders or source == "mixed-64":
        name, description, seed = source, BUILTIN_WORKLOADS[source], seed or 0
        params["seed"] = seed
        if source == "mixed-64":
            params["groups"] = groups = groups or 10
            items = _mixed_64(seed, groups)
        else:
            items = builders[source](seed)
    elif source in _TRACE_FILES:
        name, description = source, BUILTIN_WORKLOADS[source]
        path = find_traces_dir(traces_dir) / _TRACE_FILES[source]
        params["path"] = str(path)
        items = traces.load_trace(path)
    else:
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix not in (".csv", ".jsonl", ".toml", ".json"):
            raise WorkloadError(
                f"unknown workload {source!r}: not a built-in ({', '.join(BUILTIN_WORKLOADS)}) "
                "nor a .csv, .jsonl, .toml or .json file"
            )
        if not path.is_file():
            raise WorkloadError(f"workload file {source} does not exist")
        name = path.stem
        if suffix == ".jsonl" and text_requests.is_request_file(path):
            return text_requests.request_workload(
                path, tokenizer, rate_scale=rate_scale, length_scale=length_scale, max_requests=max_requests
            )
        if suffix in (".toml", ".json"):
            spec = load_spec(path)
            if seed is not None:
                spec = spec.model_copy(update={"seed": seed})
            description = f"synthetic workload from {path.name}"
            params["spec"] = spec.model_dump(mode="json")
            if max_requests is not None and max_requests < spec.num_requests:
                # arrivals only grow and each attribute has its own stream: the first k requests
                # of a spec are those of the same spec with k requests, so make no more
                spec = spec.model_copy(update={"num_requests": max_requests})
            items = generate(spec, namespace=name)
        else:
            description = f"trace {path.name}"
            items = traces.load_trace(path)

    items = sorted(items, key=lambda it: it.arrival_s)
    if max_requests is not None:
        items = items[:max_requests]
    items = scale_items(items, rate_scale, length_scale)
    params.update(rate_scale=rate_scale, length_scale=length_scale, max_requests=max_requests)
    return Workload(name, items, description, params)
