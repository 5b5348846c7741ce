"""`weighted_fair`: fair sharing between tenants by virtual token counters (VTC, Sheng et al., OSDI'24)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from metroline.api import (
    Candidates,
    LazyHeap,
    PluginOptions,
    RUNNING,
    Sequence,
    StepContext,
    arrival_key,
    hookimpl,
    last_admitted,
    take_options,
)


class WeightedFair:
    """Serves the tenant that has received the least weighted service (virtual token counters).

    Each tenant has a counter of the service it received divided by its weight: `w_in` per prompt
    token it computed, charged when a request is first admitted (the prompt minus what the prefix
    cache already held, as the engine charges the work; a readmission after preemption, a
    swap-in and the siblings of a parallel-sampling request are not charged again: recomputation
    is the scheduler's choice, not the tenant's demand), and `w_out` per generated token
    (`on_tokens`). Over any interval in which two tenants stay backlogged, their counters stay
    within a bounded distance, so each gets service in proportion to its weight.

    - admission: each pick takes the backlogged tenant (one with a waiting or swapped request)
      with the lowest counter (ties: the older head request) and yields that tenant's oldest
      request; a pick charges the tenant at once, so one step's admissions interleave tenants.
      Per-tenant queues are heaps keyed at arrival (a preempted request keeps its place), a pick
      is O(tenants).
    - head-of-line: when the chosen request's blocks do not fit, admission stops for the step. The
      lowest-counter tenant keeps its turn: letting others overtake it would let a tenant of small
      requests starve one of long prompts indefinitely. A request that a wrapper plugin filtered
      out takes its tenant out of this step's admission.
    - backlog rule (VTC): a tenant whose waiting queue was empty and gets a new request is lifted
      to `max(own counter, lowest counter among backlogged tenants)` -- or, when no tenant is
      backlogged, to the counter of the tenant whose queue emptied last -- so time spent idle
      banks no credit. Preempted requests re-entering the queue do not lift.
    - victim: for a running request that needs a block, the running request admitted last (the
      one with the least progress) of the tenant with the highest counter among backlogged
      tenants, or among all tenants when no running request belongs to a backlogged one (it may
      be the requester itself). Backlogged tenants first: a tenant with nothing waiting is asking
      for no more than it gets, and the backlog rule keeps its counter level with the backlogged
      ones, so right after a prompt charge it can briefly hold the highest counter without being
      over-served. A waiting request preempts nobody (VTC), unless `preempt` is on: then a
      waiting request that needs a slot or blocks preempts the running request admitted last of
      the tenant with the highest counter, when that counter is strictly higher than its own
      tenant's, so an under-served tenant does not wait for an over-served one's requests to
      finish (at the cost of their recomputation).

    Options: see `WeightedFair.Options` (`weights`, `w_in`, `w_out`, `preempt`).
    """

    name = "weighted_fair"

    class Options(PluginOptions):
        """`[plugin_options.weighted_fair]`. `w_in` and `w_out` default to VTC's weights: an output
        token costs about twice an input token."""

        weights: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
            default_factory=dict, description="{tenant: weight}; a tenant not listed weighs 1.0"
        )
        w_in: float = Field(
            default=1.0, ge=0, allow_inf_nan=False, description="the service one prompt token counts for"
        )
        w_out: float = Field(
            default=2.0, ge=0, allow_inf_nan=False,
            description="the service one generated token counts for; not 0 when `w_in` is 0",
        )
        preempt: bool = Field(
            default=False,
            description="whether a waiting request preempts the last admitted request of the tenant with the "
            "highest counter, when that counter is strictly higher than its own tenant's",
        )

        @field_validator("w_out")
        @classmethod
        def _counts_some_service(cls, w_out: float, info: ValidationInfo) -> float:
            if w_out == 0 and info.data.get("w_in") == 0:
                raise ValueError("w_in and w_out are both 0: no service would ever be counted")
            return w_out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = self.options = take_options(self, args, kwargs)
        self.weights = dict(options.weights)
        self.w_in, self.w_out, self.preempt = options.w_in, options.w_out, options.preempt
        self.counters: dict[str, float] = {}
        self._queues: dict[str, LazyHeap] = {}
        self._active: dict[str, None] = {}  # tenants that may have waiting requests
        self._out_cost: dict[str, float] = {}
        self._last_left: str | None = None

    @property
    def service_weights(self) -> dict[str, Any]:
        """The weights this policy equalises by, in the form `result_document(service_weights=)`
        takes, so that the fairness figures measure what it charges."""
        return {"w_in": self.w_in, "w_out": self.w_out, "weights": dict(self.weights)}

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    # --- state ---------------------------------------------------------------------------------

    def _queue(self, tenant: str) -> LazyHeap:
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = LazyHeap(arrival_key)
            self.counters.setdefault(tenant, 0.0)
            self._out_cost[tenant] = self.w_out / self.weight(tenant)
        return queue

    def _backlog_floor(self, exclude: str) -> float | None:
        """The lowest counter among backlogged tenants other than `exclude` (None: none is)."""
        floor = None
        for tenant in list(self._active):
            if tenant == exclude:
                continue
            if self._queues[tenant].peek() is None:
                del self._active[tenant]
                continue
            c = self.counters[tenant]
            if floor is None or c < floor:
                floor = c
        return floor

    @hookimpl
    def on_arrival(self, seqs: list[Sequence]) -> None:
        counters = self.counters
        for seq in seqs:
            tenant = seq.tenant
            queue = self._queue(tenant)
            if queue.peek() is None:
                floor = self._backlog_floor(tenant)
                if floor is None and self._last_left is not None and self._last_left != tenant:
                    floor = counters[self._last_left]
                if floor is not None and floor > counters[tenant]:
                    counters[tenant] = floor
            queue.push(seq)
            self._active[tenant] = None

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._queue(seq.tenant).push(seq)
            self._active[seq.tenant] = None

    def _input_cost(self, seq: Sequence) -> float:
        if seq.num_preemptions or seq.parent is not None:
            return 0.0
        computed = seq.num_prompt_tokens - min(seq.num_computed_tokens, seq.num_prompt_tokens)
        return self.w_in * computed / self.weight(seq.tenant)

    @hookimpl
    def on_admitted(self, seqs: list[Sequence]) -> None:
        counters = self.counters
        for seq in seqs:
            self._queue(seq.tenant)
            counters[seq.tenant] += self._input_cost(seq)

    @hookimpl
    def on_tokens(self, seqs: list[Sequence]) -> None:
        counters, cost = self.counters, self._out_cost
        for seq in seqs:
            tenant = seq.tenant
            if tenant not in cost:
                self._queue(tenant)
            counters[tenant] += cost[tenant]

    # --- decisions -----------------------------------------------------------------------------

    @hookimpl
    def admission(self) -> Candidates:
        return Candidates(self._picks(), head_of_line=True)

    def _picks(self) -> Iterator[Sequence]:
        counters, queues, active = self.counters, self._queues, self._active
        pending: dict[str, float] = {}  # this step's admissions, charged for real by on_admitted
        left_out: set[str] = set()
        while True:
            best_key, best = None, None
            for tenant in list(active):
                head = queues[tenant].peek()
                if head is None:
                    del active[tenant]
                    continue
                if tenant in left_out:
                    continue
                key = (counters[tenant] + pending.get(tenant, 0.0), head.arrival_time, head.arrival_no, head.index)
                if best_key is None or key < best_key:
                    best_key, best = key, head
            if best is None:
                return
            yield best
            tenant = best.tenant
            if best.state is RUNNING:
                pending[tenant] = pending.get(tenant, 0.0) + self._input_cost(best)
                if queues[tenant].peek() is None:
                    self._last_left = tenant
            else:
                left_out.add(tenant)

    @hookimpl
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        counters = self.counters
        if requester.state is RUNNING:
            queues = self._queues
            backlogged = {t for t in self._active if queues[t].peek() is not None}
            return last_admitted(ctx.running, rank=lambda s: (s.tenant in backlogged, counters.get(s.tenant, 0.0)))
        if not self.preempt:
            return None
        victim = last_admitted(ctx.running, rank=lambda s: counters.get(s.tenant, 0.0))
        if victim is None or counters.get(victim.tenant, 0.0) <= counters.get(requester.tenant, 0.0):
            return None
        return victim
