"""`tenant_shares`: reserve tenants a share of every step's token budget, stacked on any policy.

```toml
policy = "fcfs"
plugins = ["metroline.plugins_contrib.tenant_shares:TenantShares"]

[plugin_options.tenant_shares]
shares = { enterprise = 0.5 }
```

It wraps the base policy's `split_budget` and adds `Split.shares` for the tenants it reserves for
that have requests in the engine: their sequences are served first, up to their share of the
step's decode and prefill tokens, and what they leave unused goes to the other tenants in the same
step (see `metroline.core.step.reserves`). It changes no order and no victim.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Annotated, Any

from pydantic import Field, field_validator

from metroline.api import PluginOptions, Sequence, Split, hookimpl, shares_problem, take_options


class TenantShares:
    """Per-tenant reserved shares of each step's tokens.

    Option `shares`: tenant -> fraction of each step's decode and prefill tokens reserved for its
    sequences (numbers in [0, 1] that sum to at most 1). A tenant is reserved for only while it has
    requests in the engine (arrived and not ended), so an idle tenant's share costs nothing.
    Shares another plugin below set for other tenants are kept; for the same tenant, this
    plugin's share replaces theirs.
    """

    name = "tenant_shares"

    class Options(PluginOptions):
        """`[plugin_options.tenant_shares]`."""

        shares: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(
            default_factory=dict,
            description="tenant -> fraction of each step's decode and prefill tokens reserved for it "
            "(each in [0, 1], summing to at most 1)",
        )

        @field_validator("shares")
        @classmethod
        def _a_budget(cls, shares: dict[str, float]) -> dict[str, float]:
            problem = shares_problem(shares)
            if problem:
                raise ValueError(problem)
            return shares

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self.shares = {t: float(f) for t, f in self.options.shares.items() if f > 0}
        self.live: dict[str, set[Sequence]] = {t: set() for t in self.shares}
        """The sequences in the engine of each reserved tenant."""

    def _reserved(self, seqs: list[Sequence]) -> Iterator[tuple[set[Sequence], Sequence]]:
        """The sequences of `seqs` whose tenant is reserved for, each with its tenant's set."""
        live = self.live
        for s in seqs:
            mine = live.get(s.tenant)
            if mine is not None:
                yield mine, s

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        for mine, s in self._reserved(seqs):
            mine.add(s)

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        for mine, s in self._reserved(seqs):
            mine.add(s)  # the samples of an n > 1 request never arrive

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        for mine, s in self._reserved(seqs):
            mine.discard(s)

    @hookimpl(wrapper=True)
    def split_budget(self) -> Generator[None, Any, Split | None]:
        split = yield
        if split is None:
            return None
        active = {t: f for t, f in self.shares.items() if self.live[t]}
        if not active:
            return split
        split = Split(*split)
        return split._replace(shares={**(split.shares or {}), **active})
