"""What the `route` hook sees and answers: the arriving request, a read-only view of each replica,
and the refusal."""

from __future__ import annotations

from typing import Any

from ...kv_backends.prefix_index import block_chain
from .prefix_directory import PrefixDirectory


class RouteRequest:
    """The request being routed (read-only by convention; built once per request)."""

    __slots__ = (
        "_chain", "arrival_s", "max_new_tokens", "priority", "prompt_len", "prompt_token_ids", "request_id", "tenant",
    )

    def __init__(
        self, request_id: str, arrival_s: float, prompt_token_ids: Any, max_new_tokens: int,
        tenant: str = "default", priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_token_ids = prompt_token_ids
        self.prompt_len = len(prompt_token_ids)
        self.max_new_tokens = max_new_tokens
        self.tenant = tenant
        self.priority = priority
        self._chain: tuple[int, int | None, list] | None = None

    def block_chain(self, block_size: int, max_blocks: int | None = None) -> list[tuple[int, tuple]]:
        """The prompt's full blocks as `(chained hash, tokens)`, at most `max_blocks` of them (all
        by default), computed once (for the prefix lookups of `ReplicaView.prefix_hit` and the
        cluster's `PrefixDirectory`); the last prompt token is never counted. A prompt that knows
        its chain (a workload item's `PromptTokens`, which shares the hashes of the segments it has
        in common with other prompts; the front's `SaltedPrompt`) gives it; any other is hashed
        here."""
        chain = self._chain
        if chain is not None and chain[1] == max_blocks and chain[0] == block_size:
            return chain[2]
        limit = self.prompt_len - 1
        if max_blocks is not None and max_blocks * block_size < limit:
            limit = max_blocks * block_size
        prompt = self.prompt_token_ids
        known = getattr(prompt, "block_chain", None)
        hashes = known(block_size, limit) if known is not None else block_chain(prompt, block_size, limit)
        self._chain = (block_size, max_blocks, hashes)
        return hashes

    def __repr__(self) -> str:
        return f"RouteRequest({self.request_id!r}, prompt_len={self.prompt_len}, arrival_s={self.arrival_s})"


class Refuse:
    """The answer of a router that refuses a request: `reason` says why (one line)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Refuse({self.reason!r})"


class ReplicaView:
    """One replica as the router sees it: its live state, read when an attribute is read.

    `index`, `name`, `pool` and `policy` are fixed; `num_waiting`, `num_running` (sequences),
    `kv_used_blocks`, `kv_free_blocks`, `outstanding_requests` and `outstanding_tokens` (prompt
    plus `max_new_tokens` of the requests routed there that have not ended) are read from the
    replica; `outstanding` is the cluster's `Outstanding` behind the last two (read-only: the
    cheapest read of a load, `len(view.outstanding)` and `view.outstanding.total`);
    `prefix_hit(request)` is how many of the request's prompt tokens the replica's prefix cache
    holds now, in whole blocks (without a cache salt; computed only when asked: the prompt hashed
    once per request, the blocks probed from the root, those that earlier lookups found remembered
    by the pool); `prefix_hit_at_least(request, tokens)` is the same when at least `tokens`, else 0
    (one probe when it is not).

    `prefix_directory` is the cluster's `PrefixDirectory` (the blocks routed to each replica, an
    estimate every replica of the cluster shares; None for a view outside a cluster) and
    `prefix_bit` this replica's bit in it; `routed(request)` records a request sent here.
    `ReplicaView.of(...)` builds one for a test or a bench from plain numbers."""

    __slots__ = ("_engine", "index", "name", "outstanding", "policy", "pool", "prefix_bit", "prefix_directory")

    def __init__(self, index: int, name: str, pool: str, policy: str, engine: Any, outstanding: Any,
                 prefix_directory: PrefixDirectory | None = None, prefix_bit: int = 0) -> None:
        self.index = index
        self.name = name
        self.pool = pool
        self.policy = policy
        self._engine = engine
        self.outstanding = outstanding  # request_id -> tokens, kept by the cluster
        self.prefix_directory = prefix_directory
        self.prefix_bit = prefix_bit

    def routed(self, request: RouteRequest) -> None:
        """Record in the cluster's `prefix_directory` (if any) that `request` was sent here; the
        cluster calls it once the replica has taken the request."""
        directory = self.prefix_directory
        if directory is not None:
            directory.record(request.block_chain(directory.block_size, directory.max_blocks), self.prefix_bit)

    @property
    def num_waiting(self) -> int:
        return len(self._engine.scheduler.waiting) + len(self._engine.scheduler.swapped)

    @property
    def num_running(self) -> int:
        return len(self._engine.scheduler.running)

    @property
    def kv_used_blocks(self) -> int:
        return self._engine.pool.num_used_blocks()

    @property
    def kv_free_blocks(self) -> int:
        return self._engine.pool.num_free_blocks()

    @property
    def outstanding_requests(self) -> int:
        return len(self.outstanding)

    @property
    def outstanding_tokens(self) -> int:
        return self.outstanding.total

    def prefix_hit(self, request: RouteRequest) -> int:
        pool = self._engine.pool
        return pool.cached_blocks(request.block_chain(pool.block_size)) * pool.block_size

    def prefix_hit_at_least(self, request: RouteRequest, tokens: int) -> int:
        """`prefix_hit(request)` when it is at least `tokens`, else 0: for a router that only
        wants a longer hit than one it has (on a replica's own pool, one probe when the block
        that would make it longer is not cached). A subclass that defines its own `prefix_hit`
        gets `_prefix_hit_at_least`, which asks it."""
        pool = self._engine.pool
        bs = pool.block_size
        hashes = request.block_chain(bs)
        need = -(-tokens // bs)
        if need and (need > len(hashes) or hashes[need - 1][0] not in pool._index):
            return 0  # (cached_blocks' first probe, without the call: most replicas end here)
        return pool.cached_blocks(hashes, need) * bs

    def _prefix_hit_at_least(self, request: RouteRequest, tokens: int) -> int:
        hit = self.prefix_hit(request)
        return hit if hit >= tokens else 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "prefix_hit" in cls.__dict__ and "prefix_hit_at_least" not in cls.__dict__:
            cls.prefix_hit_at_least = ReplicaView._prefix_hit_at_least

    @staticmethod
    def of(index: int, *, name: str | None = None, pool: str = "default", policy: str = "fcfs",
           waiting: int = 0, running: int = 0, kv_used: int = 0, kv_free: int = 0,
           outstanding: dict[str, int] | None = None, prefix_hit: int = 0) -> ReplicaView:
        """A view of a replica that is not there: fixed numbers (tests, benches, notebooks).
        `outstanding` is request id -> tokens (prompt + `max_new_tokens`) of the requests routed
        there that have not ended (`outstanding_requests` is its length, `outstanding_tokens` its
        sum); `prefix_hit` is what `prefix_hit(request)` answers for any request."""
        return _FixedView(index, name or f"r{index}", pool, policy, waiting, running, kv_used, kv_free,
                          Outstanding(outstanding or {}), prefix_hit)


class Outstanding(dict):
    """request_id -> tokens (prompt + max_new_tokens) of the requests routed to a replica that have
    not ended, with their running `total`."""

    __slots__ = ("total",)

    def __init__(self, items: dict[str, int] | None = None) -> None:
        super().__init__(items or {})
        self.total = sum(self.values())

    def add(self, request_id: str, tokens: int) -> None:
        self[request_id] = tokens
        self.total += tokens

    def end(self, request_id: str) -> None:
        self.total -= self.pop(request_id, 0)


class _FixedView(ReplicaView):
    __slots__ = ("_fixed",)

    def __init__(self, index, name, pool, policy, waiting, running, kv_used, kv_free, outstanding, hit) -> None:
        super().__init__(index, name, pool, policy, None, outstanding)
        self._fixed = (waiting, running, kv_used, kv_free, hit)

    @property
    def num_waiting(self) -> int:
        return self._fixed[0]

    @property
    def num_running(self) -> int:
        return self._fixed[1]

    @property
    def kv_used_blocks(self) -> int:
        return self._fixed[2]

    @property
    def kv_free_blocks(self) -> int:
        return self._fixed[3]

    def prefix_hit(self, request: RouteRequest) -> int:
        return min(self._fixed[4], request.prompt_len)
