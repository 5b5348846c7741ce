"""Requests in: validation against the engine's limits, arrival on the engine's clock, the table
of requests.

`Intake` is a collaborator of `metroline.core.step.engine.Engine`: the engine holds one and
calls it (its `add_request`, `validate`, ... are the intake's); it receives what it uses, the
scheduler the requests join, the plugins that may refuse one (`check_request`), the executor's
clock and the metrics that count the rejected.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import RequestRefused
from ..requests.request import STRUCTURED_OUTPUT_PLUGIN, Request, engine_limit_problem, length_problem
from ..requests.sequence import Sequence


def validation_context(config: EngineConfig, executor: Any, tokenizer: bool) -> dict[str, Any]:
    """The limits a request is validated against: the config's, narrowed by the executor's model
    (`vocab_size`, a shorter `max_model_len` and why, when the model says); `tokenizer`: whether
    stop strings can be applied."""
    context: dict[str, Any] = {
        "max_model_len": config.max_model_len, "max_kv_tokens": config.max_kv_tokens,
        "max_num_seqs": config.max_num_seqs, "tokenizer": tokenizer,
    }
    vocab = getattr(executor, "vocab_size", None)
    if vocab is not None:
        context["vocab_size"] = vocab
    model_len = getattr(executor, "max_model_len", None)
    if model_len is not None and model_len <= config.max_model_len:
        context["max_model_len"] = model_len
        reason = getattr(executor, "max_model_len_reason", None)
        if reason:
            context["max_model_len_reason"] = reason
    return context


class Intake:
    """Submitting, validating and refusing requests; the requests not arrived yet (a future
    `arrival_time`) and those arrived since the last step; the table of every request's sequences.

    `requests` maps a request id to its head sequences (one, or `n` for parallel sampling, each
    with its forked `children`); `pending` is the heap of `(arrival_time, arrival_no, sequence)`
    submitted ahead of the clock; `arrived` the sequences queued since the last schedule (what a
    `PluginError` in the schedule may have left in doubt, `metroline.core.step.recovery`)."""

    def __init__(self, config: EngineConfig, executor: Any, plugins: Any, scheduler: Any, metrics: Any,
                 tokenizer: bool) -> None:
        self.requests: dict[str, list[Sequence]] = {}
        self.pending: list[tuple[float, int, Sequence]] = []
        self.arrived: list[Sequence] = []
        self._executor = executor
        self._plugins = plugins
        self._scheduler = scheduler
        self._metrics = metrics
        self._arrivals = 0
        self._check_request = bool(plugins.hook.check_request.get_hookimpls())
        self.validation_context = validation_context(config, executor, tokenizer)
        """The limits a request is validated against (see `validation_context`)."""
        self.validation_context["structured_output"] = plugins.get(STRUCTURED_OUTPUT_PLUGIN) is not None

    def validate(self, request: Request | dict[str, Any]) -> Request:
        """Validate a request against this engine's limits; raises pydantic's `ValidationError`
        naming the field and the limit."""
        if isinstance(request, Request):
            if engine_limit_problem(request, self.validation_context) is None:
                return request
            request = request.model_dump()  # validate again, for the ValidationError
        return Request.model_validate(request, context=self.validation_context)

    def add_request(self, request: Request | dict[str, Any]) -> str:
        """Queue a request; returns its id (see `Engine.add_request`)."""
        req = self.validate(request)
        if req.request_id in self.requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        now = self._executor.now()
        arrival = req.arrival_time if req.arrival_time is not None else now
        seq = Sequence.from_request(req, arrival, self._arrivals)
        if self._check_request:
            reason = self._plugins.refusal(self._scheduler.ctx, seq)
            if reason is not None:
                raise RequestRefused(f"request {req.request_id!r} can never run: {reason}")
        self._arrivals += 1
        self._metrics.note_tenant(seq.tenant)
        self.requests[req.request_id] = [seq]
        if arrival > now:
            heapq.heappush(self.pending, (arrival, seq.arrival_no, seq))
        else:
            self._arrive(seq)
        return req.request_id

    def release(self, now: float) -> None:
        """The submitted requests whose arrival time came join the waiting queue."""
        pending = self.pending
        while pending and pending[0][0] <= now:
            self._arrive(heapq.heappop(pending)[2])

    def arrive_now(self, seq: Sequence) -> None:
        """`seq` arrives now if it is still pending (an abort ends it where the others are)."""
        if any(p[2] is seq for p in self.pending):
            self.pending = [p for p in self.pending if p[2] is not seq]
            heapq.heapify(self.pending)
            self._arrive(seq)

    def _arrive(self, seq: Sequence) -> None:
        self._scheduler.add(seq)
        self.arrived.append(seq)

    def take_arrived(self) -> list[Sequence]:
        """The sequences queued since the last call (the schedule's arrivals)."""
        arrived, self.arrived = self.arrived, []
        return arrived

    def next_arrival(self) -> float | None:
        """When the earliest pending request arrives (None: none is pending)."""
        return self.pending[0][0] if self.pending else None

    def length_problem(self, prompt_len: int, max_new_tokens: int, n: int = 1) -> str | None:
        """Why a request of these lengths could never run on this engine, or None: the check of
        `add_request` that needs no tokens, so a caller can refuse a huge prompt before making it."""
        return length_problem(prompt_len, max_new_tokens, n, self.validation_context)

    def reject(self, request: Any, error: ValidationError | Exception) -> None:
        """Record a request that failed validation (it counts as `rejected` in the metrics)."""
        get = request.get if isinstance(request, dict) else lambda k, d=None: getattr(request, k, d)
        prompt = get("prompt_token_ids") or ()
        self._metrics.record_rejected(
            str(get("request_id", "?")), str(get("tenant", "default")), int(get("priority", 0) or 0),
            float(get("arrival_time", None) or self._executor.now()), len(prompt), str(error),
        )

    def sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of a request (one, or `n` for parallel sampling); KeyError for an unknown id."""
        return all_sequences(self.requests[request_id])

    def live(self) -> Iterator[Sequence]:
        """Every sequence of every request in the table."""
        return (s for heads in list(self.requests.values()) for s in all_sequences(heads))

    def forget(self, ended: list[Sequence]) -> None:
        """Take the requests of `ended` whose every sequence ended out of the table."""
        requests = self.requests
        for seq in ended:
            heads = requests.get(seq.request_id)
            if heads is not None and all(s.is_finished for s in all_sequences(heads)):
                del requests[seq.request_id]


def all_sequences(heads: Iterable[Sequence]) -> list[Sequence]:
    """The head sequences of a request and the samples forked from them."""
    return [s for head in heads for s in (head, *head.children)]
