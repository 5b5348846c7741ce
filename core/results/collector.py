"""What the engine records while it runs: one step tuple per step and one `RequestRecord` per
finished sequence (`MetricsCollector`).

Recording is on the hot path: `MetricsCollector.record_step` appends one tuple of ints and floats
per step and `record_finished` one `RequestRecord` per finished sequence. Everything else is
computed once, at the end (`metroline.core.results.summaries`, `metroline.core.results.fairness`, `metroline.core.results.document`).

Times are seconds on the engine's clock (virtual in the simulator, wall clock on a real model).
"""

from __future__ import annotations

from collections import Counter
from enum import Enum
from operator import attrgetter
from typing import Collection, NamedTuple

from ..requests.sequence import FinishReason, Sequence
from ..step.plan import StepPlan

COMPLETED_REASONS = frozenset({FinishReason.EOS.value, FinishReason.LENGTH.value, FinishReason.STOP.value})
"""Finish reasons that count as a completed request (latencies are measured over these)."""
REJECTED = FinishReason.REJECTED.value

# Layout of one step tuple in `MetricsCollector.steps`.
STEP = 0
TIME_S = 1
DURATION_S = 2
NUM_SEQS = 3
PREFILL_TOKENS = 4
DECODE_TOKENS = 5
PREEMPTIONS = 6
RUNNING = 7
WAITING = 8
SWAPPED = 9
DECODING = 10
FREE_BLOCKS = 11
CACHED_BLOCKS = 12
USED_BLOCKS = 13


_tenant_of = attrgetter("tenant")


class StepRow(NamedTuple):
    """A read-time view of one step tuple: `StepRow(*collector.steps[i])`.

    The collector stores plain tuples in this field order (the index constants `STEP` ...
    `USED_BLOCKS` name the same positions); this type is only for code that reads them.

    - `step`: the plan's step number; `time_s`: the clock after the step ran; `duration_s`: how
      long it took.
    - `num_seqs`, `prefill_tokens`, `decode_tokens`, `preemptions`: from the step plan.
    - `running`, `waiting`, `swapped`: queue lengths; `decoding`: running sequences that wanted a
      decode token when the step began.
    - `free_blocks`, `cached_blocks` (evictable), `used_blocks` (referenced by live sequences).
    """

    step: int
    time_s: float
    duration_s: float
    num_seqs: int
    prefill_tokens: int
    decode_tokens: int
    preemptions: int
    running: int
    waiting: int
    swapped: int
    decoding: int
    free_blocks: int
    cached_blocks: int
    used_blocks: int


class RequestRecord(NamedTuple):
    """What is kept of one sequence once it has finished (or of a request that was rejected).

    `id` is the sequence id (`"<request>#<i>"` for the children of a parallel-sampling request).
    Timestamps are None for what never happened (a rejected request was never scheduled).
    `token_times` holds the time each output token was produced, in order.
    """

    id: str
    tenant: str
    priority: int
    arrival_s: float
    first_scheduled_s: float | None
    prefill_done_s: float | None
    first_token_s: float | None
    finish_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    preemptions: int
    recomputed_tokens: int
    finish_reason: str
    token_times: tuple[float, ...]
    error: str | None


class MetricsCollector:
    """Collects one run's step log and request records.

    - `steps`: one tuple per step, laid out as `StepRow` (use the index constants or `StepRow`
      to read it).
    - `requests`: one `RequestRecord` per finished sequence and per rejected request.
    - `running_by_tenant`: one dict per step (aligned with `steps`, when the engine records it
      with `record_running`): tenant -> how many of its sequences were running after the step was
      scheduled (a tenant with none is absent). Consecutive steps with the same counts share one
      dict: treat them as read-only.
    """

    __slots__ = (
        "max_num_seqs", "requests", "steps", "running_by_tenant", "_append_step", "_append_running",
        "_counts", "_num_running", "_tenants", "deadlines",
    )

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.requests: list[RequestRecord] = []
        self.deadlines: dict[str, float] = {}
        """Sequence id -> its deadline, for the finished sequences that had one."""
        self.steps: list[tuple] = []
        self.running_by_tenant: list[dict[str, int]] = []
        self._append_step = self.steps.append
        self._append_running = self.running_by_tenant.append
        self._counts: dict[str, int] = {}
        self._num_running = 0
        self._tenants: set[str] = set()

    def record_step(
        self,
        plan: StepPlan,
        time_s: float,
        duration_s: float,
        running: int,
        waiting: int,
        swapped: int,
        decoding: int,
        free_blocks: int,
        cached_blocks: int,
        used_blocks: int,
    ) -> None:
        """Record one executed step.

        `time_s` is the clock after the step, `duration_s` its length; `decoding` is how many
        running sequences wanted a decode token when the step began (a step that schedules no
        decode token while some wanted one is a decode stall). Batch size, token counts and
        preemptions come from `plan`.
        """
        self._append_step((
            plan.step, time_s, duration_s, len(plan.scheduled), plan.num_prefill_tokens,
            plan.num_decode_tokens, len(plan.preempted), running, waiting, swapped, decoding,
            free_blocks, cached_blocks, used_blocks,
        ))

    def note_tenant(self, tenant: str) -> None:
        """Note that a request of `tenant` was submitted (once per request, before it can run)."""
        self._tenants.add(tenant)

    def record_running(self, plan: StepPlan, running: Collection[Sequence]) -> None:
        """Record how many of each tenant's sequences are running after `plan` was scheduled.

        Cheap on the hot path: the counts are recounted only when the running set can have
        changed since the last step (something was admitted, preempted or forked, or its length
        changed: a sequence leaves it only by preemption or by ending), and only when requests of
        more than one tenant were submitted (`note_tenant`; with one, its count is `len(running)`).
        Call once per recorded step, after `record_step`."""
        if plan.admitted or plan.preempted or plan.forked or len(running) != self._num_running:
            self._num_running = len(running)
            tenants = self._tenants
            if len(tenants) == 1:
                self._counts = dict.fromkeys(tenants, len(running)) if running else {}
            else:  # several tenants (or sequences that came in without `note_tenant`)
                self._counts = dict(Counter(map(_tenant_of, running)))
        self._append_running(self._counts)

    def record_finished(self, seq: Sequence) -> None:
        """Record a sequence that has finished, whatever its finish reason. Call once per sequence."""
        if seq.deadline is not None:  # the `deadlines` metric (core/results/deadlines.py)
            self.deadlines[seq.seq_id] = seq.deadline
        reason = seq.finish_reason
        self.requests.append(RequestRecord(
            seq.seq_id, seq.tenant, seq.priority, seq.arrival_time, seq.first_scheduled_time,
            seq.prefill_done_time, seq.first_token_time, seq.finish_time, seq.num_prompt_tokens,
            seq.num_cached_prompt_tokens, len(seq.token_ids) - seq.num_prompt_tokens,
            seq.num_preemptions, seq.recomputed_tokens,
            reason.value if isinstance(reason, Enum) else str(reason or ""),
            tuple(seq.token_times), seq.error,
        ))

    def record_rejected(
        self, request_id: str, tenant: str, priority: int, arrival_s: float, prompt_tokens: int, error: str
    ) -> None:
        """Record a request that was refused at submission (it never became a running sequence)."""
        self.requests.append(RequestRecord(
            request_id, tenant, priority, arrival_s, None, None, None, None, prompt_tokens, 0, 0, 0, 0,
            REJECTED, (), error,
        ))

