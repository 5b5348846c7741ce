"""What the router of a front (`front.py`) sees of a replica server: a `ReplicaView` whose numbers
come from the replica's polled `/v1/replica/state` and the front's own bookkeeping.

`outstanding_requests`/`outstanding_tokens` are the front's (requests it routed there that have not
ended: exact, updated at routing and at completion); the queue and KV numbers are the last poll's
(every ~50 ms); `prefix_hit(request)` is an estimate: the front remembers the prompt blocks it
routed to each replica in one `PrefixDirectory` that all its views share (hashed as
`RouteRequest.block_chain` hashes them, aged out by size) instead of asking the replica's cache.
With per-tenant cache salts
(`ServeConfig.salted`) the front hashes each tenant's prompt blocks from its own salt
(`SaltedPrompt`), as the replicas' caches do: one tenant's hits never tell of another's prompts.
"""

from __future__ import annotations

from typing import Any

from ..cluster.prefix_directory import MAX_ESTIMATE_BLOCKS, PrefixDirectory
from ..cluster.view import Outstanding, ReplicaView, RouteRequest

DEFAULT_BLOCK_SIZE = 16


class SaltedPrompt(list):
    """A prompt's tokens whose block hashes (`RouteRequest.block_chain`) chain from a salt (a
    tenant's), so that equal prompts of different tenants share no block."""

    __slots__ = ("salt",)

    def __init__(self, tokens: list[int], salt: str) -> None:
        super().__init__(tokens)
        self.salt = salt

    def block_chain(self, block_size: int, max_tokens: int) -> list[tuple[int, tuple]]:
        """`[(chained hash, tokens), ...]` of the full blocks among the first `max_tokens` (at most
        `MAX_ESTIMATE_BLOCKS` of them), the first block's parent being the salt."""
        out = []
        parent: int = hash(("cache_salt", self.salt))
        end = min(len(self), max_tokens, MAX_ESTIMATE_BLOCKS * block_size) - block_size + 1
        for pos in range(0, end, block_size):
            tokens = tuple(self[pos:pos + block_size])
            parent = hash((parent, tokens, None))
            out.append((parent, tokens))
        return out


class RemoteView(ReplicaView):
    """A replica server as the router sees it. `slot` is its fixed place among the front's replicas
    (`index` is its place in the tuple of live replicas the router is shown); `state` is the last
    polled state (a dict), `up` whether the front still routes to it. `prefix_directory`: the
    front's, shared by its views (without one, a view has its own of `prefix_capacity` blocks)."""

    __slots__ = ("slot", "state", "up")

    def __init__(self, slot: int, name: str, pool: str, prefix_capacity: int = 65536,
                 prefix_directory: PrefixDirectory | None = None) -> None:
        directory = PrefixDirectory(prefix_capacity) if prefix_directory is None else prefix_directory
        super().__init__(slot, name, pool, "?", None, Outstanding(), directory, directory.new_bit())
        self.slot = slot
        self.state: dict[str, Any] = {}
        self.up = True

    def update(self, state: dict[str, Any]) -> None:
        """Take a polled state (the directory hashes at the replicas' block size)."""
        self.state = state
        self.policy = str(state.get("policy", self.policy))
        size = state.get("block_size")
        if size:
            self.prefix_directory.set_block_size(int(size))

    def forget_prefixes(self) -> None:
        """The replica's cache may be gone (it went down): count none of the blocks routed to it
        before (a new bit in the directory)."""
        directory = self.prefix_directory
        directory.retire(self.prefix_bit)
        self.prefix_bit = directory.new_bit()

    @property
    def block_size(self) -> int:
        return int(self.state.get("block_size") or DEFAULT_BLOCK_SIZE)

    @property
    def num_waiting(self) -> int:
        return int(self.state.get("num_waiting", 0))

    @property
    def num_running(self) -> int:
        return int(self.state.get("num_running", 0))

    @property
    def kv_used_blocks(self) -> int:
        return int(self.state.get("kv_used_blocks", 0))

    @property
    def kv_free_blocks(self) -> int:
        return int(self.state.get("kv_free_blocks", 0))

    def prefix_hit(self, request: RouteRequest) -> int:
        directory = self.prefix_directory
        bs = directory.block_size
        return directory.hit_blocks(request.block_chain(bs, directory.max_blocks), self.prefix_bit) * bs

    def prefix_hit_at_least(self, request: RouteRequest, tokens: int) -> int:
        hit = self.prefix_hit(request)
        return hit if hit >= tokens else 0
