"""The bound on `select_victim` requests for admission candidates: under `head_of_line=False` a
step asks for victims for blocked candidates a bounded number of times, whatever the queue's length
(see `metroline.core.step.victim_loop` and the `select_victim` hookspec)."""

from __future__ import annotations

from collections import Counter

from conftest import make_engine, request

from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.queue_order import queued_in_order
from metroline.core.requests.sequence import RUNNING
from metroline.core.step.victim_loop import REFUSALS_PER_STEP
from metroline.testing import check_plugin


class SkipBlocked:
    """fcfs order, but a candidate that does not fit is skipped (`head_of_line=False`); no
    `select_victim` of its own (fcfs's declines to preempt for a waiting candidate)."""

    name = "skip_blocked"

    @hookimpl
    def admission(self, ctx):
        return Candidates(queued_in_order(ctx.swapped, ctx.waiting), head_of_line=False)


class VictimSpy:
    """Counts `select_victim` requests per step, for waiting and for running requesters; answers
    nothing (the policy below answers)."""

    name = "victim_spy"

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.asked: list[tuple[int, str]] = []  # (step, request id) of each waiting requester

    @hookimpl
    def select_victim(self, ctx, requester):
        running = requester.state is RUNNING
        self.calls[(ctx.step, running)] += 1
        if not running:
            self.asked.append((ctx.step, requester.request_id))
        return None


def candidate_requests(engine, n_waiting: int, steps: int) -> tuple[Counter, int]:
    """Fill the pool with four long requests, queue `n_waiting` more whose first chunks need ever
    fewer blocks (each would be a new smallest refusal), run `steps` steps; the spy's counts for
    waiting requesters by step, and the number of candidates left waiting."""
    spy = engine.plugins.get("victim_spy")
    for i in range(4):  # 4 x 16 blocks of 4 tokens: the whole pool once they decode
        engine.add_request(request(f"hog{i}", 63, max_new=40))
    for i in range(n_waiting):
        engine.add_request(request(f"w{i}", 60 - (i % 15) * 4, max_new=2))
    for _ in range(steps):
        engine.step()
    waiting = Counter({step: n for (step, running), n in spy.calls.items() if not running})
    return waiting, len(engine.scheduler.waiting)


def test_victim_requests_for_candidates_do_not_grow_with_the_queue():
    counts = {}
    for n in (1_000, 10_000):
        engine = make_engine(plugins=[SkipBlocked(), VictimSpy()], policy="fcfs", max_num_batched_tokens=64)
        waiting_calls, left = candidate_requests(engine, n, steps=12)
        assert left > n - 100  # the queue stayed long: every step had thousands of blocked candidates
        assert waiting_calls, "no candidate was ever blocked: the scenario does not test the bound"
        assert max(waiting_calls.values()) <= REFUSALS_PER_STEP
        counts[n] = dict(waiting_calls)
    assert counts[1_000] == counts[10_000]


def test_a_smaller_candidate_is_still_offered_preemption_after_a_larger_was_declined():
    """The rule keeps the requests that could change the answer: after a refusal for a candidate
    needing k blocks, one needing fewer is asked, one needing as many or more is not."""
    engine = make_engine(
        plugins=[SkipBlocked(), VictimSpy()], policy="fcfs", num_blocks=48, max_num_batched_tokens=64
    )
    spy = engine.plugins.get("victim_spy")
    for i in range(3):  # 61 tokens: 16 blocks of 4, the last with room for 3 more tokens
        engine.add_request(request(f"hog{i}", 61, max_new=40))
    for _ in range(3):
        engine.step()  # one hog prefilled per step: the pool is full, and step 4 needs no block
    assert engine.pool.num_free_blocks() == 0 and len(engine.scheduler.running) == 3
    for rid, prompt in (("big", 40), ("bigger", 48), ("same", 40), ("small", 8)):
        engine.add_request(request(rid, prompt, max_new=2))
    engine.step()
    step = engine.scheduler.ctx.step
    assert [rid for s, rid in spy.asked if s == step] == ["big", "small"]


def test_a_skipping_policy_without_select_victim_passes_the_conformance_suite():
    check_plugin(SkipBlocked, workloads=None, modes=("recompute",))
