"""Requests in: validation against the engine's limits, arrival on the engine's clock, abort.

`Intake` is a part of `Engine` (a mixin: it uses the engine's config, executor, plugins,
scheduler, metrics and request table).
"""

from __future__ import annotations

import heapq
from typing import Any

from pydantic import ValidationError

from ..config import EngineConfig
from ..errors import PluginError, RequestRefused
from ..requests.request import Request, engine_limit_problem, length_problem
from ..requests.sequence import FinishReason, Sequence
from . import recovery


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
    """Submitting, validating, refusing and cancelling requests."""

    def validate(self, request: Request | dict[str, Any]) -> Request:
        """Validate a request against this engine's limits; raises pydantic's `ValidationError`
        naming the field and the limit."""
        if isinstance(request, Request):
            if engine_limit_problem(request, self._validation_context) is None:
                return request
            request = request.model_dump()  # validate again, for the ValidationError
        return Request.model_validate(request, context=self._validation_context)

    def add_request(self, request: Request | dict[str, Any]) -> str:
        """Queue a request; returns its id. An invalid request raises `ValidationError`, one that
        a plugin says could never run (the `check_request` hook) raises `RequestRefused`; either
        leaves the engine untouched.

        A request whose `arrival_time` lies ahead of the engine's clock waits until the clock gets
        there (`stream` and `run` move an idle clock to it) before the policies hear of it."""
        req = self.validate(request)
        if req.request_id in self._requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        now = self.executor.now()
        arrival = req.arrival_time if req.arrival_time is not None else now
        seq = Sequence.from_request(req, arrival, self._arrivals)
        if self._check_request:
            reason = self.plugins.refusal(self.scheduler.ctx, seq)
            if reason is not None:
                raise RequestRefused(f"request {req.request_id!r} can never run: {reason}")
        self._arrivals += 1
        self.metrics.note_tenant(seq.tenant)
        self._requests[req.request_id] = [seq]
        if arrival > now:
            heapq.heappush(self._pending, (arrival, seq.arrival_no, seq))
        else:
            self._add(seq)
        return req.request_id

    def _release_arrivals(self, now: float) -> None:
        pending = self._pending
        while pending and pending[0][0] <= now:
            self._add(heapq.heappop(pending)[2])

    def _add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)
        self._arrived.append(seq)

    def length_problem(self, prompt_len: int, max_new_tokens: int, n: int = 1) -> str | None:
        """Why a request of these lengths could never run on this engine, or None: the check of
        `add_request` that needs no tokens, so a caller can refuse a huge prompt before making it."""
        return length_problem(prompt_len, max_new_tokens, n, self._validation_context)

    def reject(self, request: Any, error: ValidationError | Exception) -> None:
        """Record a request that failed validation (it counts as `rejected` in the metrics)."""
        get = request.get if isinstance(request, dict) else lambda k, d=None: getattr(request, k, d)
        prompt = get("prompt_token_ids") or ()
        self.metrics.record_rejected(
            str(get("request_id", "?")), str(get("tenant", "default")), int(get("priority", 0) or 0),
            float(get("arrival_time", None) or self.executor.now()), len(prompt), str(error),
        )

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state: it is reaped at once (its blocks freed, `on_finished`
        told) and the next step reports its end. False if it is unknown or already finished. (An
        `on_finished` observer's error here is raised by the next step, as if that step had met it.)"""
        seqs = self._all_seqs(self._requests.get(request_id, []))
        if all(s.is_finished for s in seqs):  # unknown (no sequences), or every sample ended
            return False
        now = self.executor.now()
        for seq in seqs:
            if any(p[2] is seq for p in self._pending):  # not arrived yet: it arrives, cancelled
                self._pending = [p for p in self._pending if p[2] is not seq]
                heapq.heapify(self._pending)
                self._add(seq)
            self.scheduler.finish(seq, FinishReason.CANCELLED, now)
        self._cancelled += recovery.ending(self.scheduler)
        try:
            self._reap()
        except PluginError as exc:
            self._reap_error = exc
        return True

    def has_unfinished(self) -> bool:
        """Whether a step has something to do: requests to serve, or ends to report."""
        return bool(self._pending or self._cancelled) or self.scheduler.has_work()

    def sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of a request (one, or `n` for parallel sampling)."""
        return self._all_seqs(self._requests[request_id])

    @staticmethod
    def _all_seqs(seqs: list[Sequence]) -> list[Sequence]:
        return [s for head in seqs for s in (head, *head.children)]
