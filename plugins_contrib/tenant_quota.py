"""`tenant_quota`: per-tenant caps on running requests and on token rate, stacked on any policy.

Stack it on a base policy (`--policy fcfs --plugin tenant_quota`); it only removes candidates from
the base policy's `admission` answer and keeps its order and its head-of-line choice.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Annotated, Any

from pydantic import Field

from metroline.api import (
    Candidates,
    PluginOptions,
    QUEUED,
    Sequence,
    StepContext,
    hookimpl,
    take_options,
)

_EPS = 1e-9  # tokens: a bucket that refilled to `need` up to rounding holds `need`


Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A token rate or a bucket size: a finite number > 0."""
Cap = Annotated[int, Field(ge=1)]
"""A cap on running sequences: an int >= 1."""


class _Bucket:
    """A token bucket: `level` tokens, refilled at `rate` tokens/s up to `burst`."""

    __slots__ = ("rate", "burst", "level", "last")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.last = rate, burst, burst, now

    def refill(self, now: float) -> float:
        if now > self.last:
            level = self.level + self.rate * (now - self.last)
            self.level = level if level < self.burst else self.burst
            self.last = now
        return self.level


class TenantQuota:
    """Per-tenant quotas: a cap on running requests and a token rate, on top of any base policy.

    Decides: which of the base policy's admission candidates may be tried this step. It is an
    admission *wrapper*: it takes whatever the policies below it answered (a `Candidates` or any
    iterable), keeps their order and head-of-line behaviour (a plain iterable means head-of-line),
    and lazily drops the candidates of tenants that are over quota. A dropped candidate never
    blocks the queue: the ones behind it (other tenants) are still tried, even under a
    head-of-line base policy. Tenants without a limit pass through untouched.

    Options: see `TenantQuota.Options` (`max_running`, `default_max_running`, `token_rate`,
    `default_token_rate`, `burst`).

    Token rate: a token bucket per tenant that holds at most `burst` tokens, starts full and
    refills at the rate on the engine clock (`ctx.now`). A request is charged its prompt tokens
    when it is first admitted (a readmission after preemption is not charged again) and one token
    per generated token (`on_tokens`). A not-yet-charged candidate passes only when its tenant's
    bucket holds its prompt tokens (or is full, for a prompt longer than `burst`); the bucket may
    go negative by generated tokens, which blocks the tenant's admissions until it refills.

    Guarantee (token rate): for every admission of a tenant at time t, the tokens charged to that
    tenant over any window [t0, t] (admissions at t included) are at most
    `burst + rate * (t - t0)`, when no prompt is longer than `burst` (a longer one raises the
    bound to its length). Tokens generated after the tenant's last admission are not refused
    (running requests are never stopped): they are bounded by what its running requests still
    generate, and are paid back before its next admission.

    Reservations (the server's way, as hosted APIs' rate limiters): `reserve(tenant, request_id,
    tokens, now)` charges a request's prompt plus `max_tokens x n` before it is submitted (None),
    or answers the seconds until the bucket can pay (at most `burst` of it: a larger request waits
    for a full bucket and takes it below zero; the server refuses such a request before it
    reserves, `metroline.core.serving.quota.too_large`); `settle(request_id, used, now)` refunds what the
    request did not use once it ends. A reserved request is not charged again at admission nor
    per generated token, so a tenant's parallel requests, `n` samples and batches of prompts
    together cannot take more than `burst + rate * t` over any window of t seconds (plus, once,
    the excess of a request larger than `burst`).

    Guarantee (running cap): a tenant never has more running sequences than its cap. The count
    is kept incrementally (admissions, preemptions, finishes, including candidates admitted
    earlier in the same step); a request with `n > 1` samples is counted as `n` from its
    admission (its samples are forked later).

    Simulation: while only held-back requests wait, nothing else moves a simulated clock, so a
    refused candidate calls `ctx.wake_at(time its bucket holds enough)`; the workload replay idles
    the clock to it.

    Cost: O(1) per candidate the scheduler pulls, O(1) per sequence an observer reports.
    Over-quota candidates are still pulled from the base answer (and dropped), so a step also
    pays for the over-quota requests queued ahead of the first admissible one.

    Head-of-line or skip: the base policy's choice for candidates within quota; over-quota ones
    are skipped. Victim rule: none (the base policy's `select_victim` is unchanged).
    """

    name = "tenant_quota"

    class Options(PluginOptions):
        """`[plugin_options.tenant_quota]`."""

        max_running: dict[str, Cap] = Field(
            default_factory=dict, description="{tenant: n}: at most n of the tenant's sequences run at once"
        )
        default_max_running: Cap | None = Field(
            default=None, description="the cap of every tenant not named in `max_running`; None: no cap"
        )
        token_rate: dict[str, Rate] = Field(
            default_factory=dict, description="{tenant: tokens per second}: the tenant's token bucket's rate"
        )
        default_token_rate: Rate | None = Field(
            default=None, description="the rate of every tenant not named in `token_rate`; None: no rate limit"
        )
        burst: Rate | None = Field(
            default=None, description="the bucket size in tokens; None: one second of the tenant's rate"
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = self.options = take_options(self, args, kwargs)
        self.max_running = dict(options.max_running)
        self.default_max_running = options.default_max_running
        self.token_rate = dict(options.token_rate)
        self.default_token_rate = options.default_token_rate
        self.burst = options.burst
        self.running: dict[str, int] = {}
        """Running sequences per tenant (the sum of `_slots` over the tenant's sequences)."""
        self._slots: dict[Sequence, int] = {}
        """Slots charged to each counted running sequence."""
        self._buckets: dict[str, _Bucket | None] = {}
        self._paid: set[Sequence] = set()
        """Sequences whose prompt was charged to their tenant's bucket."""
        self._rated = bool(self.token_rate) or self.default_token_rate is not None
        self.reserved: dict[str, tuple[str, float]] = {}
        """request_id -> (tenant, tokens reserved) of the requests paid for in advance (`reserve`)."""
        self._lock = threading.Lock()  # reservations (the server's loop) and steps (maybe a thread)

    # --- limits ----------------------------------------------------------------------------------

    def cap(self, tenant: str) -> int | None:
        """The running cap of `tenant`, or None."""
        return self.max_running.get(tenant, self.default_max_running)

    def bucket(self, tenant: str, now: float) -> _Bucket | None:
        """The token bucket of `tenant` (made full at its first use), or None when not rated."""
        try:
            return self._buckets[tenant]
        except KeyError:
            rate = self.token_rate.get(tenant, self.default_token_rate)
            b = None if rate is None else _Bucket(rate, self.burst if self.burst is not None else rate, now)
            self._buckets[tenant] = b
            return b

    def reserve(self, tenant: str, request_id: str, tokens: float, now: float) -> float | None:
        """Charge `tokens` (a request's prompt plus `max_tokens x n`) to `tenant`'s bucket for
        `request_id` and answer None, or answer the seconds until the bucket can pay and charge
        nothing. A tenant without a rate is never refused (and nothing is recorded)."""
        with self._lock:
            b = self.bucket(tenant, now)
            if b is None:
                return None
            level = b.refill(now)
            need = tokens if tokens < b.burst else b.burst
            if level + _EPS < need:
                return (need - level) / b.rate
            b.level -= tokens
            self.reserved[request_id] = (tenant, tokens)
            return None

    def settle(self, request_id: str, used: float, now: float) -> None:
        """A reserved request ended having used `used` tokens (prompt and output): the rest of its
        reservation goes back to its tenant's bucket."""
        with self._lock:
            entry = self.reserved.pop(request_id, None)
            if entry is None:
                return
            tenant, tokens = entry
            b = self.bucket(tenant, now)
            if b is not None and tokens > used:
                b.refill(now)
                level = b.level + (tokens - used)
                b.level = level if level < b.burst else b.burst

    def _allowed(self, seq: Sequence, ctx: StepContext, now: float) -> bool:
        tenant = seq.tenant
        cap = self.max_running.get(tenant, self.default_max_running)
        if cap is not None:
            need = seq.sampling.n if seq.sampling.n > 1 and not seq.children and seq.parent is None else 1
            if self.running.get(tenant, 0) + need > cap:
                return False
        if self._rated and seq not in self._paid and seq.request_id not in self.reserved:
            b = self.bucket(tenant, now)
            if b is not None:
                level = b.refill(now)
                need = seq.num_prompt_tokens
                if need > b.burst:
                    need = b.burst
                if level + _EPS < need:
                    ctx.wake_at(now + (need - level) / b.rate)  # when the bucket holds enough
                    return False
        return True

    # --- bookkeeping -----------------------------------------------------------------------------

    def _count(self, seq: Sequence, slots: int) -> None:
        if seq not in self._slots:
            self._slots[seq] = slots
            self.running[seq.tenant] = self.running.get(seq.tenant, 0) + slots

    def _uncount(self, seq: Sequence) -> None:
        slots = self._slots.pop(seq, 0)
        if slots:
            self.running[seq.tenant] -= slots

    def _admitted(self, seq: Sequence, now: float) -> None:
        """`seq` was just admitted by the scheduler (seen between two pulls of the candidates)."""
        n = seq.sampling.n
        self._count(seq, n if n > 1 and not seq.children and seq.parent is None else 1)
        if self._rated and seq not in self._paid and seq.request_id not in self.reserved:
            with self._lock:
                b = self.bucket(seq.tenant, now)
                if b is not None:
                    b.refill(now)
                    b.level -= seq.num_prompt_tokens
                    self._paid.add(seq)

    # --- hooks -----------------------------------------------------------------------------------

    @hookimpl
    def check_request(self, seq: Sequence) -> str | None:
        """A request whose `n` samples exceed its tenant's running cap could never be admitted."""
        cap = self.cap(seq.tenant)
        if cap is not None and seq.sampling.n > cap:
            return f"sampling.n ({seq.sampling.n}) exceeds the running cap of tenant {seq.tenant!r} ({cap})"
        return None

    @hookimpl(wrapper=True)
    def admission(self, ctx: StepContext) -> Generator[None, Any, Candidates | None]:
        answer = yield
        if answer is None:
            return None
        now = ctx.now
        # stale candidates pass through (the scheduler skips them); an admission is charged as it
        # happens, so the next candidate of the same tenant sees it
        return Candidates.of(answer).filter(
            lambda seq: seq.state not in QUEUED or self._allowed(seq, ctx, now),
            admitted=lambda seq: self._admitted(seq, now),
        )

    @hookimpl
    def on_admitted(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq in self._slots:
                continue
            parent = seq.parent
            if parent is not None and self._slots.get(parent, 0) > 1:
                # a forked sample: it takes one of the slots charged to its parent at admission
                self._slots[parent] -= 1
                self._slots[seq] = 1
            else:
                self._admitted(seq, ctx.now)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._uncount(seq)

    @hookimpl
    def on_finished(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._uncount(seq)
            self._paid.discard(seq)

    @hookimpl
    def on_tokens(self, ctx: StepContext, seqs: list[Sequence]) -> None:
        if not self._rated:
            return
        now, buckets, reserved = ctx.now, self._buckets, self.reserved
        for seq in seqs:
            if seq.request_id in reserved:
                continue  # paid in advance
            tenant = seq.tenant
            b = buckets[tenant] if tenant in buckets else self.bucket(tenant, now)
            if b is not None:
                b.refill(now)
                b.level -= 1

