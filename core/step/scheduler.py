"""The scheduler: one `schedule()` per step turns the queues into a `StepPlan`.

It decides and never touches tensors; policy comes from the plugins' hooks, blocks from the
`BlockPool`. `schedule` reads like the step, phase by phase: each phase is a function
or a small object of this package that receives what it uses, and the step's scratch state lives
in one `StepState` that dies with the step:

- `metroline.core.step.split.split_budget`: the budget split (`split_budget`);
- `metroline.core.step.running.serve_running`: the running sequences (`order_running`);
- `metroline.core.step.admission.Admission`: the waiting and swapped ones (`admission`), with the
  tenants' reserves (`metroline.core.step.reserves`);
- `metroline.core.step.victim_loop.VictimLoop`: preemption when slots or blocks run out
  (`select_victim`);
- `metroline.core.step.rescue.Rescue`: the core's own progress rescue;
- `metroline.core.step.forking`: the samples of `n > 1` requests.

The long-lived state is the `Queues` (running, waiting, swapped), the pool, the swap space and the
`StepPrefix` (the blocks registered in the step under way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...kv_backends.block_pool import BlockPool
from ...kv_backends.swap_space import SwapSpace
from ..config import EngineConfig
from ..errors import PluginError
from ..plugins.manager import PluginManager
from ..requests.sequence import FINISHED, FinishReason, Sequence
from .admission import Admission
from .context import StepContext
from .forking import forks_now, make_children
from .plan import StepPlan
from .queues import Queues
from .rescue import Rescue
from .reserves import release_reserves
from .running import serve_running
from .split import split_budget
from .speculation import Speculation
from .step_prefix import StepPrefix
from .step_state import StepState
from .victim_loop import VictimLoop



def announce_arrivals(plugins: Any, ctx: Any, arrived: list, failed: Callable[[Any, PluginError], None]) -> None:
    """Tell `on_arrival` of `arrived`, one request at a time, so that an error is that request's
    alone: `failed(seq, error)` gets the error named for its request (the vLLM bridge's step, too)."""
    on_arrival = plugins.hook.on_arrival
    if on_arrival.get_hookimpls():
        for seq in arrived:
            try:
                on_arrival(ctx=ctx, seqs=[seq])
            except PluginError as exc:
                failed(seq, exc.for_request(seq.request_id))

class Scheduler:
    """Owns the queues (`running`, `waiting`, `swapped`) and the step's decisions."""

    def __init__(self, config: EngineConfig, plugins: PluginManager, pool: BlockPool) -> None:
        self.config = config
        self.plugins = plugins
        self.pool = pool
        self.swap = SwapSpace(config.swap_space_blocks) if config.swap_space_blocks else None
        self.queues = queues = Queues()
        self.running, self.waiting, self.swapped = queues.running, queues.waiting, queues.swapped
        self.ctx = ctx = StepContext(config, pool, self.running, self.waiting, self.swapped)
        ctx.hook = plugins.hook
        self.prefix = StepPrefix(pool)
        pool.partial_match = config.prefix_match == "token"
        self.room = VictimLoop(config, plugins, ctx, queues, pool, self.swap, self.prefix)
        self.admission = Admission(config, plugins, ctx, queues, pool, self.swap, self.prefix, self.room)
        self.rescue = Rescue(config, ctx, queues, self.room, self.admission)
        self.ended: list[Sequence] = []
        """Sequences `finish` ended whose blocks the next `reap()` frees."""
        self.failed_requests: list[Sequence] = []
        """The sequences `fail_request` ended in the step under way (the engine outputs their end)."""
        self.request_errors: list[PluginError] = []
        """The errors of one request each met in the step under way (`fail_request`)."""
        self._arrived: list[Sequence] = []
        self._budget = config.max_num_batched_tokens
        self._forking = False  # a request with n > 1 arrived: look for parents to fork
        self.num_decoding = 0
        self.total_preemptions = 0
        self.last_offered = False
        spec = config.speculative_config
        self.speculation = (Speculation(spec, plugins, config.max_model_len, config.speculative_scheduling == "vllm")
                            if spec is not None else None)
        self.admission.speculation = self.speculation

    @property
    def rescues(self) -> int:
        """How many steps the core's rescue served (`metroline.core.step.rescue`)."""
        return self.rescue.rescues

    # --- requests in and out -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """A new sequence joins the waiting queue (policies hear of it at the next step)."""
        self.waiting[seq] = None
        self._arrived.append(seq)
        if seq.sampling.n > 1:
            self._forking = True

    def finish(self, seq: Sequence, reason: FinishReason, now: float, error: str | None = None) -> None:
        """End `seq` in any state; its blocks are released by the next `reap()`."""
        if seq.state is FINISHED:
            return
        seq.state = FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        seq.error = error
        self.ended.append(seq)

    def fail_request(self, seq: Sequence, error: PluginError, now: float) -> None:
        """End `seq`'s request as failed by `error`, an error of that request alone (raised by a
        hook called for it only, before anything of the step was decided: its arrival); the step
        goes on for the others. Its blocks are released by the next `reap()`; the engine raises
        `error` once the step is done (`request_errors`)."""
        for s in (seq, *seq.children):
            self.finish(s, FinishReason.FAILED, now, f"PluginError: {error}")
        self.failed_requests.append(seq)
        self.request_errors.append(error)

    def reap(self) -> list[Sequence]:
        """Take ended sequences out of the queues and release the blocks of those that were running
        or swapped: the one place an ended request's blocks are freed (a failed one holding blocks
        outside those sets gave them back in `recovery.fail`; preemption, admission, copy-on-write
        and speculation release blocks of live requests: docs/architecture.md, "Where blocks are
        released"). Returns them (and tells the `on_finished` observers)."""
        if not self.ended:
            return []
        ended, self.ended = self.ended, []
        for seq in ended:
            if seq in self.running:
                self.queues.stop_running(seq)
                self.pool.release(seq.block_table)
                if seq.finish_reason is FinishReason.FAILED:
                    self.prefix.unregister(seq)  # its step did not run: the blocks hold no KV
            elif seq in self.swapped:
                del self.swapped[seq]
                self.swap.free(seq.host_table)
            else:
                self.waiting.pop(seq, None)
            seq.block_table = []
            seq.host_table = []
        self.plugins.hook.on_finished(ctx=self.ctx, seqs=ended)
        return ended

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self.ended)

    # --- the step ------------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """The step's plan: new arrivals are announced, the budget is split, the running sequences
        are served (preempting victims when blocks run out), the waiting and swapped ones admitted;
        the core rescues a step the plugins left empty; the plan is sealed, parents of `n > 1`
        requests fork, and the step's admissions and victims are announced."""
        step = self._start_step(now)  # on_arrival
        self.num_decoding = split_budget(self.plugins, self.ctx, self.queues, self._budget, step)  # split_budget
        plan = step.plan
        if self.speculation is not None and self.running:
            self.speculation.decide(self, step)  # num_draft_tokens
        step.offered = bool(self.running)
        if self.running:
            serve_running(self.plugins, self.ctx, self.running, self.pool, self.room, step,
                          self.speculation)  # order_running, select_victim
        if (self.waiting or self.swapped) and (self.admission.admit_after_preemption or not plan.preempted):
            step.announce_preempted()  # the victims are back in their queues, in their place
            self.admission.admit(step)  # admission, select_victim
        if step.reserves is not None and step.reserves.cut:
            release_reserves(step, self.pool, self.prefix)  # admission did not run, or not to the end
        if not plan.scheduled and step.offered and self.ctx.wakeup is None:
            self.rescue.serve(step)  # the plugins wanted something served; none asked to wait
        self.last_offered = step.offered
        step.seal()
        if self._forking:
            self._fork_samples(plan)
        if plan.admitted or plan.forked:
            self.plugins.hook.on_admitted(ctx=self.ctx, seqs=plan.admitted + plan.forked)
        step.announce_preempted()  # on_preempted: the victims not announced yet
        self.total_preemptions += len(plan.preempted)
        return plan

    def _start_step(self, now: float) -> StepState:
        ctx = self.ctx
        ctx.now = now
        ctx.wakeup = None
        ctx.step += 1
        if self._arrived:
            arrived, self._arrived = self._arrived, []
            announce_arrivals(self.plugins, ctx, arrived, lambda seq, err: self.fail_request(seq, err, now))
        self.prefix.new_step()  # last step's registrations: their KV is written now
        plan = StepPlan(ctx.step, self.pool.block_size)
        return StepState(plan, ctx, self.prefix if self.config.enable_prefix_caching else None,
                         self.config.budget_mode == "one")

    # --- after the executor ran ----------------------------------------------------------------

    def commit(self, plan: StepPlan) -> None:
        """Advance each scheduled sequence past the tokens the step computed. (The blocks that
        became full were indexed when they were scheduled.)"""
        for seq, n in plan.scheduled.items():
            seq.num_computed_tokens += n

    @staticmethod
    def progresses(plan: StepPlan) -> bool:
        """Whether `plan` (not yet committed) makes progress: it samples a token, or computes a
        token past the most a sequence ever had computed before a preemption (`max_computed`,
        kept at preemptions). Recomputing what a preemption lost is not progress."""
        if plan.sample_seqs:
            return True
        for seq, n in plan.scheduled.items():
            if seq.num_computed_tokens + n > seq.max_computed:
                return True
        return False

    def _fork_samples(self, plan: StepPlan) -> None:
        """The parents that sample their first token in this step fork: their samples join
        `plan.forked`, each with its parent's row in `plan.fork_rows`."""
        for row, seq in enumerate(plan.sample_seqs):
            if forks_now(seq):
                children = self.fork(seq)
                plan.forked += children
                plan.fork_rows += [row] * len(children)

    def fork(self, parent: Sequence) -> list[Sequence]:
        """Make the samples of `parent` (parallel sampling) in the step that computes its prompt:
        they run from now on, sharing every block of it (see `metroline.core.step.forking`)."""
        children = make_children(parent, self.pool)
        self.queues.forked(parent, children)
        return children
