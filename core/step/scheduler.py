"""The scheduler: one `schedule()` per step turns the queues into a `StepPlan`.

It decides and never touches tensors; policy comes from the plugins' hooks, blocks from the
`BlockPool`. See DESIGN.md, "One step", for the order of the phases. The phases live in one file
each: admission (`admission.py`), the victim loop (`victim_loop.py`), the rescue (`rescue.py`), the
blocks registered in this step (`step_prefix.py`), forking (`forking.py`), the tenants' reserved
shares of the budget (`shares.py`).
"""

from __future__ import annotations

from ...kv_backends.block_pool import BlockPool
from ...kv_backends.swap_space import SwapSpace
from ..config import EngineConfig
from ..plugins.budget import Split
from ..plugins.manager import PluginManager
from ..plugins.shares import ReservedAdmission, Reserves
from ..requests.sequence import FINISHED, RUNNING, FinishReason, Sequence
from .admission import Admission
from .context import StepContext
from .forking import forks_now, make_children, unforked
from .plan import StepPlan
from .rescue import Rescue
from .speculation import Speculation
from .step_prefix import StepPrefix
from .victim_loop import VictimLoop


class Scheduler(Admission, ReservedAdmission, VictimLoop, Rescue):
    """Owns the queues (`running`, `waiting`, `swapped`) and the step's decisions."""

    def __init__(self, config: EngineConfig, plugins: PluginManager, pool: BlockPool) -> None:
        self.config = config
        self.plugins = plugins
        self.pool = pool
        self.swap = SwapSpace(config.swap_space_blocks) if config.swap_space_blocks else None
        self.running: dict[Sequence, None] = {}
        self.waiting: dict[Sequence, None] = {}
        self.swapped: dict[Sequence, None] = {}
        self.ctx = StepContext(config, pool, self.running, self.waiting, self.swapped)
        self.ctx.hook = plugins.hook
        self.prefix = StepPrefix(pool)
        pool.partial_match = config.prefix_match == "token"
        self._arrived: list[Sequence] = []
        self._ended: list[Sequence] = []
        self._admissions = 0
        self._fork_slots = 0  # slots held for the children of running parents not forked yet
        self._budget = config.max_num_batched_tokens
        self._forking = False  # a request with n > 1 arrived: look for parents to fork
        self._admit_after_preemption = config.admit_after_preemption
        self._full_prompt_gate = config.admission_gate == "full_prompt"
        self._caching = config.enable_prefix_caching
        self._notified = 0  # how many of the step's preempted sequences `on_preempted` heard of
        self._pulls_left = 0  # admission candidates the scheduler may still pull in this step
        self._offered = False  # this step's plugins asked for something to be served
        self._rescuing = False  # the core serves the oldest request itself (see `Rescue`)
        self._reserves: Reserves | None = None  # the step's per-tenant reserves (`Split.shares`)
        self._new_step_refusals()  # the policy's refusals to make room for candidates (`VictimLoop`)
        self.num_decoding = 0
        self.total_preemptions = 0
        self.rescues = 0
        self.last_offered = False
        spec = config.speculative_config
        self.speculation = Speculation(spec, plugins) if spec is not None else None

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
        self._ended.append(seq)

    def reap(self) -> list[Sequence]:
        """Take ended sequences out of the queues and release their blocks: the one place where a
        request's blocks are freed. Returns them (and tells the `on_finished` observers)."""
        if not self._ended:
            return []
        ended, self._ended = self._ended, []
        for seq in ended:
            if seq in self.running:
                del self.running[seq]
                self._fork_slots -= unforked(seq)
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
        return bool(self.running or self.waiting or self.swapped or self._ended)

    # --- the step ------------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """The step's plan: new arrivals are announced, the budget is split, the running sequences
        are served (preempting victims when blocks run out), the waiting and swapped ones admitted;
        the core rescues a step the plugins left empty; the plan is sealed, parents of `n > 1`
        requests fork, and the step's admissions and victims are announced."""
        plan = self._start_step(now)  # on_arrival
        max_chunk = self._split(plan)  # split_budget
        if self.speculation is not None and self.running:
            self.speculation.decide(self, plan)  # num_draft_tokens
        self._offered = bool(self.running)
        if self.running:
            self._serve_running(plan, max_chunk)  # order_running, select_victim
        if (self.waiting or self.swapped) and (self._admit_after_preemption or not plan.preempted):
            self._notify_preempted(plan)  # the victims are back in their queues, in their place
            self._admit(plan, max_chunk)  # admission, select_victim
        if self._reserves is not None and self._reserves.cut:
            self._release_reserves(plan, max_chunk)  # admission did not run, or not to the end
        if self._needs_rescue(plan):
            self._rescue(plan)
        self.last_offered = self._offered
        plan.seal()
        if self._forking:
            self._fork_samples(plan)
        if plan.admitted or plan.forked:
            self.plugins.hook.on_admitted(ctx=self.ctx, seqs=plan.admitted + plan.forked)
        self._notify_preempted(plan)  # on_preempted: the victims not announced yet
        self.total_preemptions += len(plan.preempted)
        return plan

    def _start_step(self, now: float) -> StepPlan:
        ctx = self.ctx
        ctx.now = now
        ctx.wakeup = None
        ctx.step += 1
        if self._arrived:
            arrived, self._arrived = self._arrived, []
            self.plugins.hook.on_arrival(ctx=ctx, seqs=arrived)
        self._notified = 0
        self._new_step_refusals()
        self.prefix.new_step()  # last step's registrations: their KV is written now
        return StepPlan(ctx.step, self.pool.block_size)

    def _notify_preempted(self, plan: StepPlan) -> None:
        """Tell `on_preempted` of the step's victims it has not heard of yet (if any)."""
        if len(plan.preempted) > self._notified:
            new = plan.preempted[self._notified :]
            self._notified = len(plan.preempted)
            self.plugins.hook.on_preempted(ctx=self.ctx, seqs=new)

    def _split(self, plan: StepPlan) -> int:
        """Ask `split_budget` for the step's shares, set them on `plan`; returns the chunk cap."""
        num_decoding = 0
        for queue in (self.running, self.swapped):
            for s in queue:
                n = len(s.token_ids)
                if s.num_computed_tokens == n - 1 and n > s.num_prompt_tokens:  # s.is_decoding
                    num_decoding += 1
        self.num_decoding = num_decoding
        budget = self._budget
        split = self.plugins.hook.split_budget(
            ctx=self.ctx, budget=budget, num_decoding=num_decoding,
            num_prefilling=len(self.running) - num_decoding + len(self.swapped), num_waiting=len(self.waiting),
        )
        if not isinstance(split, tuple) or not 3 <= len(split) <= 5:
            raise self.plugins.invalid("split_budget", f"expected Split(decode, prefill, max_chunk), got {split!r}")
        decode, prefill, max_chunk, max_prefills, shares = Split(*split)
        if decode < 0 or prefill < 0 or decode + prefill > budget or max_chunk < 1 or (
            max_prefills is not None and max_prefills < 0
        ):
            raise self.plugins.invalid(
                "split_budget",
                f"{Split(*split)} is outside the budget of {budget} tokens "
                "(shares and max_prefills must be >= 0 and the shares sum to at most the budget, max_chunk >= 1)",
            )
        plan.set_budget(decode, prefill, budget if max_prefills is None else max_prefills)
        self._reserves = Reserves(shares, decode, prefill) if shares else None
        return max_chunk

    def _serve_running(self, plan: StepPlan, max_chunk: int) -> None:
        """Give the running sequences, in `order_running`'s order, a decode token or their next
        prefill chunk, as far as the shares go."""
        running = list(self.running)
        order = self.plugins.hook.order_running(ctx=self.ctx, running=running)
        if self._reserves is not None:
            order = self._reserves.served_first(order, plan)
        members = None if order is running else set(running)  # the list as given needs no check
        scheduled, grow, schedule = plan.scheduled, self._grow, self._schedule
        allocate, ops = self.pool.allocate_slots, plan.block_ops  # `grow` without a call, when blocks are free
        speculate = self.speculation.serve if self.speculation is not None and self.speculation.drafts else None
        for seq in order:
            if members is not None and seq not in members:
                raise self.plugins.invalid("order_running", f"{seq!r} is not a running sequence")
            if seq.state is not RUNNING or seq in scheduled:
                continue  # preempted as a victim earlier in this step, or listed twice
            known = len(seq.token_ids)
            computed = seq.num_computed_tokens
            if computed == known - 1 and known > seq.num_prompt_tokens:  # decoding
                if plan.decode_left <= 0:
                    continue
                if speculate is not None:
                    speculate(self, seq, plan)
                    continue
                if allocate(seq.block_table, computed, 1, ops) or grow(seq, 1, plan):
                    schedule(seq, 1, plan, True)
                continue
            n = min(known - computed, plan.prefill_left, max_chunk)
            if n <= 0 or plan.prefills_left <= 0:
                continue
            if allocate(seq.block_table, computed, n, ops) or grow(seq, n, plan):
                schedule(seq, n, plan, False)

    def _schedule(self, seq: Sequence, n: int, plan: StepPlan, decode: bool) -> None:
        """Put `n` tokens of `seq` in the plan; the blocks they fill are indexed now, so that a
        request admitted later in this step shares them (see `StepPrefix`)."""
        plan.add(seq, n, decode)
        if self._caching:
            full = (seq.num_computed_tokens + n) // plan.block_size
            if full > seq.num_cached_blocks:
                self.prefix.register(seq, full)

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
        they run from now on, sharing every block of it (see `core/forking.py`)."""
        self._fork_slots -= unforked(parent)
        children = make_children(parent, self.pool)
        for child in children:
            self._admissions += 1
            child.admitted_seq_no = self._admissions
            self.running[child] = None
        parent.children = children
        return children
