"""Who is asking: API keys mapped to tenants, and each tenant's limits, from the `[serve]` table.

```toml
[serve]
max_waiting = 256
[serve.tenants.alpha]
api_keys = ["sk-alpha-1"]
highest_priority = 1      # alpha may not ask for priority 0 (lower is more urgent)
[serve.tenants.beta]
api_keys = ["sk-beta-1"]
```

With no tenants configured the server needs no key and every request is tenant `default`. With
tenants, `Authorization: Bearer KEY` names one, and an unknown or missing key is refused (401).
Token-rate quotas are `tenant_quota`'s (`[plugin_options.tenant_quota]`); the server answers 429
with `Retry-After` when the tenant's bucket cannot pay for the prompt now.
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


class ServeConfig(BaseModel):
    """The server's own options (the engine's are `EngineConfig`).

    `cache_salt`: a per-tenant prefix-cache salt, so that one tenant cannot probe another's prompts
    by timing; None means on when several tenants are configured.
    `buffer_tokens`, `stall_timeout`: backpressure. A streamed request whose client has not taken
    its last `buffer_tokens` tokens (it stopped reading and the socket buffers are full) is paused:
    the engine stops serving it but keeps its blocks, and resumes it as soon as the client reads
    again. Paused for `stall_timeout` seconds, it is cancelled and its blocks freed.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "sim"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_waiting: int | None = Field(default=None, ge=1)
    ramp_s: float = Field(default=0.0, ge=0.0)
    buffer_tokens: int = Field(default=1024, ge=1)
    stall_timeout: float = Field(default=30.0, gt=0.0)
    default_max_tokens: int = Field(default=256, ge=1)
    drain_s: float = Field(default=10.0, ge=0.0)
    cache_salt: bool | None = None
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_keys(self) -> ServeConfig:
        seen: dict[str, str] = {}
        for name, t in self.tenants.items():
            for key in t.api_keys:
                if key in seen:
                    raise ValueError(f"tenants.{name}.api_keys: key already given to tenant {seen[key]!r}")
                seen[key] = name
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
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.by_key.get(key.strip())

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


def quota_retry_after(engine: Any, tenant: str, prompt_tokens: int) -> float | None:
    """Seconds until `tenant_quota`'s bucket of `tenant` can pay for `prompt_tokens`, or None when
    it can now (or no token rate applies)."""
    try:
        quota = engine.plugins.get("tenant_quota")
    except (KeyError, LookupError):
        return None
    if quota is None or not getattr(quota, "_rated", False):
        return None
    now = engine.executor.now()
    bucket = quota.bucket(tenant, now)
    if bucket is None:
        return None
    # read, not refill: the engine's step (another thread) owns the bucket
    level = min(bucket.burst, bucket.level + bucket.rate * max(0.0, now - bucket.last))
    need = min(prompt_tokens, bucket.burst)
    if level + 1e-9 >= need:
        return None
    return (need - level) / bucket.rate
