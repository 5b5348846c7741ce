"""The conformance suite's checks of one run: an executor that checks every plan before it runs,
the per-step bounds on hook calls, the drained engine (no request lost, every block back) and a
run's fingerprint for the determinism check (`metroline.testing.check_plugin` calls these)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...executors.cost_models import make_cost_model
from ...executors.simulated import SimulatedExecutor
from ..config import EngineConfig
from ..experiments.runner import replay, result_of
from ..requests.sequence import FinishReason, SeqState
from ..step.engine import Engine
from ..step.intake import all_sequences
from ..step.victim_loop import REFUSALS_PER_STEP
from ..workloads.build import Workload
from .hook_coverage import watch
from .kv_leaks import kv_leaks

PER_STEP_LIMITS: dict[str, int] = {
    "admission": 1,
    "split_budget": 1,
    "order_running": 1,
    "sample": 1,
    "on_admitted": 2,  # the step's admissions, and the siblings forked for n > 1
    "on_preempted": 1,
    "on_tokens": 1,
    "on_finished": 2,  # ended before the step (cancelled) and during it
    "on_step_end": 1,
}
"""How many times each hook may be called in one step. `select_victim` may be called once per
preemption or refusal (at most `REFUSALS_PER_STEP` for blocks and one for slots, whatever the
queue's length), so its bound is `2 * max_num_seqs + REFUSALS_PER_STEP + 1`. `on_arrival` is called
once per request that arrived (so that an error it raises is that request's alone): as many times
as the step's arrivals, which no limit here bounds."""


class CheckingExecutor:
    """Wraps the simulated executor and checks every plan before it runs."""

    def __init__(self, inner: Any, failures: list[str]) -> None:
        self.inner = inner
        self.failures = failures
        self.engine: Any = None
        self.name = inner.name

    def now(self) -> float:
        return self.inner.now()

    def bind(self, config: Any) -> None:
        self.inner.bind(config)

    def idle_until(self, t: float) -> None:
        self.inner.idle_until(t)

    def describe(self) -> dict:
        return self.inner.describe()

    def _fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)

    def execute(self, plan: Any) -> Any:
        engine = self.engine
        config, scheduler = engine.config, engine.scheduler
        step = plan.step
        if plan.num_tokens > config.max_num_batched_tokens:
            self._fail(f"step {step}: {plan.num_tokens} tokens > max_num_batched_tokens {config.max_num_batched_tokens}")
        if len(scheduler.running) > config.max_num_seqs:
            self._fail(f"step {step}: {len(scheduler.running)} running > max_num_seqs {config.max_num_seqs}")
        for seq, n in plan.scheduled.items():
            if seq.state is not SeqState.RUNNING or seq not in scheduler.running:
                self._fail(f"step {step}: scheduled {seq!r} is not running")
            drafts = plan.drafts.get(seq, 0) if plan.drafts else 0
            if n < 1 or seq.num_computed_tokens + n - drafts > len(seq.token_ids):
                self._fail(f"step {step}: {seq!r} scheduled {n} tokens beyond its known tokens")
            if drafts and (n != 1 + drafts or not seq.is_decoding
                           or drafts > config.speculative_config.num_speculative_tokens):
                self._fail(f"step {step}: {seq!r} carries {drafts} drafts in {n} tokens")
        try:
            engine.pool.check_invariants([s.block_table for s in scheduler.running])
        except AssertionError as exc:
            self._fail(f"step {step}: KV invariant: {exc}")
        return self.inner.execute(plan)


def run_once(
    workload: Workload, config: EngineConfig, extra: list[Any], failures: list[str],
    coverage: dict[str, HookCoverage] | None = None,
) -> tuple[dict[str, Any], Any, Counter]:
    executor = CheckingExecutor(SimulatedExecutor(make_cost_model("steps")), failures)
    engine = Engine(config, executor, plugins=extra)
    executor.engine = engine
    if coverage is not None:  # the plugin under test is the last registered: the highest precedence
        watch(engine, engine.plugins.describe()[0][0], coverage)
    calls: Counter = Counter()

    def before(hook_name: str, impls: Any, kwargs: dict) -> None:
        ctx = kwargs.get("ctx")
        calls[(hook_name, ctx.step if ctx is not None else -1)] += 1

    def after(outcome: Any, hook_name: str, impls: Any, kwargs: dict) -> None:
        pass

    engine.plugins.monitor(before, after)
    wall_s = replay(engine, workload)
    return result_of(engine, workload, wall_s), engine, calls


def check_drained(engine: Any, label: str, failures: list[str]) -> None:
    failures.extend(f"{label}: after every request ended: {leak}" for leak in kv_leaks(engine))
    for rid, seqs in engine.intake.requests.items():
        for seq in all_sequences(seqs):
            if seq.finish_reason is None:
                failures.append(f"{label}: request {seq.seq_id} never ended (state {seq.state.name})")
            elif seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens != seq.sampling.max_new_tokens:
                failures.append(
                    f"{label}: request {seq.seq_id} ended for length with {seq.num_output_tokens} "
                    f"of {seq.sampling.max_new_tokens} tokens"
                )
            elif seq.finish_reason not in (FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP):
                failures.append(f"{label}: request {seq.seq_id} ended {seq.finish_reason} ({seq.error})")


def check_calls(calls: Counter, config: EngineConfig, label: str, failures: list[str]) -> None:
    limits = dict(PER_STEP_LIMITS, select_victim=2 * config.max_num_seqs + REFUSALS_PER_STEP + 1)
    spec = config.speculative_config
    if spec is not None:  # sample: once more per position of accepted drafts
        limits.update(num_draft_tokens=1, sample=1 + spec.num_speculative_tokens)
    worst: dict[str, tuple[int, int]] = {}
    for (hook, step), n in calls.items():
        if n > worst.get(hook, (0, 0))[0]:
            worst[hook] = (n, step)
    for hook, (n, step) in sorted(worst.items()):
        limit = limits.get(hook)
        if limit is not None and n > limit:
            failures.append(f"{label}: hook {hook} called {n} times in step {step} (limit {limit})")


def fingerprint(engine: Any) -> tuple:
    requests = tuple(r[:-1] for r in sorted(engine.metrics.requests))  # all but the error text
    steps = tuple(engine.metrics.steps)
    return requests, steps
