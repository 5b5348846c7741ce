"""`LifecycleLog`: one structlog event per request lifecycle transition.

Registered by the engine when `EngineConfig.debug` is set (so the step pays nothing for logging
otherwise); being an ordinary observer plugin, it can also be loaded with `--plugin`.

Every event names the policy (`policy`: the base policy and its stacked plugins, `a+b`, as
`metroline compare` labels its runs), the request, its tenant, the step and the engine's clock
`t` in seconds, rounded to the microsecond (`T_DIGITS`); `error` only when there is one.
"""

from __future__ import annotations

from typing import Callable

import structlog

from ..plugins.hookspecs import hookimpl
from ..requests.sequence import Sequence
from .context import StepContext

T_DIGITS = 6
"""Decimal digits of the clock in an event (the microsecond): 0.11, not 0.10999999999999999."""


class LifecycleLog:
    """The observer behind `--debug`: one structlog event per arrival, admission, preemption and
    finish of a request."""

    name = "lifecycle_log"

    def __init__(self, logger_name: str = "metroline") -> None:
        self.log = structlog.get_logger(logger_name)
        self._policy_log: tuple[object, object] | None = None  # (config, logger bound to its policy)

    def _logger(self, ctx: StepContext) -> object:
        """The logger with this engine's policy bound (made once per config)."""
        if self._policy_log is None or self._policy_log[0] is not ctx.config:
            policy = "+".join([ctx.config.policy, *ctx.config.plugins])
            self._policy_log = (ctx.config, self.log.bind(policy=policy))
        return self._policy_log[1]

    def _emit(
        self, event: str, ctx: StepContext, seqs: list[Sequence],
        details: Callable[[Sequence], dict[str, object]] | None = None,
    ) -> None:
        """One `event` per sequence of `seqs`, with the fields every event has and `details(seq)`."""
        log, t = self._logger(ctx), round(ctx.now, T_DIGITS)
        for s in seqs:
            log.info(event, request_id=s.seq_id, tenant=s.tenant, step=ctx.step, t=t, **(details(s) if details else {}))

    @hookimpl
    def on_arrival(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._emit("request.arrived", ctx, seqs)

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._emit("request.admitted", ctx, seqs,
                   lambda s: {"computed_tokens": s.num_computed_tokens, "blocks": len(s.block_table)})

    @hookimpl
    def on_preempted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._emit("request.preempted", ctx, seqs,
                   lambda s: {"to": s.state.name.lower(), "preemptions": s.num_preemptions})

    @hookimpl
    def on_finished(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        def details(s: Sequence) -> dict[str, object]:
            error = {"error": s.error} if s.error is not None else {}
            return {"reason": str(s.finish_reason), "output_tokens": s.num_output_tokens, **error}

        self._emit("request.finished", ctx, seqs, details)
