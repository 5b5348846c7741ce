"""The workload model: `WorkloadItem` (one request: arrival, prompt segments, output length,
tenant, priority), `Workload` (a named list of them, sorted by arrival), `WorkloadError` and the
size limits every workload source checks.

Prompts are lists of *segments* `(key, length)` (see `core/token_streams.py`); tokens are made
lazily, when a request is submitted.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Iterator

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
        raw = b"".join(segment_bytes(key, length, vocab_size) for key, length in self.segments)
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
