"""`Engine`: submit requests, step, stream outputs; the loop around scheduler and executor."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import ValidationError

from ..kv_backends.block_pool import BlockPool
from .config import EngineConfig
from .errors import NoProgressError
from .metrics import MetricsCollector
from .plugins import PluginManager
from .request import Request, engine_limit_problem
from .scheduler import Scheduler
from .sequence import FinishReason, SeqState, Sequence


class RequestOutput:
    """What one step produced for one sequence: its new token, or its end.

    `token_ids` is the whole output so far; `index` tells the samples of an `n > 1` request apart.
    """

    __slots__ = ("seq", "new_token_ids", "finished")

    def __init__(self, seq: Sequence, new_token_ids: list[int], finished: bool) -> None:
        self.seq = seq
        self.new_token_ids = new_token_ids
        self.finished = finished

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def index(self) -> int:
        return self.seq.index

    @property
    def token_ids(self) -> list[int]:
        return self.seq.output_token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.seq.finish_reason

    def __repr__(self) -> str:
        return (
            f"RequestOutput({self.seq.seq_id!r}, new={self.new_token_ids}, finished={self.finished}, "
            f"reason={self.finish_reason})"
        )


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
    `eos_token_id`: the model's end-of-sequence token (default: the executor's `eos_token_id`;
    None: no EOS, as in simulation).
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
            from ..executors.registry import make_executor

            executor = make_executor(executor or "sim")
        self.executor = executor
        bind = getattr(executor, "bind", None)
        if bind is not None:
            bind(config)
        self.eos_token_id = eos_token_id if eos_token_id is not None else getattr(executor, "eos_token_id", None)
        extra = list(plugins)
        if config.debug:
            from .lifecycle_log import LifecycleLog

            extra.insert(0, LifecycleLog())
        self.plugins = PluginManager(config, extra)
        self.pool = BlockPool(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.plugins, self.pool)
        self.metrics = MetricsCollector(config.max_num_seqs)
        self._requests: dict[str, list[Sequence]] = {}
        self.retain_finished = retain_finished
        self._arrivals = 0
        self.last_plan_empty = False
        self._validation_context = {
            "max_model_len": config.max_model_len, "max_kv_tokens": config.max_kv_tokens,
            "max_num_seqs": config.max_num_seqs,
        }
        vocab = getattr(executor, "vocab_size", None)
        if vocab is not None:
            self._validation_context["vocab_size"] = vocab
        model_len = getattr(executor, "max_model_len", None)
        if model_len is not None and model_len < config.max_model_len:
            self._validation_context["max_model_len"] = model_len

    # --- requests ----------------------------------------------------------------------------

    def validate(self, request: Request | dict[str, Any]) -> Request:
        """Validate a request against this engine's limits; raises pydantic's `ValidationError`
        naming the field and the limit."""
        if isinstance(request, Request):
            if engine_limit_problem(request, self._validation_context) is None:
                return request
            request = request.model_dump()  # validate again, for the ValidationError
        return Request.model_validate(request, context=self._validation_context)

    def add_request(self, request: Request | dict[str, Any]) -> str:
        """Queue a request; returns its id. An invalid request raises `ValidationError` and leaves
        the engine untouched."""
        req = self.validate(request)
        if req.request_id in self._requests:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        arrival = req.arrival_time if req.arrival_time is not None else self.executor.now()
        seq = Sequence.from_request(req, arrival, self._arrivals)
        self._arrivals += 1
        self._requests[req.request_id] = [seq]
        self.scheduler.add(seq)
        return req.request_id

    def reject(self, request: Any, error: ValidationError | Exception) -> None:
        """Record a request that failed validation (it counts as `rejected` in the metrics)."""
        get = request.get if isinstance(request, dict) else lambda k, d=None: getattr(request, k, d)
        prompt = get("prompt_token_ids") or ()
        self.metrics.record_rejected(
            str(get("request_id", "?")), str(get("tenant", "default")), int(get("priority", 0) or 0),
            float(get("arrival_time", None) or self.executor.now()), len(prompt), str(error),
        )

    def abort(self, request_id: str) -> bool:
        """Cancel a request in any state; its blocks are freed at the next step. False if it is
        unknown or already finished."""
        seqs = self._all_seqs(self._requests.get(request_id, []))
        if all(s.is_finished for s in seqs):  # unknown (no sequences), or every sample ended
            return False
        now = self.executor.now()
        for seq in seqs:
            self.scheduler.finish(seq, FinishReason.CANCELLED, now)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of a request (one, or `n` for parallel sampling)."""
        return self._all_seqs(self._requests[request_id])

    @staticmethod
    def _all_seqs(seqs: list[Sequence]) -> list[Sequence]:
        return [s for head in seqs for s in (head, *head.children)]

    # --- the loop ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step: reap, schedule, execute, sample, append. Returns what it produced."""
        scheduler = self.scheduler
        outputs = [RequestOutput(s, [], True) for s in self._reap()]
        now = self.executor.now()
        plan = scheduler.schedule(now)
        self.last_plan_empty = plan.is_empty
        if plan.is_empty:
            return outputs
        try:
            result = self.executor.execute(plan)
        except Exception as exc:
            # the step's requests fail (their blocks are freed at the reap); the others go on
            error = f"{type(exc).__name__}: {exc}"
            for seq in (*plan.scheduled, *(s for s in plan.preempted if s.state is SeqState.SWAPPED)):
                scheduler.finish(seq, FinishReason.FAILED, now, error)
            self._record_step(plan, now, now)
            outputs.extend(RequestOutput(s, [], True) for s in self._reap())
            return outputs
        scheduler.commit(plan)
        self._sample(plan, result.logits, result.time, outputs)
        self._record_step(plan, result.time, now)
        scheduler.hook.on_step_end(ctx=scheduler.ctx, plan=plan)
        self._reap()  # those that just finished were reported with their last token
        return outputs

    def _reap(self) -> list[Sequence]:
        ended = self.scheduler.reap()
        for seq in ended:
            self.metrics.record_finished(seq)
        if not self.retain_finished:
            requests = self._requests
            for seq in ended:
                heads = requests.get(seq.request_id)
                if heads is not None and all(s.is_finished for s in self._all_seqs(heads)):
                    del requests[seq.request_id]
        return ended

    def _sample(self, plan: Any, logits: Any, now: float, outputs: list[RequestOutput]) -> None:
        seqs = plan.sample_seqs
        if not seqs:
            return
        scheduler = self.scheduler
        forked: list[Sequence] = []
        for seq in seqs:
            if seq.sampling.n > 1 and seq.index == 0 and not seq.children and seq.num_output_tokens == 0:
                forked.extend(scheduler.fork(seq, seq.sampling.n))
        if forked:
            rows = list(range(len(seqs))) + [seqs.index(c.parent) for c in forked]
            seqs = seqs + forked
            if logits is not None:
                logits = logits[rows] if hasattr(logits, "dim") else [logits[i] for i in rows]
            scheduler.hook.on_admitted(ctx=scheduler.ctx, seqs=forked)
        tokens = scheduler.hook.sample(ctx=scheduler.ctx, seqs=seqs, logits=logits)
        if not isinstance(tokens, list) or len(tokens) != len(seqs):
            got = len(tokens) if isinstance(tokens, list) else type(tokens).__name__
            raise self.plugins.invalid("sample", f"expected a list of {len(seqs)} token ids, got {got}")
        eos, max_len = self.eos_token_id, self.config.max_model_len
        for seq, tok in zip(seqs, tokens):
            seq.token_ids.append(tok)
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = now
                seq.prefill_done_time = now
            p = seq.sampling
            reason = None
            if tok in p.stop_token_ids:
                reason = FinishReason.STOP
            elif tok == eos and not p.ignore_eos:
                reason = FinishReason.EOS
            elif len(seq.token_ids) - seq.num_prompt_tokens >= p.max_new_tokens or len(seq.token_ids) >= max_len:
                reason = FinishReason.LENGTH
            if reason is not None:
                scheduler.finish(seq, reason, now)
            outputs.append(RequestOutput(seq, [tok], reason is not None))
        scheduler.hook.on_tokens(ctx=scheduler.ctx, seqs=seqs)

    def _record_step(self, plan: Any, time: float, start: float) -> None:
        s, pool = self.scheduler, self.pool
        self.metrics.record_step(
            plan, time, time - start, len(s.running), len(s.waiting), len(s.swapped),
            s.num_decoding, pool.num_free_blocks(), pool.num_cached_blocks(), pool.num_used_blocks(),
        )

    def stream(self, max_idle_steps: int = 1000) -> Iterator[RequestOutput]:
        """Step until every request has ended, yielding outputs as they come.

        When a step schedules nothing and a plugin asked to be woken up later (`ctx.wake_at`: a
        token bucket refilling), the clock moves there. `max_idle_steps` empty steps in a row
        raise `NoProgressError`."""
        idle = 0
        while self.has_unfinished():
            yield from self.step()
            if not self.last_plan_empty:
                idle = 0
                continue
            self.idle()
            idle += 1
            if idle >= max_idle_steps:
                raise self.stalled(idle)

    def idle(self, next_arrival: float | None = None) -> None:
        """After a step that scheduled nothing: move the clock to the earlier of the time a plugin
        asked to be woken up (`ctx.wake_at`) and `next_arrival`, when either lies ahead."""
        now = self.executor.now()
        ahead = [t for t in (self.scheduler.ctx.wakeup, next_arrival) if t is not None and t > now]
        if ahead:
            self.executor.idle_until(min(ahead))

    def stalled(self, steps: int) -> NoProgressError:
        """The error for `steps` empty steps in a row while requests wait."""
        s = self.scheduler
        return NoProgressError(
            f"{steps} steps scheduled nothing with {len(s.running)} running, {len(s.waiting)} "
            f"waiting and {len(s.swapped)} swapped requests: check the plugins' admission and "
            f"split_budget ({', '.join(self.plugins.names())})"
        )

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
