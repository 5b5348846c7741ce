"""`Engine`: submit requests, step, stream outputs; the loop around scheduler and executor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from ...kv_backends.block_pool import BlockPool
from ..config import EngineConfig
from ..errors import NoProgressError, PluginError
from ..plugins.manager import PluginManager
from ..requests.detokenizer import Detokenizer
from ..requests.request import Request
from ..requests.sequence import SWAPPED, FinishReason, Sequence
from ..results.metrics import MetricsCollector
from . import recovery
from .driving import Driver, drive
from .intake import Intake, all_sequences
from .outputs import Appender, RequestOutput
from .plan import StepPlan, StepResult
from .reaping import Reaper, output_ended
from .sample import SamplePhase
from .scheduler import Scheduler
from .stall import stall_error

__all__ = ["Engine", "RequestOutput"]


class Engine:
    """A continuous-batching engine: a scheduler with its plugins, a KV pool and an executor.

    ```python
    engine = Engine(EngineConfig(policy="fcfs"))          # simulated executor by default
    engine.add_request(Request(prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=8)))
    for out in engine.stream():
        print(out.request_id, out.new_token_ids, out.finished)
    ```

    `executor`: an executor object, or a name (`"sim"`, `"torch"`, an entry point of the group
    `metroline.executors`, or `pkg.mod:factory`) built with its defaults; None is `"sim"`. An
    executor with a `bind(config)` method is bound to this engine's pool geometry here.
    `plugins`: plugin objects stacked on top of those the config names (they take precedence).
    An executor with a `plugins()` method brings plugins of its own (the torch executor's
    structured outputs), stacked below `plugins`; one whose name is already given is left out.
    `eos_token_id`: the model's EOS token (default: the executor's; None: no EOS, as in simulation).
    An executor with a `tokenizer` attribute gets its outputs detokenised as they grow
    (`out.text`, `seq.text`) and its requests' `stop` strings applied; without one, a request
    with stop strings is refused.
    `retain_finished`: keep ended requests (their tokens) for `sequences()` and `run()`'s answer;
    a long replay or a server turns it off, and then an ended request is forgotten once its
    metrics are recorded and its last output is returned.

    Its parts are objects it holds and calls: `plugins`, `pool`, `scheduler`, `intake` (requests
    in, the table of requests), `metrics`, the sample phase and the reaper (requests out).
    """

    def __init__(
        self,
        config: EngineConfig | dict[str, Any] | None = None,
        executor: Any = None,
        *,
        plugins: Iterable[Any] = (),
        eos_token_id: int | None = None,
        retain_finished: bool = True,
    ) -> None:
        if config is None:
            config = EngineConfig()
        elif not isinstance(config, EngineConfig):
            config = EngineConfig.model_validate(config)
        self.config = config
        if executor is None or isinstance(executor, str):
            from ...executors.registry import make_executor

            executor = make_executor(executor or "sim")
        self.executor = executor
        bind = getattr(executor, "bind", None)
        if bind is not None:
            bind(config)
        self.eos_token_id = eos_token_id if eos_token_id is not None else getattr(executor, "eos_token_id", None)
        tokenizer = getattr(executor, "tokenizer", None)
        self.detokenizer = Detokenizer(tokenizer) if tokenizer is not None else None
        extra = list(plugins)
        brought = getattr(executor, "plugins", None)  # the executor's own (structured outputs)
        if brought is not None:
            given = {getattr(p, "name", None) for p in extra} | set(config.plugins) | {config.policy}
            extra[:0] = [p for p in brought() if getattr(p, "name", None) not in given]
        if config.debug:
            from .lifecycle_log import LifecycleLog

            extra.insert(0, LifecycleLog())
        self.plugins = PluginManager(config, extra, getattr(executor, "sampler_class", None))
        self.pool = BlockPool(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.plugins, self.pool)
        self.metrics = MetricsCollector(config.max_num_seqs)
        self.intake = Intake(config, executor, self.plugins, self.scheduler, self.metrics, tokenizer is not None)
        """Requests in (validation, arrival on the clock, refusal) and the table of requests."""
        self._reaper = Reaper(self.scheduler, self.intake, self.metrics, retain_finished)
        self.last_plan_empty = False
        self.last_step_progressed = False
        """Whether the last step computed a token past a request's high-water mark (`max_computed`)."""
        vocab = self.intake.validation_context.get("vocab_size")
        appender = Appender(self.scheduler, self.eos_token_id, config.max_model_len, self.detokenizer)
        self._sample = SamplePhase(self.plugins, self.scheduler, appender, self.eos_token_id,
                                   vocab if isinstance(vocab, int) else None,
                                   getattr(executor, "sample_mode", contextlib.nullcontext))

    # --- requests in (the intake's) -----------------------------------------------------------

    def validate(self, request: Request | dict[str, Any]) -> Request:
        """Validate a request against this engine's limits (a `ValidationError` names the field)."""
        return self.intake.validate(request)

    def add_request(self, request: Request | dict[str, Any]) -> str:
        """Queue a request; returns its id. An invalid request raises `ValidationError`, one that
        a plugin says could never run (the `check_request` hook) raises `RequestRefused`; either
        leaves the engine untouched.

        A request whose `arrival_time` lies ahead of the engine's clock waits until the clock gets
        there (`stream` and `run` move an idle clock to it) before the policies hear of it."""
        return self.intake.add_request(request)

    def length_problem(self, prompt_len: int, max_new_tokens: int, n: int = 1) -> str | None:
        """Why a request of these lengths could never run here, or None (the check of `add_request`
        that needs no tokens: a caller may refuse a huge prompt before making it)."""
        return self.intake.length_problem(prompt_len, max_new_tokens, n)

    def reject(self, request: Any, error: Exception) -> None:
        """Record a request that failed validation, `error` (pydantic's `ValidationError`, or
        another): it counts as `rejected` in the metrics."""
        self.intake.reject(request, error)

    def sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of a request (one, or `n` for parallel sampling)."""
        return self.intake.sequences(request_id)

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state: it is reaped at once (its blocks freed, `on_finished`
        told) and the next step reports its end. False if it is unknown or already finished. (An
        `on_finished` observer's error here is raised by the next step, as if that step had met it.)"""
        seqs = all_sequences(self.intake.requests.get(request_id, ()))
        if all(s.is_finished for s in seqs):  # unknown (no sequences), or every sample ended
            return False
        for seq in seqs:
            self.intake.arrive_now(seq)  # not arrived yet: it arrives, cancelled
        self._reaper.cancel(seqs, self.executor.now())
        return True

    def has_unfinished(self) -> bool:
        """Whether a step has something to do: requests to serve, or ends to report."""
        return bool(self.intake.pending or self._reaper.cancelled) or self.scheduler.has_work()

    @property
    def retain_finished(self) -> bool:
        """Whether ended requests are kept (their tokens) for `sequences()` and `run()`'s answer."""
        return self._reaper.retain_finished

    # --- the loop ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step and return what it produced: the ends of the requests cancelled since the
        last step; the plan (arrivals, budget split, running served, waiting admitted); the
        executor's forward; the sampled tokens appended and checked for stops; the reap of the
        requests that ended. See `_step` for the phases and the observers each calls.

        A `PluginError` of one request (`PluginError.request_id`: a hook called for it alone, or
        its own row of a `sample` answer) fails that request only; the step goes on for the others
        and the error is raised once the step is done. Any other `PluginError` interrupts the step:
        the requests it may have left in doubt end as failed (their blocks freed) before it is
        raised (see `metroline.core.step.recovery`). Either way the engine may be stepped again,
        and the raised error carries the step's outputs (`PluginError.outputs`), the failed
        requests' ends included."""
        outputs: list[RequestOutput] = []
        try:
            self._step(outputs)
        except PluginError as exc:
            exc.outputs = outputs
            raise
        self._raise_request_errors(outputs)
        return outputs

    def advance(self) -> None:
        """Run one step as `step()` does, without making its outputs (a replay reads the metrics)."""
        self._step(None)
        self._raise_request_errors(None)

    def _raise_request_errors(self, outputs: list[RequestOutput] | None) -> None:
        """Raise the first error of one request the step met (the step is done: each failed only
        its request), with the step's outputs; the others are on their requests (`seq.error`)."""
        errors = self.scheduler.request_errors
        if errors:
            first = errors[0]
            errors.clear()
            first.outputs = outputs
            raise first

    def _step(self, outputs: list[RequestOutput] | None) -> None:
        """One step, phase by phase (observers in parentheses)."""
        reaper = self._reaper
        if reaper.cancelled or reaper.error is not None:
            reaper.report_cancelled(outputs)  # ends of requests `abort` reaped since the last step
        now = self.executor.now()
        if self.intake.pending:
            self.intake.release(now)  # submitted requests whose arrival time came join the waiting queue
        plan = self._schedule(now, outputs)  # split, serve running, admit (on_arrival, on_preempted, on_admitted)
        self.last_plan_empty = plan.is_empty
        self.last_step_progressed = False
        if self.last_plan_empty:
            self._end_step(plan, now, outputs)  # (on_step_end: an empty step ends too)
            self._reap_failed(outputs)
            return
        result = self._execute(plan, now, outputs)  # execute: the forward, or failed requests
        if result is None:
            self.scheduler.failed_requests = []  # reaped with the step's: their ends are out
            return
        self.last_step_progressed = self.scheduler.progresses(plan)
        self.scheduler.commit(plan)  # commit: the scheduled sequences advance
        try:
            self._sample(plan, result.logits, result.time, outputs, result)  # sample, append, stop (on_tokens)
        except PluginError as exc:
            self._record_step(plan, result.time, now)
            self._fail_step(exc, recovery.of_plan(plan), result.time, outputs)
            raise
        self._record_step(plan, result.time, now)
        self._end_step(plan, result.time, outputs)  # (on_step_end)
        if self.scheduler.ended:
            reaper.reap()  # reap: the requests that ended leave, their blocks freed (on_finished)
        self._reap_failed(outputs)

    def _reap_failed(self, outputs: list[RequestOutput] | None) -> None:
        """The ends of the requests an error of their own failed in this step (reaped now when the
        step did not reap: an empty one)."""
        failed = self.scheduler.failed_requests
        if failed:
            self.scheduler.failed_requests = []
            if self.scheduler.ended:
                self._reaper.reap()
            output_ended(all_sequences(failed), outputs)

    def _fail_step(self, exc: PluginError, seqs: list[Sequence], now: float,
                   outputs: list[RequestOutput] | None) -> None:
        """A `PluginError` interrupted the step: fail `seqs`, the requests it may have left in doubt
        (`metroline.core.step.recovery`), and output their ends with those of the requests errors
        of their own failed earlier in the step."""
        scheduler = self.scheduler
        failed = all_sequences(scheduler.failed_requests)
        scheduler.failed_requests, scheduler.request_errors = [], []
        output_ended(failed + self._reaper.fail(exc, seqs, now), outputs)

    def _schedule(self, now: float, outputs: list[RequestOutput] | None) -> StepPlan:
        """The scheduler's plan; a `PluginError` fails the requests it may have left in doubt."""
        arrived = self.intake.take_arrived()
        try:
            return self.scheduler.schedule(now)
        except PluginError as exc:
            self._fail_step(exc, recovery.in_flight(self.intake.live(), arrived), now, outputs)
            raise

    def _execute(self, plan: StepPlan, now: float, outputs: list[RequestOutput] | None) -> StepResult | None:
        """Run the plan; when the executor raises, the step's requests fail (their blocks are freed
        now) and the others go on: None."""
        try:
            return self.executor.execute(plan)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            for seq in (*plan.scheduled, *plan.forked, *(s for s in plan.preempted if s.state is SWAPPED)):
                self.scheduler.finish(seq, FinishReason.FAILED, now, error)
            self._record_step(plan, now, now)
            output_ended(self._reaper.reap(), outputs)
            return None

    def _end_step(self, plan: StepPlan, now: float, outputs: list[RequestOutput] | None) -> None:
        hook = self.plugins.hook.on_step_end
        if hook.get_hookimpls():
            try:
                hook(ctx=self.scheduler.ctx, plan=plan)
            except PluginError as exc:
                self._fail_step(exc, recovery.of_plan(plan), now, outputs)
                raise

    def _record_step(self, plan: Any, time: float, start: float) -> None:
        s, pool = self.scheduler, self.pool
        self.metrics.record_step(
            plan, time, time - start, len(s.running), len(s.waiting), len(s.swapped),
            s.num_decoding, pool.num_free_blocks(), pool.num_cached_blocks(), pool.num_used_blocks(),
        )
        self.metrics.record_running(plan, s.running)

    def stream(self, max_idle_steps: int = 1000) -> Iterator[RequestOutput]:
        """Step until every request has ended, yielding outputs as they come (through the one
        driving loop, `metroline.core.step.driving.drive`).

        When a step schedules nothing and a plugin asked to be woken up later (`ctx.wake_at`: a
        token bucket refilling), the clock moves there. Steps without progress (no request
        computed a token past its previous high-water mark: preempting and recomputing do not
        count) raise `NoProgressError`: `max_idle_steps` of them in a row when the last scheduled
        nothing, `max_idle_steps + num_blocks * block_size` otherwise (see
        `metroline.core.step.stall.is_stalled`)."""
        driver = Driver(self, max_idle_steps, outputs=True)
        for _ in drive([driver]):
            yield from driver.last_outputs

    def wake_time(self) -> float | None:
        """When an engine whose last step scheduled nothing has something to do again without a
        new request: the earliest wake-up a plugin asked for (`ctx.wake_at`) or pending arrival
        ahead of the clock (None: none)."""
        now = self.executor.now()
        pending = self.intake.next_arrival()
        ahead = [t for t in (self.scheduler.ctx.wakeup, pending) if t is not None and t > now]
        return min(ahead) if ahead else None

    def idle(self, next_arrival: float | None = None) -> None:
        """After a step that scheduled nothing: move the clock to the earlier of `wake_time()` and
        `next_arrival`, when either lies ahead."""
        t = self.wake_time()
        if next_arrival is not None and next_arrival > self.executor.now() and (t is None or next_arrival < t):
            t = next_arrival
        if t is not None:
            self.executor.idle_until(t)

    def stalled(self, steps: int) -> NoProgressError:
        """The error for `steps` steps in a row without progress while requests wait: names the
        plugins, the oldest stuck requests and why they cannot run (see
        `metroline.core.step.stall`)."""
        return stall_error(self.scheduler, self.pool, self.last_plan_empty, self.plugins.names(), steps)

    def run(self) -> dict[str, list[Sequence]]:
        """Step until every request has ended; returns each request's sequences."""
        for _ in self.stream():
            pass
        return {rid: all_sequences(seqs) for rid, seqs in self.intake.requests.items()}

    def close(self) -> None:
        """Release the executor's resources (a real model's memory and KV blocks)."""
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    def generate(self, requests: Iterable[Request | dict[str, Any]]) -> dict[str, list[Sequence]]:
        """Submit `requests` and run them to completion."""
        for r in requests:
            self.add_request(r)
        return self.run()
