"""What a cluster is made of: its pools, each pool's replicas and engine (config and policy stack),
an optional canary arm in a pool, and the router; the `[cluster]` table of a config file.

```toml
[cluster]
router = "length_pools"
router_options = { threshold = 2048 }

[cluster.pools.short]
replicas = 3
policy = "srpt"                       # the pool's policy stack (default: the top-level one)
config = { max_num_seqs = 128 }       # EngineConfig fields that differ from the top level

[cluster.pools.long]
replicas = 1

[cluster.pools.short.canary]          # a second policy stack in the pool, on its own replicas
replicas = 1                          # of the pool's 3: 2 run the pool's stack, 1 the canary's
policy = "fcfs"
percent = 10                          # or tenants = ["beta"]
twin = true                           # simulation: compare against the baseline engine on the canary's own requests
```

Without pools, `replicas = N` puts N replicas in one pool, `default`. Flags (`--replicas`,
`--pools`, `--router`, `--router-option`) override the table's values. `ClusterSpec.plan(config)`
resolves it against the top-level `EngineConfig` into one `ReplicaPlan` per replica.
"""

from __future__ import annotations

import json

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config import ConfigError, EngineConfig
from ..diagnostics import validation_message

DEFAULT_POOL = "default"
DEFAULT_ROUTER = "round_robin"
BASELINE, CANARY = "baseline", "canary"
Arm = Literal["baseline", "canary"]


class CanarySpec(BaseModel):
    """A pool's canary: `replicas` of the pool's replicas run this stack (`policy`, `plugins`,
    `config` overrides, each defaulting to the pool's), and a share of the pool's traffic goes to
    them: `percent` of the requests (interleaved evenly, starting at `seed` percent: see
    `targets.py`) or the requests of `tenants`. The rest of the pool is the baseline arm.

    `twin` (simulation only, default True): the canary is compared with its twins, the baseline
    engine replayed on exactly the canary's requests (`metroline.core.cluster.twins`), so that its
    verdict follows the engine and not which requests each arm got; False compares it with the
    baseline arm's own requests only (what a serving front can do), at no extra simulation."""

    model_config = ConfigDict(extra="forbid", strict=True)

    replicas: int = Field(default=1, ge=1)
    policy: str | None = Field(default=None, min_length=1)
    plugins: list[str] | None = None
    plugin_options: dict[str, dict[str, Any]] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    percent: float | None = Field(default=None, gt=0, lt=100, allow_inf_nan=False)
    tenants: list[str] | None = Field(default=None, min_length=1)
    seed: int = 0
    twin: bool = True

    @model_validator(mode="after")
    def _one_split(self) -> CanarySpec:
        if (self.percent is None) == (self.tenants is None):
            raise ValueError("percent: give the canary's traffic as percent or as tenants, exactly one")
        return self


class PoolSpec(BaseModel):
    """One pool: `replicas` engines alike, with the pool's own policy stack and config overrides
    (each defaulting to the top-level config's), and optionally a `canary`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    replicas: int = Field(default=1, ge=1, le=1024)
    policy: str | None = Field(default=None, min_length=1)
    plugins: list[str] | None = None
    plugin_options: dict[str, dict[str, Any]] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    canary: CanarySpec | None = None

    @model_validator(mode="after")
    def _room_for_baseline(self) -> PoolSpec:
        if self.canary is not None and self.canary.replicas >= self.replicas:
            raise ValueError(
                f"canary: replicas ({self.canary.replicas}) must leave the baseline at least one of the pool's "
                f"{self.replicas}")
        return self


class ClusterSpec(BaseModel):
    """A cluster: `pools` (name -> `PoolSpec`, in order) or `replicas` in one pool, behind
    `router` (a router spec: a shipped name, an entry point or pkg.mod:Obj) with its options."""

    model_config = ConfigDict(extra="forbid", strict=True)

    replicas: int | None = Field(default=None, ge=1, le=1024)
    pools: dict[str, PoolSpec] = Field(default_factory=dict)
    router: str = Field(default=DEFAULT_ROUTER, min_length=1)
    router_options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _pools_or_replicas(self) -> ClusterSpec:
        if self.pools and self.replicas is not None:
            raise ValueError("replicas: give replicas (one pool) or pools, not both")
        for name in self.pools:
            if not name or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"pools: a pool's name is letters, digits, - and _, got {name!r}")
        return self

    @property
    def pool_specs(self) -> dict[str, PoolSpec]:
        """The pools, the single default pool when only `replicas` is given."""
        return self.pools or {DEFAULT_POOL: PoolSpec(replicas=self.replicas or 1)}

    @property
    def num_replicas(self) -> int:
        return sum(p.replicas for p in self.pool_specs.values())

    @property
    def has_canary(self) -> bool:
        return any(p.canary is not None for p in self.pool_specs.values())

    def plan(self, config: EngineConfig) -> list[ReplicaPlan]:
        """One `ReplicaPlan` per replica, in order: each pool's baseline replicas then its
        canary's (`<pool>-canary-<i>`), each with its own `EngineConfig` (the top-level `config`
        with the pool's, then the canary's, changes). The naming rule, however the cluster is
        declared (`--replicas N`, `--pools`, a `[cluster]` table's `replicas` or `pools`): the
        replicas of the pool `default` are `r0`, `r1`, ...; those of any other pool `<pool>-0`,
        `<pool>-1`, .... A bad value is a `ConfigError` naming `cluster.pools.<pool>...` and the
        field; a router option that names a replica the cluster does not have (`check_replica_names`)
        is one too."""
        plans: list[ReplicaPlan] = []
        for pool, spec in self.pool_specs.items():
            where = f"cluster.pools.{pool}"
            base = _engine_config(config, spec, where)
            canary = spec.canary
            arm = BASELINE if canary is not None else None
            count = spec.replicas - (canary.replicas if canary is not None else 0)
            for i in range(count):
                name = f"r{i}" if pool == DEFAULT_POOL else f"{pool}-{i}"
                plans.append(ReplicaPlan(len(plans), name, pool, arm, base))
            if canary is not None:
                other = _engine_config(base, canary, f"{where}.canary")
                plans += [ReplicaPlan(len(plans), f"{pool}-canary-{i}", pool, CANARY, other)
                          for i in range(canary.replicas)]
        check_replica_names(self.router_options, [p.name for p in plans])
        return plans

    def describe(self) -> dict[str, Any]:
        """The spec as the result document records it."""
        return self.model_dump(mode="json", exclude_none=True)


class ReplicaPlan:
    """One replica to start: its `index`, `name`, `pool`, canary `arm` (None in a pool without a
    canary) and `config`."""

    __slots__ = ("arm", "config", "index", "name", "pool")

    def __init__(self, index: int, name: str, pool: str, arm: str | None, config: EngineConfig) -> None:
        self.index, self.name, self.pool, self.arm, self.config = index, name, pool, arm, config

    @property
    def policy(self) -> str:
        """The replica's policy stack, as a result document names it (`policy+plugin+...`)."""
        return "+".join([self.config.policy, *self.config.plugins])

    def __repr__(self) -> str:
        return f"ReplicaPlan({self.name!r}, pool={self.pool!r}, arm={self.arm!r}, policy={self.policy!r})"


def check_replica_names(options: dict[str, Any], names: list[str]) -> None:
    """Refuse a router option that names a replica the cluster does not have. By convention an
    option whose name ends in `replica` or `replicas` (`replica`, `fallback_replica`,
    `tenant_replicas`) holds replica names: a name, a list of names, or a table whose values are
    names or lists of names. A `ConfigError` names the option and lists the replicas."""
    known = set(names)
    for key, value in options.items():
        if not (key.endswith("replica") or key.endswith("replicas")):
            continue
        for where, name in _named(f"router_options.{key}", value):
            if name not in known:
                raise ConfigError(f"cluster: {where}: no replica named {name!r} (replicas: {', '.join(names)})")


def _named(where: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _named(f"{where}.{k}", v)]
    if isinstance(value, (list, tuple)):
        return [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    return [(where, value)]


def config_changes(baseline: EngineConfig, canary: EngineConfig) -> dict[str, list[Any]]:
    """field -> [baseline's value, canary's value] of the `EngineConfig` fields the two arms set
    differently, policy and plugins left out (the arms' stacks name them)."""
    a, b = baseline.model_dump(mode="json"), canary.model_dump(mode="json")
    return {k: [a[k], b[k]] for k in a if a[k] != b[k] and k not in ("policy", "plugins")}


def _engine_config(config: EngineConfig, spec: PoolSpec | CanarySpec, where: str) -> EngineConfig:
    fields = {**config.model_dump(), **spec.config}
    for key in ("policy", "plugins", "plugin_options"):
        value = getattr(spec, key)
        if value is not None:
            fields[key] = value
    try:
        return EngineConfig.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, lambda key: where if key in ("policy", "plugins", "plugin_options")
                                             else f"{where}.config", EngineConfig)) from None


def cluster_spec(table: dict[str, Any] | None, *, source: str = "config", replicas: int | None = None,
                 pools: dict[str, int] | None = None, router: str | None = None,
                 router_options: dict[str, Any] | None = None) -> ClusterSpec:
    """The `ClusterSpec` of a config file's `[cluster]` table (`source` names the file in errors)
    with the flags' values over it: `replicas` (one pool, replacing the table's pools), `pools`
    (name -> replica count: the table's pool of that name keeps its engine and canary, a new one
    takes the top level's), `router` and `router_options` (merged over the table's)."""
    data = dict(table or {})
    if replicas is not None and pools:
        raise ConfigError("--replicas/--pools: give --replicas N or --pools POOL=N,..., not both")
    if replicas is not None:
        data.pop("pools", None)
        data["replicas"] = replicas
    if pools:
        old = data.pop("pools", None) or {}
        if not isinstance(old, dict):
            old = {}
        data.pop("replicas", None)
        data["pools"] = {name: {**(old.get(name) or {}), "replicas": count} for name, count in pools.items()}
    if router is not None:
        if router != data.get("router"):
            data.pop("router_options", None)  # the table's options are its router's
        data["router"] = router
    if router_options:
        data["router_options"] = {**(data.get("router_options") or {}), **router_options}
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, lambda key: f"{source}: cluster", ClusterSpec)) from None


def parse_pools(text: str | None) -> dict[str, int] | None:
    """`--pools short=3,long=1` -> {"short": 3, "long": 1} (None for None)."""
    if not text:
        return None
    pools: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.strip().partition("=")
        if not sep or not name or not count.strip().isdigit():
            raise ValueError(f"--pools: expected POOL=N,... (e.g. short=3,long=1), got {part!r}")
        pools[name.strip()] = int(count)
    return pools


def parse_router_options(items: list[str] | None) -> dict[str, Any]:
    """`--router-option` values `["threshold=2048", "long_pool=long", 'tenant_replicas={"a": "r0"}']`
    -> {"threshold": 2048, "long_pool": "long", "tenant_replicas": {"a": "r0"}}: each value is read
    as JSON (numbers, true/false, lists, objects), and kept as a string when it is not JSON."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--router-option: expected KEY=VALUE, got {item!r}")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        options[key.strip()] = parsed
    return options


__all__ = [
    "BASELINE", "CANARY", "DEFAULT_POOL", "DEFAULT_ROUTER", "CanarySpec", "ClusterSpec", "PoolSpec", "ReplicaPlan",
    "check_replica_names", "cluster_spec", "config_changes", "parse_pools", "parse_router_options",
]
