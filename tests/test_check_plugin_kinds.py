"""`check_plugin` on every kind of plugin, as a platform team writes them: an EDF admission policy
on per-request deadlines, tenant burst credits over budget shares, a token ban as a `sample`
wrapper (run on real logits: a tiny random Llama on the torch executor) and a tenant-affinity
router (run on a simulated cluster with a replica going down). Each passes `strict=True`; a
planted defect in each (a no-op admission, a sampler that picks a banned token, a router that
answers a dead replica) fails it, with a message that says what is wrong."""

from __future__ import annotations

import dataclasses
import re
import random

import pytest

from metroline.api import Candidates, hookimpl
from metroline.core.workloads.build import Workload
from metroline.testing import ConformanceError, check_plugin, conformance_workloads

# --- 1. EDF on per-request deadlines --------------------------------------------------------------


def with_deadlines(workload: Workload, seed: int = 0) -> Workload:
    """`workload` with a deadline on every request: 0.5 to 20 s after its arrival, drawn."""
    rng = random.Random(seed)
    items = [dataclasses.replace(it, deadline_s=rng.uniform(0.5, 20.0)) for it in workload.items]
    return Workload(workload.name, items, workload.description, workload.params)


def chat_with_deadlines() -> list[Workload]:
    return [with_deadlines(conformance_workloads()[0])]


def by_deadline(seq):
    """Earliest deadline first (none: last), then arrival order."""
    deadline = seq.deadline if seq.deadline is not None else float("inf")
    return (deadline, seq.arrival_time, seq.arrival_no, seq.index)


class EarliestDeadlineFirst:
    """Admits the waiting and swapped requests earliest deadline first."""

    name = "edf"

    @hookimpl
    def admission(self, ctx):
        return Candidates(sorted([*ctx.swapped, *ctx.waiting], key=by_deadline), head_of_line=True)


class NoOpEDF:
    """The planted defect: reads the deadline from a field that does not exist (`deadline_s` is
    the workload's name for it, not the sequence's), so every request sorts as deadline-less:
    arrival order, fcfs's own."""

    name = "edf_noop"

    @hookimpl
    def admission(self, ctx):
        def key(seq):
            deadline = getattr(seq, "deadline_s", None)
            return (deadline if deadline is not None else float("inf"), seq.arrival_time, seq.arrival_no, seq.index)

        return Candidates(sorted([*ctx.swapped, *ctx.waiting], key=key), head_of_line=True)


def test_edf_passes_strict_and_changes_the_schedule():
    report = check_plugin(EarliestDeadlineFirst, workloads=chat_with_deadlines(), modes=("recompute",), strict=True)
    assert report.coverage["admission"].changed > 0
    [without] = report.without
    assert without["differ"] > 0 and without["stack"] == "fcfs"


def test_a_no_op_admission_fails_strict():
    with pytest.raises(ConformanceError) as err:
        check_plugin(NoOpEDF, workloads=chat_with_deadlines(), modes=("recompute",), strict=True)
    message = str(err.value)
    assert re.search(r"edf_noop: hook admission called \d+ times, never changed an answer.*\(strict\)", message)
    assert "edf_noop: no request ran differently without the plugin, on any workload (strict)" in message


# --- 2. tenant burst credits over budget shares -----------------------------------------------


class BurstCredits:
    """Each tenant may take a reserved share of the step's tokens while it has credits: a step in
    which it runs costs a credit; credits refill by one every `refill_s` seconds."""

    name = "burst_credits"

    def __init__(self, shares: dict, credits: int = 20, refill_s: float = 0.5) -> None:
        self.shares = shares
        self.credits = dict.fromkeys(shares, credits)
        self.refill_s, self.cap = refill_s, credits
        self.last = 0.0

    @hookimpl(wrapper=True)
    def split_budget(self, ctx):
        split = yield
        if ctx.now - self.last >= self.refill_s:
            self.last = ctx.now
            self.credits = {t: min(self.cap, c + 1) for t, c in self.credits.items()}
        running = {s.tenant for s in ctx.running}
        shares = {t: f for t, f in self.shares.items() if t in running and self.credits[t] > 0}
        for t in shares:
            self.credits[t] -= 1
        return split._replace(shares=shares) if shares else split


def test_burst_credits_pass_strict_on_their_tenants():
    report = check_plugin(BurstCredits, options={"shares": {"gold": 0.6, "silver": 0.2}},
                          workloads=conformance_workloads()[:1], tenants={"gold": 0.2, "silver": 0.3, "free": 0.5},
                          modes=("recompute",), strict=True)
    assert report.coverage["split_budget"].changed > 0 and report.without[0]["differ"] > 0


# --- 3. a token ban as a sample wrapper --------------------------------------------------------


class TokenBan:
    """The guide's token ban (docs/plugins.md)."""

    name = "token_ban"

    def __init__(self, tokens=()):
        self.tokens = [int(t) for t in tokens]

    @hookimpl(wrapper=True)
    def sample(self, ctx, seqs):
        for seq in seqs:
            ctx.ban_tokens(seq, self.tokens)
        return (yield)


class LeakyBan(TokenBan):
    """The planted defect: bans, then answers the raw logits' argmax (a banned token where the
    model liked it best)."""

    name = "leaky_ban"

    @hookimpl(wrapper=True)
    def sample(self, ctx, seqs, logits):
        for seq in seqs:
            ctx.ban_tokens(seq, self.tokens)
        tokens = yield
        return tokens if logits is None else logits.argmax(dim=-1).tolist()


def test_a_token_ban_passes_strict_on_real_logits():
    pytest.importorskip("transformers")
    report = check_plugin(TokenBan, options={"tokens": [42, 43]}, workloads=conformance_workloads()[:1],
                          modes=("recompute",), strict=True)
    assert ("torch-tiny", "sample") in {(r["workload"], r["mode"]) for r in report.runs}
    assert report.coverage["sample"].changed > 0  # the greedy/drawn token was a banned one there


def test_a_sampler_that_picks_a_banned_token_fails():
    pytest.importorskip("transformers")
    with pytest.raises(ConformanceError, match=r"leaky_ban.*sample.*token 4[23] for request 's\d+' is masked"):
        check_plugin(LeakyBan, options={"tokens": [42, 43]}, workloads=conformance_workloads()[:1],
                     modes=("recompute",))


# --- 4. a tenant-affinity router ---------------------------------------------------------------


class TenantAffinity:
    """Each tenant's requests to its replica (`tenant_replicas`: tenant -> replica name) while that
    replica is live; the others, and those whose replica is down, to the least loaded replica."""

    name = "tenant_affinity"

    def __init__(self, tenant_replicas: dict) -> None:
        self.tenant_replicas = tenant_replicas

    @hookimpl
    def route(self, request, replicas):
        wanted = self.tenant_replicas.get(request.tenant)
        if any(r.name == wanted for r in replicas):
            return wanted
        return min(replicas, key=lambda r: (r.outstanding_tokens, r.index)).index


class StickyAffinity(TenantAffinity):
    """The planted defect: answers the tenant's replica whether it is live or not."""

    name = "sticky_affinity"

    @hookimpl
    def route(self, request, replicas):
        return self.tenant_replicas.get(request.tenant) or 0


AFFINITY = {"tenant_replicas": {"alpha": "r0", "beta": "r1"}}


def test_a_tenant_affinity_router_passes_strict_on_a_cluster():
    report = check_plugin(TenantAffinity, options=AFFINITY, workloads=conformance_workloads()[:1], strict=True)
    [run] = report.runs
    assert run["mode"] == "cluster" and run["down"] == "r1" and set(run["replicas"]) == {"r0", "r1", "r2"}
    assert run["requests"] == 160 and sum(run["replicas"].values()) == 160
    assert report.coverage["route"].calls == 160 and report.coverage["route"].changed > 0


def test_a_router_that_answers_a_dead_replica_fails():
    with pytest.raises(ConformanceError, match=r"sticky_affinity.*route.*answered replica 'r1' for request .* "
                                               r"while replica 'r1' is down \(live: r0, r2\)"):
        check_plugin(StickyAffinity, options=AFFINITY, workloads=conformance_workloads()[:1])


def test_replica_names_are_those_the_cluster_declares():
    pools = {"pools": {"short": {"replicas": 2}, "long": {"replicas": 1}}}
    options = {"tenant_replicas": {"alpha": "short-0", "beta": "long-0"}}
    report = check_plugin(TenantAffinity, options=options, workloads=conformance_workloads()[:1], cluster=pools,
                          strict=True)
    assert set(report.runs[0]["replicas"]) == {"short-0", "short-1", "long-0"}
    # the default pool's names are r0.. whichever way it is declared; a name not in the cluster is refused
    with pytest.raises(ConformanceError, match=r"tenant_replicas\.beta: no replica named 'r7' \(replicas: r0, r1, r2\)"):
        check_plugin(TenantAffinity, options={"tenant_replicas": {"beta": "r7"}}, workloads=conformance_workloads()[:1])
