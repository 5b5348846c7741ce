"""Who is asking: API keys mapped to tenants, and each tenant's limits, from the `[serve]` table.

```toml
[serve]
max_waiting = 256         # requests waiting for admission (default 1,024)
[serve.tenants.alpha]
api_keys = ["sk-alpha-1"]
highest_priority = 1      # alpha may not ask for priority 0 (lower is more urgent)
[serve.tenants.beta]
api_keys = ["sk-beta-1"]
```

With no tenants configured the server needs no key and every request is tenant `default`. With
tenants, `Authorization: Bearer KEY` names one, and an unknown or missing key is refused (401).
Token-rate quotas are `tenant_quota`'s (`[plugin_options.tenant_quota]`): the server reserves a
request's prompt plus `max_tokens x n` output tokens in the tenant's bucket when it takes it, answers
429 with `Retry-After` when the bucket cannot pay for that now, and refunds the unused output tokens
when it ends (`metroline.plugins_contrib.tenant_quota.TenantQuota.reserve`).

`operator_keys` are the keys of whoever runs the server: with tenants configured, `/metrics` (its
per-tenant series) needs one (`public_metrics = true` opens it to anyone), and the front's
`/v1/replicas`, `/v1/canary` and `/replicas/NAME/metrics` too, and a server's `/v1/replica/state`; `/v1/models` needs a tenant's or an
operator's key. `/health` is open (load balancers ask it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TenantConfig(BaseModel):
    """One tenant: its API keys, the most urgent (lowest) priority it may ask for, and the priority
    of its requests that ask for none (default: 0, or `highest_priority` when that is above 0)."""

    model_config = ConfigDict(extra="forbid")

    api_keys: list[str] = Field(min_length=1)
    highest_priority: int | None = None
    default_priority: int | None = None

    @model_validator(mode="after")
    def _default_allowed(self) -> TenantConfig:
        h = self.highest_priority
        if self.default_priority is None:
            self.default_priority = 0 if h is None else max(0, h)
        elif h is not None and self.default_priority < h:
            raise ValueError(f"default_priority ({self.default_priority}) is above highest_priority ({h})")
        return self


DEFAULT_MAX_WAITING = 1024
"""The requests (a batch's prompts each) that may wait for admission at once by default: four
batches of the default `max_num_seqs` (256). A request at the back of a full queue waits for the
~1,000 ahead of it, already minutes at a small model's pace (longer than the 30 s a client
typically waits); past that a new request is refused at once (429, `Retry-After`) rather than
queued for no one (an abandoned batch of 100,000 prompts once left 106,665 requests in flight)."""


class ServeConfig(BaseModel):
    """The server's own options (the engine's are `EngineConfig`).

    `cache_salt`: a per-tenant prefix-cache salt, so that one tenant cannot probe another's prompts
    by timing; None means on when several tenants are configured.
    `default_max_tokens`: the `max_tokens` of a request that gives none; None (the default, as
    vLLM): the rest of the context (`max_model_len` less the prompt).
    `max_body_bytes`: a request body above this is refused (413) before it is read (its
    `Content-Length`, else as it arrives); 16 MiB by default. `max_prompt_chars`: a text prompt
    longer than this is refused (400) before it is tokenized; None: `max_model_len` times the
    longest token of the vocabulary in characters (no prompt past it can fit the context).
    `max_waiting`: at most this many requests wait for admission (`DEFAULT_MAX_WAITING`, 1,024);
    past it a request is refused (429, `Retry-After: 1`), and a batch with more prompts than this,
    which could never be queued whole, is refused as too large (413).
    `health_timeout_s`, `down_after_s` (a front): each replica's state is polled with that timeout;
    a replica that has not answered for `down_after_s` seconds is marked down (a frozen process).
    `buffer_tokens`, `stall_timeout`: backpressure. A streamed request whose client has not taken
    its last `buffer_tokens` tokens (it stopped reading and the socket buffers are full) is paused:
    the engine stops serving it but keeps its blocks, and resumes it as soon as the client reads
    again. `buffer_bytes` (256 KiB): a stream whose socket holds more than that, written and not
    taken by its client (the transport's buffer and the kernel's send queue), is paused at once,
    and resumed when it holds half of that. Paused for `stall_timeout` seconds, it is cancelled and
    its blocks freed (a stream cut for its socket has its connection reset).
    `hook_budget_s`: the longest one plugin call may take inside the step (1 s; 0 turns it off):
    a call past it is stopped and fails what its error fails (the one request it was called for,
    for `check_request`, `on_arrival` and `estimate_output_tokens`), named in the log and counted
    in `metroline_plugin_overruns_total` (`metroline.core.plugins.hook_watch`).
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "sim"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_waiting: int = Field(default=DEFAULT_MAX_WAITING, ge=1)
    ramp_s: float = Field(default=0.0, ge=0.0)
    buffer_tokens: int = Field(default=1024, ge=1)
    buffer_bytes: int = Field(default=256 * 1024, ge=4096)
    stall_timeout: float = Field(default=30.0, gt=0.0)
    default_max_tokens: int | None = Field(default=None, ge=1)
    drain_s: float = Field(default=10.0, ge=0.0)
    cache_salt: bool | None = None
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_prompt_chars: int | None = Field(default=None, ge=1)
    operator_keys: list[str] = Field(default_factory=list)
    public_metrics: bool = False
    health_timeout_s: float = Field(default=1.0, gt=0.0)
    down_after_s: float = Field(default=3.0, gt=0.0)
    hook_budget_s: float = Field(default=1.0, ge=0.0)
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_keys(self) -> ServeConfig:
        seen: dict[str, str] = {}
        for name, t in self.tenants.items():
            for key in t.api_keys:
                if key in seen:
                    raise ValueError(f"tenants.{name}.api_keys: key already given to tenant {seen[key]!r}")
                seen[key] = name
        for key in self.operator_keys:
            if key in seen:
                raise ValueError(f"operator_keys: key already given to tenant {seen[key]!r}")
        return self

    @property
    def salted(self) -> bool:
        return self.cache_salt if self.cache_salt is not None else len(self.tenants) > 1


class Tenants:
    """Resolves a request's `Authorization` header to a tenant and checks its priority."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.by_key = {key: name for name, t in config.tenants.items() for key in t.api_keys}

    def identify(self, authorization: str | None) -> str | None:
        """The tenant of the header, `default` when no tenants are configured, None if unknown."""
        if not self.config.tenants:
            return "default"
        key = self.key_of(authorization)
        return None if key is None else self.by_key.get(key)

    def key_of(self, authorization: str | None) -> str | None:
        """The bearer key of an `Authorization` header, or None."""
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        return key.strip() if scheme.lower() == "bearer" else None

    def is_operator(self, authorization: str | None) -> bool:
        """Whether the header carries one of the `operator_keys`."""
        return bool(self.config.operator_keys) and self.key_of(authorization) in self.config.operator_keys

    def may_read(self, authorization: str | None, what: str) -> bool:
        """Whether the header may read an operator's page (`what`: "metrics", "models" (a tenant's
        key will do), "operator"): always without tenants."""
        if not self.config.tenants:
            return True
        if self.is_operator(authorization):
            return True
        if what == "metrics":
            return self.config.public_metrics
        return what == "models" and self.identify(authorization) is not None

    def priority(self, tenant: str, asked: int | None) -> tuple[int, str | None]:
        """(the request's priority, a problem or None) for `tenant` asking `asked`."""
        t = self.config.tenants.get(tenant)
        if t is None:
            return (asked if asked is not None else 0), None
        prio = asked if asked is not None else t.default_priority
        if t.highest_priority is not None and prio < t.highest_priority:
            return prio, (
                f"priority {prio} is above tenant {tenant!r}'s highest_priority={t.highest_priority} "
                "(lower is more urgent)"
            )
        return prio, None

    def cache_salt(self, tenant: str) -> str | None:
        return f"tenant:{tenant}" if self.config.salted else None


def quota_of(engine: Any) -> Any:
    """The engine's `tenant_quota` plugin when it limits a token rate, else None."""
    try:
        quota = engine.plugins.get("tenant_quota")
    except (KeyError, LookupError):
        return None
    return quota if quota is not None and getattr(quota, "_rated", False) else None
