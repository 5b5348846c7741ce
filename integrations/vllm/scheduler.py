"""The scheduler classes vLLM loads with `--scheduler-cls`:

- `metroline.integrations.vllm.MetrolineScheduler`: vLLM's synchronous `Scheduler` (vLLM's
  default where async scheduling is off, as on CPU);
- `metroline.integrations.vllm.MetrolineAsyncScheduler`: vLLM's `AsyncScheduler` (its default
  with `--async-scheduling`, as on GPUs). Each refuses to start under the other mode.

Both run vLLM's own step; metroline's hooks decide through four seams of it, none of which copies
vLLM's code:

- the waiting queue is an `AdmissionQueue` (vLLM's `RequestQueue` interface) whose order is the
  `admission` hook's;
- the running list is put in `order_running`'s order for the step (admission order is restored
  after it);
- the preemption victim: the scheduler runs vLLM's priority branch of the victim choice (the
  branch that may take any running request and gives back the budget of one scheduled earlier in
  the step), and the request `select_victim` names is the one that branch picks: when vLLM's block
  allocation fails for a running request, the bridge marks the victim as the least urgent until
  `_preempt_request` takes it. A running request named as its own victim ends vLLM 0.32's
  running phase for the step (the requests after it in the step's order wait a step); vLLM 0.33
  and metroline's simulator serve them (`Bridge.self_victim_cut` logs it and records the step);
- the step's token budget and chunk cap are `split_budget`'s for the step.

`check_request` is asked in `add_request`; the observers hear of vLLM's events.

A plugin error never reaches vLLM's engine loop: an error of one request fails that request
(`Bridge.fail`), one of no request fails the requests it left in doubt (`_failed_step`, and
`Bridge.observed` for the observers); vLLM ends them as errors at its next output, through its
own path for requests it fails (docs/guide/vllm.md, "When a plugin fails").
"""

from __future__ import annotations

import math
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from metroline.core.errors import PluginError

from .bridge import Bridge
from .kv_view import VllmKVView
from .settings import settings_from_additional_config
from .versions import FIRST_TO_GO_ON_AFTER_SELF_VICTIM, check_vllm_version, parse_version
from .waiting_queue import AdmissionQueue

_LEAST_URGENT = math.inf
"""The priority that makes a running request the one vLLM's priority branch preempts."""


class _MetrolineSchedulerMixin:
    """The bridge's part of both scheduler classes (see the module)."""

    _async = False

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        version = check_vllm_version()
        asynchronous = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
        if asynchronous != self._async:
            want = "MetrolineAsyncScheduler" if asynchronous else "MetrolineScheduler"
            raise RuntimeError(
                f"{type(self).__name__} under {'async' if asynchronous else 'synchronous'} scheduling: "
                f"use --scheduler-cls metroline.integrations.vllm.{want}")
        settings = settings_from_additional_config(getattr(vllm_config, "additional_config", None))
        super().__init__(vllm_config, *args, **kwargs)
        if self.connector is not None:
            raise RuntimeError("metroline.integrations.vllm: a KV connector (--kv-transfer-config) is not supported")
        block_pool = self.kv_cache_manager.block_pool
        kv = VllmKVView(block_pool, self.block_size)
        self.metroline = Bridge(settings.engine_config(vllm_config, kv.num_blocks, self.block_size), kv)
        self.policy = SchedulingPolicy.PRIORITY  # the victim branch that can take any running request
        self.waiting = AdmissionQueue(self.metroline)
        self.waiting.can_admit = lambda: len(self.running) + self.num_waiting_for_streaming_input < self.max_num_active_reqs
        self._victim: Any = None
        self._victim_priority = 0
        stops_at_self_victim = parse_version(version) < FIRST_TO_GO_ON_AFTER_SELF_VICTIM
        allocate = self.kv_cache_manager.allocate_slots

        def allocate_slots(request: Any, *a: Any, **kw: Any) -> Any:
            blocks = allocate(request, *a, **kw)
            if blocks is None and request.status == RequestStatus.RUNNING:
                victim = self.metroline.victim(request)
                if victim is request and stops_at_self_victim and self.running[-1] is not request:
                    self.metroline.self_victim_cut()
                self._mark_victim(victim)
            return blocks

        self.kv_cache_manager.allocate_slots = allocate_slots

    # --- the victim ----------------------------------------------------------------------------

    def _mark_victim(self, victim: Any) -> None:
        self._unmark_victim()
        self._victim, self._victim_priority = victim, victim.priority
        victim.priority = _LEAST_URGENT

    def _unmark_victim(self) -> None:
        if self._victim is not None:
            self._victim.priority = self._victim_priority
            self._victim = None

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        if request is self._victim:
            self._unmark_victim()
        super()._preempt_request(request, *args, **kwargs)
        self.metroline.preempted(request)

    # --- requests in and out -------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        if request.request_id in self.requests:  # a streaming session's next chunk: vLLM's own
            super().add_request(request)
            return
        self.metroline.new_request(request)  # a refused one waits as no candidate until the step ends it
        super().add_request(request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> list[Any]:
        ended = super().finish_requests(request_ids, finished_status)
        bridge = self.metroline
        pairs = [(bridge.seqs[r.request_id], r) for r in ended if r.request_id in bridge.seqs]
        bridge.finished(pairs)
        return ended

    # --- the step ------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        bridge = self.metroline
        self._end_failed()
        try:
            out = self._schedule(*args, **kwargs)
        except PluginError as exc:  # an error of no one request (those of one request failed it alone)
            out = self._failed_step(exc, *args, **kwargs)
        if bridge.failed:
            self._end_failed()
        return out

    def _schedule(self, *args: Any, **kwargs: Any) -> Any:
        bridge = self.metroline
        bridge.begin_step(self.running)
        budget = self.max_num_scheduled_tokens
        sched_config = self.scheduler_config
        threshold = sched_config.long_prefill_token_threshold
        left_out: list[Any] = []
        reordered = False  # vLLM keeps its running list in admission order: only a change is undone
        try:
            if bridge.splits:  # else the defaults' split, which is vLLM's own budget and chunk cap
                split = bridge.split(budget)
                chunk, step_budget = split.max_chunk, split.decode + split.prefill
                if chunk != bridge.default_chunk():
                    sched_config.long_prefill_token_threshold = chunk if chunk < budget else 0
                    if len(self.running) + len(self.waiting) <= 1:  # vLLM applies its threshold to no lone request
                        step_budget = min(step_budget, chunk)
                self.max_num_scheduled_tokens = step_budget
            if self.running:
                if bridge.failed:  # failed requests get no tokens; vLLM ends them at its next output
                    self._leave_out_failed(left_out)
                if self.running and bridge.orders:
                    seqs = bridge.seqs
                    order = bridge.order_running([seqs[r.request_id] for r in self.running])
                    if order is not None:
                        request_of = bridge.request_of
                        ordered = [request_of[s] for s in order]
                        chosen = set(ordered)
                        left_out += [r for r in self.running if r not in chosen]
                        self.running = ordered
                        reordered = True
                    if bridge.failed:  # order_running failed one request alone
                        self._leave_out_failed(left_out)
            self.waiting.open_step()
            try:
                out = super().schedule(*args, **kwargs)
            finally:
                self.waiting.close_step()
        finally:
            if self._victim is not None:
                self._unmark_victim()
            self.max_num_scheduled_tokens = budget
            sched_config.long_prefill_token_threshold = threshold
            if reordered or left_out:
                self._restore_admission_order(left_out)
        bridge.scheduled(out.num_scheduled_tokens)
        return out

    def _leave_out_failed(self, left_out: list[Any]) -> None:
        """Move the running requests that failed from the step's running list to `left_out`."""
        failed = self.metroline.failed
        keep = [r for r in self.running if r.request_id not in failed]
        if len(keep) != len(self.running):
            left_out += [r for r in self.running if r.request_id in failed]
            self.running = keep

    def _failed_step(self, error: PluginError, *args: Any, **kwargs: Any) -> Any:
        """A plugin error of no one request interrupted the step: the requests it may have left in
        doubt fail (every running request, those the step admitted included, and those it
        preempted), and the step schedules nothing more: vLLM's step runs again on an empty
        running list and a closed waiting queue, so that its output carries what vLLM owes the
        workers (the finished and preempted requests), and the next output ends the failed
        requests as errors. Waiting requests that never ran stay queued (those vLLM had popped
        and skipped are put back)."""
        bridge, members = self.metroline, self.waiting
        elsewhere = (RequestStatus.RUNNING, RequestStatus.WAITING_FOR_STREAMING_REQ)
        lost = [r for r in self.requests.values() if not r.is_finished() and r.status not in elsewhere
                and r not in members and r not in self.kv_holding_waiting]
        if lost:  # popped and skipped by the interrupted step, which would have put them back
            members.prepend_requests(lost)
        plan = bridge.plan
        doubt = list(self.running)
        if plan is not None:
            doubt += [bridge.request_of[s] for s in plan.preempted if s in bridge.request_of]
        bridge.fail_in_doubt(error, doubt)
        bridge.plan = None
        running = self.running
        self.running = []
        self.waiting.open_step(closed=True)
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.waiting.close_step()
            self.running = running + self.running
        return out

    def _restore_admission_order(self, left_out: list[Any]) -> None:
        seqs = self.metroline.seqs
        running = self.running + left_out
        keys = [seqs[r.request_id].admitted_seq_no for r in running]
        if any(a > b for a, b in zip(keys, keys[1:])):
            running = [r for _, r in sorted(zip(keys, running), key=lambda kr: kr[0])]
        self.running = running

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        bridge = self.metroline
        bridge.end_step(scheduler_output.num_scheduled_tokens)
        if bridge.failed:
            self._end_failed()
        return outputs

    def _end_failed(self) -> None:
        """Hand vLLM the requests the plugins refused or a plugin error failed: it ends them as
        errors at its next output, through its own path for requests it fails (their blocks
        freed, the client told, finish reason 'error'). A refused request never arrived: it is
        forgotten now; a failed one when vLLM has ended it (`on_finished` hears of it then)."""
        bridge = self.metroline
        if bridge.refused:
            for rid in bridge.refused:
                bridge.forget(rid)
                self.encoder_cache_mismatch_reqs.add(rid)
            bridge.refused.clear()
        if bridge.failed:
            self.encoder_cache_mismatch_reqs.update(bridge.failed)


class MetrolineScheduler(_MetrolineSchedulerMixin, Scheduler):
    """vLLM's synchronous `Scheduler` with metroline's plugins deciding (see the module)."""


class MetrolineAsyncScheduler(_MetrolineSchedulerMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with metroline's plugins deciding (see the module)."""

    _async = True
