"""What the router of a front (`front.py`) sees of a replica server: a `ReplicaView` whose numbers
come from the replica's polled `/v1/replica/state` and the front's own bookkeeping.

`outstanding_requests`/`outstanding_tokens` are the front's (requests it routed there that have not
ended: exact, updated at routing and at completion); the queue and KV numbers are the last poll's
(every ~50 ms); `prefix_hit(request)` is an estimate: the front remembers the prompt blocks it
routed to each replica (`RoutedPrefixes`, hashed as `RouteRequest.block_chain` hashes them,
least-recently-used first out) instead of asking the replica's cache. With per-tenant cache salts
(`ServeConfig.salted`) the front hashes each tenant's prompt blocks from its own salt
(`SaltedPrompt`), as the replicas' caches do: one tenant's hits never tell of another's prompts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ..cluster.view import Outstanding, ReplicaView, RouteRequest

DEFAULT_BLOCK_SIZE = 16

MAX_ESTIMATE_BLOCKS = 64
"""The front's prefix estimate looks at most this many leading blocks of a prompt (1,024 tokens at
16 a block): it hashes no more of a long prompt per request, and two replicas that both hold more
of it count as equal there (the load bound decides)."""


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


class RoutedPrefixes:
    """The block hashes of the prompts routed to one replica, at most `capacity` of them (the
    least recently used go first): an approximate copy of its prefix cache."""

    __slots__ = ("_blocks", "capacity")

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, chain: list[tuple[int, tuple]]) -> None:
        """Remember a routed prompt's blocks (`RouteRequest.block_chain`), deepest first: a prompt's
        first blocks are the most recently used, so the least recently used blocks forgotten first
        are the ends of prefixes (as a radix cache evicts leaves), never a prefix's start."""
        blocks = self._blocks
        for h, _ in reversed(chain):
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def hit_blocks(self, chain: list[tuple[int, tuple]], at_least: int = 0) -> int:
        """How many leading blocks of `chain` were routed here (and not forgotten); with
        `at_least`, 0 when fewer than that (one probe when block `at_least` is not here)."""
        blocks = self._blocks
        if at_least and (at_least > len(chain) or chain[at_least - 1][0] not in blocks):
            return 0
        n = 0
        for h, _ in chain:
            if h not in blocks:
                break
            n += 1
        return n if n >= at_least else 0

    def __len__(self) -> int:
        return len(self._blocks)


class RemoteView(ReplicaView):
    """A replica server as the router sees it. `slot` is its fixed place among the front's replicas
    (`index` is its place in the tuple of live replicas the router is shown); `state` is the last
    polled state (a dict), `up` whether the front still routes to it."""

    __slots__ = ("prefixes", "slot", "state", "up")

    def __init__(self, slot: int, name: str, pool: str, prefix_capacity: int = 65536) -> None:
        super().__init__(slot, name, pool, "?", None, Outstanding())
        self.slot = slot
        self.state: dict[str, Any] = {}
        self.up = True
        self.prefixes = RoutedPrefixes(prefix_capacity)

    def update(self, state: dict[str, Any]) -> None:
        """Take a polled state."""
        self.state = state
        self.policy = str(state.get("policy", self.policy))

    @property
    def outstanding(self) -> Outstanding:
        """request_id -> tokens of the requests routed here that have not ended."""
        return self._outstanding

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
        bs = self.block_size
        return self.prefixes.hit_blocks(request.block_chain(bs)) * bs

    def prefix_hit_at_least(self, request: RouteRequest, tokens: int) -> int:
        bs = self.block_size
        return self.prefixes.hit_blocks(request.block_chain(bs), -(-tokens // bs)) * bs

    def routed(self, request: RouteRequest) -> None:
        """Remember a prompt routed here (for later `prefix_hit` estimates)."""
        self.prefixes.add(request.block_chain(self.block_size))
