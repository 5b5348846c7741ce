"""`LifecycleLog`: one structlog event per request lifecycle transition.

Registered by the engine when `EngineConfig.debug` is set (so the step pays nothing for logging
otherwise); being an ordinary observer plugin, it can also be loaded with `--plugin`.
"""

from __future__ import annotations

import structlog

from .context import StepContext
from .hookspecs import hookimpl
from .sequence import Sequence


class LifecycleLog:
    name = "lifecycle_log"

    def __init__(self, logger_name: str = "metroline") -> None:
        self.log = structlog.get_logger(logger_name)

    def _emit(self, event: str, ctx: StepContext, seqs: list[Sequence], **extra: object) -> None:
        for s in seqs:
            self.log.info(event, request_id=s.seq_id, tenant=s.tenant, step=ctx.step, t=ctx.now, **extra)

    @hookimpl
    def on_arrival(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        self._emit("request.arrived", ctx, seqs)

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.log.info(
                "request.admitted", request_id=s.seq_id, tenant=s.tenant, step=ctx.step, t=ctx.now,
                computed_tokens=s.num_computed_tokens, blocks=len(s.block_table),
            )

    @hookimpl
    def on_preempted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.log.info(
                "request.preempted", request_id=s.seq_id, tenant=s.tenant, step=ctx.step, t=ctx.now,
                to=s.state.name.lower(), preemptions=s.num_preemptions,
            )

    @hookimpl
    def on_finished(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.log.info(
                "request.finished", request_id=s.seq_id, tenant=s.tenant, step=ctx.step, t=ctx.now,
                reason=str(s.finish_reason), output_tokens=s.num_output_tokens, error=s.error,
            )
