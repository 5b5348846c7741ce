"""`/metrics`: the server's Prometheus metrics (prometheus_client), fed after every step.

The engine's own `MetricsCollector` logs every step and finished request; the server drains those
logs into counters, gauges and histograms after each step (and empties them, so a long-running
server keeps no per-request history).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from ..results.deadlines import figures_of_counts, met_deadline
from ..results.metrics import DECODE_TOKENS, NUM_SEQS, PREEMPTIONS, PREFILL_TOKENS

_SHARES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Every metric of one server, in its own registry (two servers in a process do not mix)."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        r = self.registry = CollectorRegistry()
        self.budget = max_num_batched_tokens
        self._spec: dict[str, Any] | None = None  # speculative decoding's counters, made at its first step
        self.waiting = Gauge("metroline_waiting_requests", "Requests waiting for admission", registry=r)
        self.running = Gauge("metroline_running_requests", "Running sequences", registry=r)
        self.swapped = Gauge("metroline_swapped_requests", "Sequences swapped out to host memory", registry=r)
        self.free_blocks = Gauge("metroline_free_blocks", "KV blocks on the free list", registry=r)
        self.cached_blocks = Gauge("metroline_cached_blocks", "Evictable KV blocks holding cached prefixes", registry=r)
        self.preemptions = Counter("metroline_preemptions", "Preemptions", registry=r)
        self.recomputed = Counter("metroline_recomputed_tokens", "Tokens recomputed after a preemption", registry=r)
        self.steps = Counter("metroline_steps", "Engine steps that scheduled work", registry=r)
        batch_buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b < max_num_seqs)
        self.batch_size = Histogram(
            "metroline_step_batch_size", "Sequences scheduled per step", registry=r,
            buckets=(*batch_buckets, max_num_seqs),
        )
        tok_buckets = tuple(b for b in (1, 4, 16, 64, 256, 1024, 4096) if b < max_num_batched_tokens)
        self.step_tokens = Histogram(
            "metroline_step_tokens", "Tokens scheduled per step", registry=r,
            buckets=(*tok_buckets, max_num_batched_tokens),
        )
        self.prefill_share = Histogram(
            "metroline_step_prefill_share", "Prefill tokens / the step's token budget", registry=r, buckets=_SHARES,
        )
        self.decode_share = Histogram(
            "metroline_step_decode_share", "Decode tokens / the step's token budget", registry=r, buckets=_SHARES,
        )
        self.ttft = Histogram("metroline_ttft_seconds", "Time to first token", registry=r, buckets=_LATENCY)
        self.itl = Histogram("metroline_itl_seconds", "Time between two output tokens", registry=r, buckets=_LATENCY)
        self.tokens = Counter("metroline_tokens_served", "Output tokens served", ["tenant"], registry=r)
        self.prompt_tokens = Counter("metroline_prompt_tokens", "Prompt tokens of admitted requests", ["tenant"], registry=r)
        self.finished = Counter(
            "metroline_requests_finished", "Requests ended, by finish reason", ["tenant", "reason"], registry=r,
        )
        self.paused = Gauge("metroline_paused_requests", "Requests paused: their client stopped reading", registry=r)
        self.pauses = Counter("metroline_stream_pauses", "Times a request was paused for a client that stopped reading",
                              registry=r)
        self._pauses_seen = 0
        self.plugin_errors = Counter(
            "metroline_plugin_errors", "Errors plugins raised or answered (each failed its request, or the step's)",
            ["plugin", "hook"], registry=r,
        )
        self.plugin_overruns = Counter(
            "metroline_plugin_overruns", "Plugin calls stopped or ended past the hook budget (hook_budget_s)",
            ["plugin", "hook"], registry=r,
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, open files (Linux)
        self.rejections = Counter(
            "metroline_rejections", "Requests refused before reaching the engine", ["tenant", "reason"], registry=r,
        )
        self.deadline_requests = Counter(
            "metroline_deadline_requests", "Requests with a deadline (deadline_s) that ended", ["tenant"], registry=r,
        )
        self.deadline_met = Counter(
            "metroline_deadline_met", "Requests that completed by their deadline", ["tenant"], registry=r,
        )
        self.deadline_attainment = Gauge(
            "metroline_deadline_attainment", "Share of the ended requests with a deadline that met it", registry=r,
        )
        self.deadline_attainment.set(float("nan"))  # no request with a deadline has ended yet
        self.deadline_attainment_by_tenant = Gauge(
            "metroline_deadline_attainment_by_tenant", "Share of a tenant's ended requests with a deadline that met it",
            ["tenant"], registry=r,
        )
        self.deadline_counts: dict[str, list[int]] = {}
        """Tenant -> [requests with a deadline that ended, those that met it], since the start."""

    def after_step(self, engine: Any, outputs: list[Any]) -> None:
        """Drain the engine's step log and finished records into the metrics."""
        log = engine.metrics
        budget = self.budget
        for row in log.steps:
            prefill, decode = row[PREFILL_TOKENS], row[DECODE_TOKENS]
            self.steps.inc()
            self.batch_size.observe(row[NUM_SEQS])
            self.step_tokens.observe(prefill + decode)
            self.prefill_share.observe(prefill / budget)
            self.decode_share.observe(decode / budget)
            if row[PREEMPTIONS]:
                self.preemptions.inc(row[PREEMPTIONS])
        log.steps.clear()
        for rec in log.requests:
            self.finished.labels(rec.tenant, rec.finish_reason).inc()
            if rec.recomputed_tokens:
                self.recomputed.inc(rec.recomputed_tokens)
            if rec.first_token_s is not None:
                self.ttft.observe(rec.first_token_s - rec.arrival_s)
                self.prompt_tokens.labels(rec.tenant).inc(rec.prompt_tokens)
            times = rec.token_times
            for a, b in zip(times, times[1:]):
                self.itl.observe(b - a)
        if log.deadlines:
            self._deadlines(log.requests, log.deadlines)
        log.requests.clear()
        served: dict[str, int] = {}
        for out in outputs:
            if out.new_token_ids:
                t = out.seq.tenant
                served[t] = served.get(t, 0) + len(out.new_token_ids)
        for t, n in served.items():
            self.tokens.labels(t).inc(n)
        s, pool = engine.scheduler, engine.pool
        if s.speculation is not None:
            self._speculation(s.speculation.counters)
        self.waiting.set(len(s.waiting))
        self.running.set(len(s.running))
        self.swapped.set(len(s.swapped))
        self.free_blocks.set(pool.num_free_blocks())
        self.cached_blocks.set(pool.num_cached_blocks())

    def _deadlines(self, records: list[Any], deadlines: dict[str, float]) -> None:
        """Count the ended sequences that had a deadline (`deadlines`: id -> deadline, emptied),
        and those that met it (`metroline.core.results.deadlines.met_deadline`)."""
        for rec in records:
            deadline = deadlines.pop(rec.id, None)
            if deadline is None:
                continue
            met = met_deadline(rec, deadline)
            c = self.deadline_counts.setdefault(rec.tenant, [0, 0])
            c[0] += 1
            c[1] += met
            self.deadline_requests.labels(rec.tenant).inc()
            self.deadline_met.labels(rec.tenant).inc(met)  # the series exists at 0 for a tenant that met none
            self.deadline_attainment_by_tenant.labels(rec.tenant).set(c[1] / c[0])
        deadlines.clear()
        figures = self.deadline_figures()
        if figures is not None:
            self.deadline_attainment.set(figures["attainment"])

    def deadline_figures(self) -> dict[str, Any] | None:
        """The deadline figures since the server started, shaped as a run's
        (`metroline.core.results.deadlines.deadline_figures`); None while no request had one."""
        return figures_of_counts({t: (c[0], c[1]) for t, c in self.deadline_counts.items()})

    def _speculation(self, counters: Any) -> None:
        """Speculative decoding's counters, named as vLLM's (`vllm:spec_decode_num_drafts`, ...):
        request-steps with drafts, draft tokens, accepted tokens, and accepted tokens by position."""
        if self._spec is None:
            r = self.registry
            self._spec = {
                "num_drafts": Counter("metroline_spec_decode_num_drafts", "Request-steps that carried drafts", registry=r),
                "num_draft_tokens": Counter("metroline_spec_decode_num_draft_tokens", "Draft tokens verified", registry=r),
                "num_accepted_tokens": Counter("metroline_spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                               registry=r),
                "per_pos": Counter("metroline_spec_decode_num_accepted_tokens_per_pos",
                                   "Draft tokens accepted at each position of a run", ["position"], registry=r),
            }
            self._spec_seen = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
            self._per_pos_seen = [0] * len(counters.accepted_per_pos)
        seen = self._spec_seen
        for key in seen:
            now = getattr(counters, key)
            if now > seen[key]:
                self._spec[key].inc(now - seen[key])
                seen[key] = now
        for i, now in enumerate(counters.accepted_per_pos):
            if now > self._per_pos_seen[i]:
                self._spec["per_pos"].labels(str(i)).inc(now - self._per_pos_seen[i])
                self._per_pos_seen[i] = now

    def backpressure(self, paused: int, pauses: int) -> None:
        """The engine loop's pause figures: `paused` now, `pauses` since it started."""
        self.paused.set(paused)
        if pauses > self._pauses_seen:
            self.pauses.inc(pauses - self._pauses_seen)
            self._pauses_seen = pauses

    def reject(self, tenant: str, reason: str) -> None:
        self.rejections.labels(tenant, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
