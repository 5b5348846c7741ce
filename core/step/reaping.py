"""Requests out: the reap of the requests that ended, the failure of those a `PluginError`
interrupted, and the cancelled requests whose ends the next step reports.

`Reaper` is a collaborator of `metroline.core.step.engine.Engine`: it receives the scheduler
(which frees an ended request's blocks and tells `on_finished`), the intake (whose table forgets
an ended request unless the engine retains them) and the metrics (which record each end).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import PluginError
from ..requests.sequence import FinishReason, Sequence
from . import recovery
from .outputs import RequestOutput


class Reaper:
    """The end of requests, and what an abort leaves for the next step to report.

    `retain_finished`: keep ended requests in the intake's table (see `Engine`). `cancelled`: the
    sequences an abort reaped whose ends the next step reports; `error`: an `on_finished` error an
    abort met, raised by the next step."""

    def __init__(self, scheduler: Any, intake: Any, metrics: Any, retain_finished: bool) -> None:
        self._scheduler = scheduler
        self._intake = intake
        self._metrics = metrics
        self.retain_finished = retain_finished
        self.cancelled: list[Sequence] = []
        self.error: PluginError | None = None

    def reap(self) -> list[Sequence]:
        """Take the requests that ended out (their blocks freed, `on_finished` told), record them
        and forget them; returns them. Their records are kept when an `on_finished` observer fails."""
        ending = recovery.ending(self._scheduler)
        try:
            ended = self._scheduler.reap()
        except PluginError:
            self._forget(ending)  # they were freed; only an on_finished observer failed
            raise
        self._forget(ended)
        return ended

    def _forget(self, ended: list[Sequence]) -> None:
        for seq in ended:
            self._metrics.record_finished(seq)
        if not self.retain_finished:
            self._intake.forget(ended)

    def fail(self, error: PluginError, seqs: Iterable[Sequence], now: float) -> list[Sequence]:
        """Fail `seqs` (the requests a `PluginError` interrupted) and free their blocks now;
        returns those it failed (not ended before)."""
        failed = recovery.fail(self._scheduler, seqs, now, f"PluginError: {error}")
        self.reap()
        return failed

    def cancel(self, seqs: list[Sequence], now: float) -> None:
        """End `seqs` (a request's sequences, arrived) as cancelled and reap them now; the next
        step reports their ends, and raises an `on_finished` error met here."""
        for seq in seqs:
            self._scheduler.finish(seq, FinishReason.CANCELLED, now)
        self.cancelled += recovery.ending(self._scheduler)
        try:
            self.reap()
        except PluginError as exc:
            self.error = exc

    def report_cancelled(self, outputs: list[RequestOutput] | None) -> None:
        """The ends of the requests cancelled since the last step, into `outputs`; then the
        `on_finished` error an abort met, if any."""
        cancelled, self.cancelled = self.cancelled, []
        output_ended(cancelled, outputs)
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def output_ended(ended: list[Sequence], outputs: list[RequestOutput] | None) -> None:
    """A last, empty output for each of `ended` (when outputs are made)."""
    if outputs is not None and ended:
        outputs.extend(RequestOutput(s, [], True) for s in ended)
