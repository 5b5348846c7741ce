"""A metroline `Sequence` for each vLLM request: what the plugins see of it.

vLLM's `Request` stays the truth; the sequence mirrors what the hooks read (tokens, computed
tokens, state, preemptions) and is brought up to date at each step's start (computed tokens) and
after each step's output (new tokens, finish). The request's metroline fields come from
`SamplingParams.extra_args` (`vllm_xargs` in an OpenAI request's body): `tenant` (a string),
`expected_output_tokens` (an int >= 0) and `deadline_s` (seconds after arrival); the others are the
sequence's `metadata`.
"""

from __future__ import annotations

from typing import Any

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import WAITING, Sequence

EXTRA_FIELDS = ("tenant", "expected_output_tokens", "deadline_s")


class BadRequestField(ValueError):
    """A metroline field of a vLLM request's `extra_args` has the wrong type or range."""


def sequence_of(request: Any, arrival_no: int) -> Sequence:
    """The sequence that mirrors the vLLM `request` (not yet queued)."""
    params = request.sampling_params
    extra = dict(getattr(params, "extra_args", None) or {}) if params is not None else {}
    tenant = extra.pop("tenant", "default")
    expected = extra.pop("expected_output_tokens", None)
    deadline_s = extra.pop("deadline_s", None)
    rid = request.request_id
    if not isinstance(tenant, str) or not tenant:
        raise BadRequestField(f"request {rid}: extra_args.tenant must be a non-empty string, got {tenant!r}")
    if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool) or expected < 0):
        raise BadRequestField(f"request {rid}: extra_args.expected_output_tokens must be an int >= 0, got {expected!r}")
    if deadline_s is not None and (isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float))
                                   or not 0 <= deadline_s < float("inf")):
        raise BadRequestField(f"request {rid}: extra_args.deadline_s must be a finite number >= 0, got {deadline_s!r}")
    max_tokens = getattr(request, "max_tokens", None) or (params.max_tokens if params is not None else None) or 1
    arrival = float(request.arrival_time)
    seq = Sequence(
        rid, list(request.prompt_token_ids or ()), SamplingParams(max_new_tokens=max(1, int(max_tokens))), arrival,
        tenant=tenant, priority=int(request.priority), expected_output_tokens=expected,
        deadline=None if deadline_s is None else arrival + float(deadline_s), metadata=extra, arrival_no=arrival_no,
    )
    seq.state = WAITING
    return seq


def catch_up(seq: Sequence, request: Any) -> bool:
    """Append the output tokens `request` has that `seq` lacks; whether there were any."""
    have = len(seq.token_ids) - seq.num_prompt_tokens
    out = request.output_token_ids
    if len(out) <= have:
        return False
    seq.token_ids.extend(out[have:])
    return True


def preempted(seq: Sequence) -> None:
    """Bookkeeping of a recompute preemption, as metroline's victim loop keeps it (the progress
    marks, the tokens lost); the queues are the caller's."""
    seq.num_preemptions += 1
    mark = max(seq.num_computed_tokens, seq.max_computed)
    seq.stalls = seq.stalls + 1 if mark <= seq.stall_mark else 1
    seq.stall_mark = seq.max_computed = mark
    seq.num_lost_tokens = max(seq.num_lost_tokens, seq.num_computed_tokens)
    seq.num_computed_tokens = 0
    seq.num_cached_blocks = 0
    seq.state = WAITING
