"""`Sequence`: a request's live state inside the engine, and its state machine.

This is the object every hook receives. It is a plain `__slots__` class (no validation, no
properties with side effects) because the step touches it thousands of times a second.

State machine::

    WAITING ──admit──► RUNNING ──finish──► FINISHED
       ▲                 │   ▲
       └──preempt(recompute)  └──swap in── SWAPPED ◄──preempt(swap)
    any state ──cancel/fail──► FINISHED

A running sequence is *prefilling* while more than one of its known tokens lacks KV, and
*decoding* when only the newest token does.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum
from types import MappingProxyType
from typing import Any

from .request import Request, SamplingParams

_NO_METADATA: Mapping[str, Any] = MappingProxyType({})


class SeqState(IntEnum):
    """Where a sequence is in its state machine (see the module docstring)."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED = 3


#: Module-level names for the states, for hot loops (a global is cheaper than ``SeqState.X``).
WAITING, RUNNING, SWAPPED, FINISHED = SeqState.WAITING, SeqState.RUNNING, SeqState.SWAPPED, SeqState.FINISHED
#: The states of a sequence that waits for a slot: never admitted (or preempted by recompute), or
#: swapped out. ``seq.state in QUEUED`` is the one test for "in a queue"; no module redefines it.
QUEUED = frozenset((SeqState.WAITING, SeqState.SWAPPED))


class FinishReason(str, Enum):
    """Why a sequence ended (`Sequence.finish_reason`); its value is the string the outputs and the
    HTTP API show."""

    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    FAILED = "failed"
    REJECTED = "rejected"

    def __str__(self) -> str:
        return self.value


class Sequence:
    """One sequence of tokens being generated (a request, or one of the `n` samples of one).

    Read-only for plugins: the scheduler and engine own every field. Plugin-facing fields:

    - `request_id`, `seq_id` (equal unless `n > 1`, where children are `"<id>#<i>"`), `index`
    - `tenant`, `priority`, `arrival_time`, `deadline`, `expected_output_tokens`, `sampling`
    - `metadata`: the request's fields for plugins (`Request.metadata`), a read-only mapping
    - `token_ids` (prompt then output), `num_prompt_tokens`, `num_computed_tokens` (tokens whose
      KV is in the cache), `num_output_tokens`, `state`, `finish_reason`
    - `num_preemptions`, `num_cached_prompt_tokens` (prompt tokens served from the prefix cache at
      the first admission), `admitted_seq_no` (a counter stamped at each admission: larger is later)
    - timestamps on the engine's clock: `first_scheduled_time`, `prefill_done_time`,
      `first_token_time`, `finish_time` (None until they happen), `token_times`.
    - `logprobs` (with `sampling.logprobs = k`, else None): one `(logprob, top)` per output token,
      `top` the `k` most likely `(token, logprob)` pairs, from the raw logits.
    - `num_draft_tokens`, `num_accepted_tokens`: under speculative decoding, the draft tokens
      verified for this sequence so far and how many of them were accepted;
      `num_draft_rejections`: the verifications that ended at a rejected draft (not those cut by a
      stop, nor those that accepted every draft), so that its per-draft acceptance is
      `num_accepted_tokens / (num_accepted_tokens + num_draft_rejections)`: the drafts after a
      rejected one were never tested
    - `text`: the detokenised output so far, cut before a stop string (None when the engine has
      no tokenizer); its incremental state is `detok`.
    """

    __slots__ = (
        "request_id", "seq_id", "index", "tenant", "priority", "arrival_time", "deadline",
        "expected_output_tokens", "sampling", "cache_salt", "metadata", "arrival_no",
        "token_ids", "num_prompt_tokens", "num_computed_tokens", "num_cached_blocks",
        "block_table", "host_table", "state", "finish_reason", "error",
        "num_preemptions", "num_cached_prompt_tokens", "recomputed_tokens", "num_lost_tokens", "admitted_seq_no",
        "first_scheduled_time", "prefill_done_time", "first_token_time", "finish_time",
        "token_times", "parent", "children", "detok",
        "max_computed", "stalls", "stall_mark", "logprobs", "num_draft_tokens", "num_accepted_tokens",
        "num_draft_rejections",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        arrival_time: float,
        *,
        tenant: str = "default",
        priority: int = 0,
        deadline: float | None = None,
        expected_output_tokens: int | None = None,
        cache_salt: str | None = None,
        metadata: Mapping[str, Any] = _NO_METADATA,
        arrival_no: int = 0,
        seq_id: str | None = None,
        index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.seq_id = seq_id or request_id
        self.index = index
        self.tenant = tenant
        self.priority = priority
        self.arrival_time = arrival_time
        self.deadline = deadline
        self.expected_output_tokens = expected_output_tokens
        self.sampling = sampling
        self.cache_salt = cache_salt
        self.metadata = (metadata if type(metadata) is MappingProxyType
                         else MappingProxyType(dict(metadata)) if metadata else _NO_METADATA)
        self.arrival_no = arrival_no
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_blocks = 0
        self.block_table: list[int] = []
        self.host_table: list[int] = []
        self.state = SeqState.WAITING
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = 0
        self.recomputed_tokens = 0
        self.num_lost_tokens = 0
        self.admitted_seq_no = -1
        self.first_scheduled_time: float | None = None
        self.prefill_done_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.token_times: list[float] = []
        self.parent: Sequence | None = None
        self.children: list[Sequence] = []
        self.detok = None
        # progress bookkeeping of the core's no-livelock rule (`core.plugins.preemption.is_protected`),
        # updated at preemptions: the most tokens it ever had computed, preemptions in a row
        # without passing the previous mark, the mark
        self.max_computed = 0
        self.stalls = 0
        self.stall_mark = -1
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_draft_rejections = 0
        self.logprobs: list[tuple[float, tuple[tuple[int, float], ...]]] | None = (
            [] if sampling.logprobs is not None else None)

    @classmethod
    def from_request(cls, request: Request, arrival_time: float, arrival_no: int) -> Sequence:
        return cls(
            request.request_id,
            request.prompt_token_ids,
            request.sampling,
            arrival_time,
            tenant=request.tenant,
            priority=request.priority,
            deadline=request.deadline,
            expected_output_tokens=request.expected_output_tokens,
            cache_salt=request.cache_salt,
            metadata=request.metadata,
            arrival_no=arrival_no,
        )

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def text(self) -> str | None:
        return self.detok.text if self.detok is not None else None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens whose KV is not in the cache yet (what the next steps must compute)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """True when the sequence has output tokens and only its newest token lacks KV."""
        n = len(self.token_ids)
        return self.num_computed_tokens == n - 1 and n > self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.state is SeqState.FINISHED

    def remaining_output_tokens(self, estimate: int) -> int:
        """Output tokens still to generate if the whole output is `estimate` tokens long."""
        return max(0, min(estimate, self.sampling.max_new_tokens) - self.num_output_tokens)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.seq_id!r}, {self.state.name}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
