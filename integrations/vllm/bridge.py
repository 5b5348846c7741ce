"""`Bridge`: metroline's plugin stack beside one vLLM scheduler.

It keeps what the plugins see (a `StepContext` over mirrored sequences in metroline's three
queues) in step with vLLM's requests, and asks the hooks at the points of vLLM's step where their
decisions are taken (`metroline.integrations.vllm.scheduler` calls it). It owns no KV block and
no request: vLLM does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError
from metroline.core.plugins.budget import Split
from metroline.core.plugins.manager import DEFAULTS_NAME, PluginManager
from metroline.core.plugins.preemption import Preempt
from metroline.core.requests.sequence import FINISHED, RUNNING, FinishReason, Sequence
from metroline.core.step.context import StepContext
from metroline.core.step.plan import StepPlan
from metroline.core.step.scheduler import announce_arrivals

from . import mirror
from .kv_view import VllmKVView
from .support import refuse_unsupported

log = logging.getLogger("vllm.metroline")
"""A child of vLLM's logger, so that vLLM's logging configuration shows it."""

OBSERVERS = ("on_admitted", "on_preempted", "on_tokens", "on_step_end", "on_finished")
"""The observer hooks the bridge calls at its step's events (`on_arrival`: `announce_arrivals`)."""


def defaults_only(caller: Any) -> bool:
    """Whether the built-in defaults are the only implementation of a hook (`caller`: the relay's)."""
    return [i.plugin_name for i in caller.get_hookimpls()] == [DEFAULTS_NAME]


class Bridge:
    """The plugins and their view of one vLLM scheduler's requests.

    `clock` gives `ctx.now` (default `time.time`, the clock of vLLM's `Request.arrival_time`; a
    replay on a simulated clock sets its own)."""

    def __init__(self, config: EngineConfig, kv: VllmKVView, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.plugins = PluginManager(config)
        refuse_unsupported(self.plugins)
        hook = self.plugins.hook
        self.heard = frozenset(name for name in OBSERVERS if getattr(hook, name).get_hookimpls())
        """The observers some plugin implements: the others are not called. Like
        `refuse_unsupported`, read once: the plugins are the config's, loaded when vLLM builds
        its scheduler."""
        self.splits = not defaults_only(hook.split_budget)
        """Whether a plugin splits the budget: the defaults' split is vLLM's own step (its whole
        budget, the config's chunk cap), so without one `split` is not asked."""
        self.orders = not defaults_only(hook.order_running)
        """Whether a plugin orders the running: the defaults' order is admission order, vLLM's."""
        log.info("metroline: policy %r, plugins %s (vLLM's scheduler runs metroline's hooks: %s)", config.policy,
                 config.plugins, ", ".join(self.plugins.names()))
        self.running: dict[Sequence, None] = {}
        self.waiting: dict[Sequence, None] = {}
        self.swapped: dict[Sequence, None] = {}  # always empty: vLLM does not swap
        self.ctx = ctx = StepContext(config, kv, self.running, self.waiting, self.swapped)
        ctx.hook = self.plugins.hook
        self.clock = clock
        self.seqs: dict[str, Sequence] = {}
        self.request_of: dict[Sequence, Any] = {}
        self.arrived: list[Sequence] = []
        self.refused: dict[str, str] = {}
        """Request id -> why: requests refused at `add_request` (`check_request` refused or
        raised, or a bad field) that never arrived; the scheduler ends them as errors."""
        self.failed: dict[str, str] = {}
        """Request id -> the error: requests a plugin error ended after they arrived (an error of
        their own, or one that left them in doubt, `fail`), until vLLM has ended them as errors
        (`finished`, which tells `on_finished`). The scheduler hands them to vLLM and serves them
        no token meanwhile."""
        self.plan: StepPlan | None = None
        self._spare_plan: StepPlan | None = None
        self.admissions = 0
        self.arrivals = 0
        self.self_victim_cuts: list[float] = []
        """The clock (`ctx.now`) of each step whose running phase vLLM ended early at a request the
        plugins named as its own victim (`self_victim_cut`)."""
        self._noted: set[str] = set()

    def note_approximation(self, hook: str, what: str) -> None:
        """Log, once per hook, an answer the bridge serves approximately."""
        if hook not in self._noted:
            self._noted.add(hook)
            log.warning("metroline %s: %s", hook, what)

    # --- requests in ---------------------------------------------------------------------------

    def new_request(self, request: Any) -> str | None:
        """Mirror a new vLLM request; the reason the plugins refuse it (`check_request`), or None
        when it waits. A refused one is recorded in `refused`."""
        self.arrivals += 1
        try:
            seq = mirror.sequence_of(request, self.arrivals)
        except mirror.BadRequestField as exc:
            reason = str(exc)
            seq = None
        else:
            self.seqs[seq.request_id] = seq
            self.request_of[seq] = request
            self.ctx.now = self.clock()
            try:
                reason = self.plugins.refusal(self.ctx, seq)
            except PluginError as exc:  # check_request raised: this request's error alone
                reason = f"PluginError: {exc.for_request(seq.request_id)}"
        if reason is not None:
            log.error("metroline refused request %s: %s", request.request_id, reason)
            self.refused[request.request_id] = reason
            if seq is not None:
                seq.state = FINISHED
                seq.finish_reason = FinishReason.REJECTED
            return reason
        self.waiting[seq] = None
        self.arrived.append(seq)
        return None

    # --- the step ------------------------------------------------------------------------------

    def begin_step(self, running_requests: list[Any]) -> None:
        """A step starts: the clock, the last step's end if vLLM gave no output for it, the
        running sequences' computed tokens, then `on_arrival` for each new request."""
        if self.plan is not None:
            self.end_step([])
        ctx = self.ctx
        ctx.now = self.clock()
        ctx.wakeup = None
        ctx.step += 1
        seqs = self.seqs
        for request in running_requests:
            seqs[request.request_id].num_computed_tokens = request.num_computed_tokens
        self.plan = self._plan(ctx.step)
        if self.arrived:
            arrived, self.arrived = self.arrived, []
            announce_arrivals(self.plugins, ctx, arrived, self._refuse_arrival)

    def _plan(self, step: int) -> StepPlan:
        """The record of the step under way: a new `StepPlan` when `on_step_end` observers get
        it, else one reused (only the bridge reads it: its admitted and preempted sequences)."""
        if "on_step_end" in self.heard:
            return StepPlan(step, self.ctx.block_size)
        plan = self._spare_plan
        if plan is None:
            plan = self._spare_plan = StepPlan(step, self.ctx.block_size)
        else:
            plan.step = step
            plan.admitted.clear()
            plan.preempted.clear()
            plan.sample_seqs = []
        return plan

    def _refuse_arrival(self, seq: Sequence, err: PluginError) -> None:
        """An `on_arrival` error of `seq` alone: its request fails (`fail`)."""
        self.fail(seq, err)

    # --- failures ------------------------------------------------------------------------------

    def fail(self, seq: Sequence, error: PluginError) -> None:
        """End `seq`'s request as failed by `error` (a plugin error of that request alone, or one
        that left it in doubt): logged, taken out of the plugins' queues now, and recorded in
        `failed` for the scheduler, which serves it no more tokens and has vLLM end it as an error
        (its blocks freed, the client told); `on_finished` hears of it then."""
        if seq.state is FINISHED:
            return
        text = f"PluginError: {error}"
        log.error("metroline: request %s failed: %s", seq.request_id, text)
        self.failed[seq.request_id] = text
        self.running.pop(seq, None)
        self.waiting.pop(seq, None)
        seq.state = FINISHED
        seq.finish_reason = FinishReason.FAILED
        seq.error = text

    def failed_request(self, exc: PluginError) -> Sequence | None:
        """The live sequence `exc` is attributed to (`PluginError.request_id`), or None: an error
        of no request, or of one that has ended."""
        rid = exc.request_id
        seq = self.seqs.get(rid) if rid is not None else None
        return seq if seq is not None and seq.state is not FINISHED else None

    def attempt(self, call: Callable[[], Any]) -> Any:
        """`call()` (a hook call); after a `PluginError` of one live request, that request fails
        (`fail`) and the hook is asked again without it. An error of no request is raised."""
        while True:
            try:
                return call()
            except PluginError as exc:
                seq = self.failed_request(exc)
                if seq is None:
                    raise
                self.fail(seq, exc)

    def fail_in_doubt(self, error: PluginError, requests: list[Any]) -> None:
        """A plugin error of no one request interrupted the step: `requests` (vLLM's), those it
        may have left in doubt, fail."""
        log.error("metroline: %s (the step's requests in doubt fail: %d)", error, len(requests))
        seqs = self.seqs
        for request in requests:
            seq = seqs.get(request.request_id)
            if seq is not None:
                self.fail(seq, error)

    def observed(self, call: Callable[[], Any], concerned: Callable[[], list[Sequence]]) -> None:
        """`call()`, an observer hook telling of requests vLLM has already scheduled or ended: a
        `PluginError` fails its own request, or, of no request, the `concerned()` ones (their
        policy may have missed the event); it never reaches vLLM."""
        try:
            call()
        except PluginError as exc:
            seq = self.failed_request(exc)
            if seq is not None:
                self.fail(seq, exc)
                return
            log.error("metroline: %s", exc)
            for seq in concerned():
                self.fail(seq, exc)

    def split(self, budget: int) -> Split:
        """The plugins' split of the step's `budget` (`split_budget`), checked as metroline checks
        it; a part vLLM cannot honour (`max_prefills`, `shares`) is a `PluginError`."""
        running = self.running
        hook = self.plugins.hook

        def ask() -> Any:
            num_decoding = sum(1 for s in running if s.is_decoding)
            return hook.split_budget(ctx=self.ctx, budget=budget, num_decoding=num_decoding,
                                     num_prefilling=len(running) - num_decoding, num_waiting=len(self.waiting))

        answer = self.attempt(ask)
        if not isinstance(answer, tuple) or not 3 <= len(answer) <= 5:
            raise self.plugins.invalid("split_budget", f"expected Split(decode, prefill, max_chunk), got {answer!r}")
        split = Split(*answer)
        if split.decode < 0 or split.prefill < 0 or split.decode + split.prefill > budget or split.max_chunk < 1:
            raise self.plugins.invalid("split_budget", f"{split} is outside the budget of {budget} tokens")
        if split.max_prefills is not None or split.shares:
            raise self.plugins.invalid(
                "split_budget", f"{split}: max_prefills and shares cannot be honoured inside vLLM (one token budget)")
        return split

    def default_chunk(self) -> int:
        """The chunk cap metroline's defaults would give this step (the config's rule)."""
        return self.config.chunk_cap(len(self.running) + len(self.waiting))

    def order_running(self, running: list[Sequence]) -> list[Sequence] | None:
        """The plugins' order of the running (`order_running`); None when it is admission order."""
        hook = self.plugins.hook
        while True:
            try:
                answer = hook.order_running(ctx=self.ctx, running=running)
                break
            except PluginError as exc:  # one request's error: it fails, the others are ordered without it
                seq = self.failed_request(exc)
                if seq is None:
                    raise
                self.fail(seq, exc)
                running = [s for s in running if s.state is not FINISHED]
        if answer is running:
            return None
        order = list(answer)
        seen: set[Sequence] = set()
        for s in order:
            if s not in self.running or s in seen:
                raise self.plugins.invalid(
                    "order_running", f"{s!r} is {'listed twice' if s in seen else 'not running'}")
            seen.add(s)
        if len(order) == len(running) and all(a is b for a, b in zip(order, running)):
            return None
        return order

    def victim(self, request: Any) -> Any:
        """The vLLM request to preempt so that the running `request` gets its blocks
        (`select_victim`, reason "blocks"): the requester itself when the plugins name none."""
        requester = self.seqs[request.request_id]
        hook = self.plugins.hook
        while True:
            try:
                answer = hook.select_victim(ctx=self.ctx, requester=requester, reason="blocks")
                break
            except PluginError as exc:  # one request's error: it fails; the requester's own ends its turn
                seq = self.failed_request(exc)
                if seq is None:
                    raise
                self.fail(seq, exc)
                if seq is requester:
                    return request
        if answer is None:
            return request
        if isinstance(answer, Preempt):
            if answer.mode != "recompute":
                self.note_approximation("select_victim", f"a {answer.mode!r} preemption is served as recompute "
                                        "(vLLM has no swap space)")
            answer = answer.seq
        if answer not in self.running:
            raise self.plugins.invalid("select_victim", f"the victim {answer!r} is not running")
        return self.request_of[answer]

    def self_victim_cut(self) -> None:
        """The plugins named a running request as its own victim with running requests after it
        in the step's order, in a vLLM whose step stops there (0.32): those requests get no tokens
        in this step, where vLLM 0.33 and metroline's simulator serve them. Logged once, recorded
        in `self_victim_cuts`."""
        self.self_victim_cuts.append(self.ctx.now)
        self.note_approximation(
            "select_victim", "a running request named as its own victim ends this vLLM's running phase for "
            "the step: the running requests after it wait a step (vLLM >= 0.33 and metroline's simulator "
            "serve them)")

    def preempted(self, request: Any) -> None:
        """vLLM preempted `request` (recompute): its sequence goes back to waiting."""
        seq = self.seqs[request.request_id]
        self.running.pop(seq, None)
        if seq.state is FINISHED:  # a failed request its own victim: vLLM ends it
            return
        mirror.preempted(seq)
        self.waiting[seq] = None
        if self.plan is not None:
            self.plan.preempted.append(seq)
            self.plan.scheduled.pop(seq, None)

    def settle_popped(self, popped: list[Any]) -> None:
        """The requests vLLM popped from the waiting queue that it admitted (status RUNNING) now
        run, in the order admitted (skipped ones wait on); `popped` is emptied."""
        if not popped:
            return
        for request in popped:
            if request.status.name != "RUNNING":
                continue
            seq = self.seqs[request.request_id]
            if seq.state is RUNNING:
                continue
            self.waiting.pop(seq, None)
            seq.state = RUNNING
            seq.num_computed_tokens = request.num_computed_tokens  # its prefix cache hit (or KV loaded)
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = min(request.num_computed_tokens, seq.num_prompt_tokens)
            self.running[seq] = None
            self.admissions += 1
            seq.admitted_seq_no = self.admissions
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = self.ctx.now
            if self.plan is not None:
                self.plan.admitted.append(seq)
        popped.clear()

    def scheduled(self, num_scheduled_tokens: dict[str, int]) -> None:
        """The step's schedule is out: its plan, then `on_admitted` and `on_preempted`."""
        plan, seqs = self.plan, self.seqs
        heard = self.heard
        if "on_step_end" in heard:  # the plan's schedule is for its observers
            scheduled = plan.scheduled
            for rid, n in num_scheduled_tokens.items():
                scheduled[seqs[rid]] = n
        for seq in plan.admitted:  # vLLM advanced them past the step's tokens already: their hit, as before
            seq.num_computed_tokens = (self.request_of[seq].num_computed_tokens
                                       - num_scheduled_tokens.get(seq.request_id, 0))
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
        hook = self.plugins.hook
        if plan.admitted and "on_admitted" in heard:
            admitted = list(plan.admitted)
            self.observed(lambda: hook.on_admitted(ctx=self.ctx, seqs=admitted), lambda: admitted)
        if plan.preempted and "on_preempted" in heard:
            preempted = list(plan.preempted)
            self.observed(lambda: hook.on_preempted(ctx=self.ctx, seqs=preempted), lambda: preempted)

    def end_step(self, request_ids: Iterable[str]) -> None:
        """vLLM's output for the step: the scheduled requests' (`request_ids`) new tokens
        (`on_tokens`), the step's end (`on_step_end`), then the requests that ended (`on_finished`)."""
        plan, self.plan = self.plan, None
        if plan is None:
            return
        seqs, request_of, ctx = self.seqs, self.request_of, self.ctx
        got, ended = [], []
        catch_up = mirror.catch_up
        for rid in request_ids:
            seq = seqs.get(rid)
            if seq is None:
                continue
            request = request_of.get(seq)
            if request is None:
                continue
            if seq.state is FINISHED:  # failed: ended here if vLLM ended it first (a stop in this step)
                if request.is_finished():
                    ended.append((seq, request))
                continue
            if catch_up(seq, request):
                got.append(seq)
                if seq.first_token_time is None:
                    seq.first_token_time = ctx.now
            seq.num_computed_tokens = request.num_computed_tokens
            if request.is_finished():
                ended.append((seq, request))
        plan.sample_seqs = got
        hook, heard = self.plugins.hook, self.heard
        if got and "on_tokens" in heard:
            self.observed(lambda: hook.on_tokens(ctx=ctx, seqs=got), lambda: got)
        if "on_step_end" in heard:
            self.observed(lambda: hook.on_step_end(ctx=ctx, plan=plan), lambda: planned(plan))
        if ended:
            self.finished(ended)

    def finished(self, ended: list[tuple[Sequence, Any]]) -> None:
        """vLLM ended these (sequence, request) pairs: they leave the queues, then `on_finished`."""
        seqs = []
        for seq, request in ended:
            if seq.state is FINISHED and seq not in self.request_of:
                continue
            self.running.pop(seq, None)
            self.waiting.pop(seq, None)
            seq.state = FINISHED
            seq.finish_reason = finish_reason(request)
            seq.finish_time = self.ctx.now
            self.request_of.pop(seq, None)
            self.seqs.pop(seq.request_id, None)
            self.failed.pop(seq.request_id, None)
            seqs.append(seq)
        if seqs and "on_finished" in self.heard:
            self.observed(lambda: self.plugins.hook.on_finished(ctx=self.ctx, seqs=seqs), list)

    def forget(self, request_id: str) -> None:
        """A refused or failed request is done with (it never ran)."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.request_of.pop(seq, None)
            self.waiting.pop(seq, None)


def planned(plan: StepPlan) -> list[Sequence]:
    """The live sequences of a step's plan (scheduled, admitted, preempted): those an
    `on_step_end` error leaves in doubt."""
    return [s for s in dict.fromkeys([*plan.scheduled, *plan.admitted, *plan.preempted]) if s.state is not FINISHED]


def finish_reason(request: Any) -> FinishReason:
    """metroline's finish reason for a finished vLLM request."""
    name = request.status.name
    if name == "FINISHED_LENGTH_CAPPED":
        return FinishReason.LENGTH
    if name == "FINISHED_ABORTED":
        return FinishReason.CANCELLED
    if name in ("FINISHED_ERROR", "FINISHED_IGNORED"):
        return FinishReason.FAILED
    return FinishReason.STOP if getattr(request, "stop_reason", None) is not None else FinishReason.EOS


__all__ = ["Bridge", "finish_reason"]
