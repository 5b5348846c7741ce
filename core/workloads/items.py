"""The workload model: `WorkloadItem` (one request: arrival, prompt segments, output length,
tenant, priority), `Workload` (a named list of them, sorted by arrival), `WorkloadError` and the
size limits every workload source checks.

Prompts are lists of *segments* `(key, length)` (see `metroline.core.workloads.token_streams`); tokens are made
lazily, when a request is submitted.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...kv_backends.prefix_index import block_chain, extend_chain

from ..requests.request import Request
from .token_streams import segment_bytes


class WorkloadError(ValueError):
    """A workload could not be built: bad spec, bad trace row, unknown name or missing file."""


MAX_REQUESTS = 1_000_000
"""The most requests a workload may hold (a spec's `num_requests`, mixed-64's groups x 64, a
trace's rows): about 200 bytes each before their prompts are made, so at most a few hundred MB."""
MAX_ITEM_TOKENS = 1 << 24
"""The most prompt or output tokens one request may have (16M), checked before a prompt is made."""


@dataclass(slots=True, frozen=True)
class WorkloadItem:
    """One request of a workload.

    `segments`: the prompt as `(key, length)` pieces (see the module docstring).
    `output_len`: the true output length; a simulated request ends there.
    `priority`: lower is more urgent (as in `Request`).
    `deadline_s`: seconds after its arrival by which the request should be finished (None: no
    deadline); the request's `deadline` is `arrival_s + deadline_s` on the engine's clock.
    """

    arrival_s: float
    segments: tuple[tuple[object, int], ...]
    output_len: int
    tenant: str = "default"
    priority: int = 0
    deadline_s: float | None = None

    @property
    def prompt_len(self) -> int:
        return sum(length for _, length in self.segments)

    def prompt_token_ids(self, vocab_size: int = 32000) -> list[int]:
        """The prompt's token ids, made from the segments' streams."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        raw = b"".join(segment_bytes(key, length, vocab_size) for key, length in self.segments)
        return PromptTokens(array("H", raw).tolist(), self.segments, vocab_size)

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
            "deadline": None if self.deadline_s is None else self.arrival_s + self.deadline_s,
        }

    def to_request(self, request_id: str, *, vocab_size: int = 32000, oracle: bool = False) -> Request:
        """The validated `Request` of `request_data`."""
        return Request.model_validate(self.request_data(request_id, vocab_size=vocab_size, oracle=oracle))


_SEGMENT_CHAINS: OrderedDict[tuple, list] = OrderedDict()
"""(vocab_size, block_size, leading segments) -> the block chain of their tokens (full blocks), for
the prompts that begin with them; the most recently used `_SEGMENT_CHAINS_MAX`."""
_SEGMENT_CHAINS_MAX = 128


class PromptTokens(list):
    """A prompt's token ids (a plain list to every reader) that knows the segments it was made
    of, so that its block chain (the chained block hashes a router's prefix lookups need,
    `RouteRequest.block_chain`) reuses the hashes of the leading segments other prompts share, as
    vLLM hashes a request's blocks once, at arrival. Changed in place, it forgets its segments
    (`segments` becomes None) and is hashed as it is."""

    __slots__ = ("_chain", "segments", "vocab_size")

    def __init__(self, tokens: list[int], segments: tuple[tuple[object, int], ...], vocab_size: int) -> None:
        super().__init__(tokens)
        self.segments = segments
        self.vocab_size = vocab_size
        self._chain: tuple[int, int, list] | None = None

    def block_chain(self, block_size: int, max_tokens: int) -> list[tuple[int, tuple]]:
        """`block_chain(self, block_size, max_tokens)`, from the remembered chains of its leading
        segments (computed once per prompt and block size; read-only: it may be a remembered one)."""
        cached = self._chain
        if cached is not None and cached[0] == block_size and cached[1] == max_tokens:
            return cached[2]
        segments = self.segments
        size = len(self)
        total = 0
        for _, length in segments or ():
            total += length
        if segments is None or total != size:
            return block_chain(self, block_size, max_tokens)  # changed in place: hash what is there
        chains = _SEGMENT_CHAINS
        chain: list = []
        start = 0
        for j in range(len(segments) - 1, 0, -1):
            key = (self.vocab_size, block_size, segments[:j])
            known = chains.get(key)
            if known is not None:
                chains.move_to_end(key)
                chain, start = known, j
                break
        end = 0
        for _, length in segments[:start]:
            end += length
        limit = min(size, max_tokens)
        last = len(segments) - 1 if end < limit else start - 1  # (all the tokens asked for are known)
        for j in range(start, last + 1):
            end += segments[j][1]
            chain = extend_chain(chain, self, block_size, min(end, limit) if j == last else end)
            if j < last:
                chains[(self.vocab_size, block_size, segments[: j + 1])] = chain
                if len(chains) > _SEGMENT_CHAINS_MAX:
                    chains.popitem(last=False)
        if len(chain) > limit // block_size:
            chain = chain[: limit // block_size]
        self._chain = (block_size, max_tokens, chain)
        return chain

    def _changed(self) -> None:
        self.segments = self._chain = None


def _forgetting(name: str) -> Any:
    method = getattr(list, name)

    def changed(self: PromptTokens, *args: Any, **kwargs: Any) -> Any:
        self._changed()
        return method(self, *args, **kwargs)

    changed.__name__ = name
    return changed


for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "pop",
              "remove", "reverse", "sort", "clear"):
    setattr(PromptTokens, _name, _forgetting(_name))


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
