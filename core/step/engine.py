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
from ..requests.request import STRUCTURED_OUTPUT_PLUGIN, Request
from ..requests.sequence import SWAPPED, FinishReason, Sequence
from ..results.metrics import MetricsCollector
from . import recovery
from .driving import Driver, drive
from .intake import Intake, validation_context
from .outputs import Appender, RequestOutput
from .plan import StepPlan, StepResult
from .sample import SamplePhase
from .scheduler import Scheduler
from .stall import stall_error

__all__ = ["Engine", "RequestOutput"]


class Engine(Intake):
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
        self._check_request = bool(self.plugins.hook.check_request.get_hookimpls())
        self.pool = BlockPool(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.plugins, self.pool)
        self.metrics = MetricsCollector(config.max_num_seqs)
        self._requests: dict[str, list[Sequence]] = {}
        self.retain_finished = retain_finished
        self._arrivals = 0
        self._pending: list[tuple[float, int, Sequence]] = []  # submitted with a future arrival_time
        self._arrived: list[Sequence] = []  # queued since the last schedule (for recovery)
        self._cancelled: list[Sequence] = []  # reaped by `abort`, their ends not reported yet
        self._reap_error: PluginError | None = None  # an `on_finished` error met by `abort`
        self.last_plan_empty = False
        self.last_step_progressed = False
        """Whether the last step computed a token past a request's high-water mark (`max_computed`)."""
        self._validation_context = validation_context(config, executor, tokenizer is not None)
        self._validation_context["structured_output"] = self.plugins.get(STRUCTURED_OUTPUT_PLUGIN) is not None
        vocab = self._validation_context.get("vocab_size")
        appender = Appender(self.scheduler, self.eos_token_id, config.max_model_len, self.detokenizer)
        self._sample = SamplePhase(self.plugins, self.scheduler, appender, self.eos_token_id,
                                   vocab if isinstance(vocab, int) else None,
                                   getattr(executor, "sample_mode", contextlib.nullcontext))

    # --- the loop ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step and return what it produced: the ends of the requests cancelled since the
        last step; the plan (arrivals, budget split, running served, waiting admitted); the
        executor's forward; the sampled tokens appended and checked for stops; the reap of the
        requests that ended. See `_step` for the phases and the observers each calls.

        A `PluginError` ends the step's requests as failed (their blocks freed) before it is
        raised, so the engine may be stepped again (see `metroline.core.step.recovery`)."""
        outputs: list[RequestOutput] = []
        self._step(outputs)
        return outputs

    def advance(self) -> None:
        """Run one step as `step()` does, without making its outputs (a replay reads the metrics)."""
        self._step(None)

    def _step(self, outputs: list[RequestOutput] | None) -> None:
        """One step, phase by phase (observers in parentheses)."""
        if self._cancelled or self._reap_error is not None:
            self._report_cancelled(outputs)  # ends of requests `abort` reaped since the last step
        now = self.executor.now()
        if self._pending:
            self._release_arrivals(now)  # submitted requests whose arrival time came join the waiting queue
        plan = self._schedule(now)  # split, serve running, admit (on_arrival, on_preempted, on_admitted)
        self.last_plan_empty = plan.is_empty
        self.last_step_progressed = False
        if self.last_plan_empty:
            self._end_step(plan, now)  # (on_step_end: an empty step ends too)
            return
        result = self._execute(plan, now, outputs)  # execute: the forward, or failed requests
        if result is None:
            return
        self.last_step_progressed = self.scheduler.progresses(plan)
        self.scheduler.commit(plan)  # commit: the scheduled sequences advance
        try:
            self._sample(plan, result.logits, result.time, outputs, result)  # sample, append, stop (on_tokens)
        except PluginError as exc:
            self._record_step(plan, result.time, now)
            self._reap_after(exc, recovery.of_plan(plan), result.time)
            raise
        self._record_step(plan, result.time, now)
        self._end_step(plan, result.time)  # (on_step_end)
        if self.scheduler.ended:
            self._reap()  # reap: the requests that ended leave, their blocks freed (on_finished)

    def _report_cancelled(self, outputs: list[RequestOutput] | None) -> None:
        cancelled, self._cancelled = self._cancelled, []
        self._output_ended(cancelled, outputs)
        if self._reap_error is not None:
            error, self._reap_error = self._reap_error, None
            raise error

    def _schedule(self, now: float) -> StepPlan:
        """The scheduler's plan; a `PluginError` fails the requests it may have left in doubt."""
        arrived, self._arrived = self._arrived, []
        try:
            return self.scheduler.schedule(now)
        except PluginError as exc:
            live = (s for seqs in list(self._requests.values()) for s in self._all_seqs(seqs))
            self._reap_after(exc, recovery.in_flight(live, arrived), now)
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
            self._output_ended(self._reap(), outputs)
            return None

    def _end_step(self, plan: StepPlan, now: float) -> None:
        hook = self.plugins.hook.on_step_end
        if hook.get_hookimpls():
            try:
                hook(ctx=self.scheduler.ctx, plan=plan)
            except PluginError as exc:
                self._reap_after(exc, recovery.of_plan(plan), now)
                raise

    def _output_ended(self, ended: list[Sequence], outputs: list[RequestOutput] | None) -> None:
        if outputs is not None and ended:
            outputs.extend(RequestOutput(s, [], True) for s in ended)

    def _reap_after(self, error: PluginError, seqs: Iterable[Sequence], now: float) -> None:
        """Fail `seqs` (the requests a `PluginError` interrupted) and free their blocks now."""
        recovery.fail(self.scheduler, seqs, now, f"PluginError: {error}")
        self._reap()

    def _reap(self) -> list[Sequence]:
        ending = recovery.ending(self.scheduler)
        try:
            ended = self.scheduler.reap()
        except PluginError:
            self._forget(ending)  # they were freed; only an on_finished observer failed
            raise
        self._forget(ended)
        return ended

    def _forget(self, ended: list[Sequence]) -> None:
        for seq in ended:
            self.metrics.record_finished(seq)
        if not self.retain_finished:
            requests = self._requests
            for seq in ended:
                heads = requests.get(seq.request_id)
                if heads is not None and all(s.is_finished for s in self._all_seqs(heads)):
                    del requests[seq.request_id]

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
        pending = self._pending[0][0] if self._pending else None
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
        return {rid: self._all_seqs(seqs) for rid, seqs in self._requests.items()}

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
