"""The helpers policies share: `LazyHeap` (keyed once, re-keyed, running worst-first),
`queued_in_order` (the default admission's lazy walk), `last_admitted` and `PromptsInFlight`."""

from __future__ import annotations

import types

import pytest
from conftest import make_engine, request, run_to_end

from metroline.core.plugins.candidates import Candidates
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.plugins.inflight import PromptsInFlight, missing_blocks
from metroline.core.plugins.lazy_heap import LazyHeap, arrival_key
from metroline.core.plugins.queue_order import FIRST_CHUNK, queued_in_order
from metroline.core.plugins.victims import last_admitted, last_admitted_victim
from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import FINISHED, RUNNING, SWAPPED, WAITING, Sequence


def seqs(n: int, prompt: int = 1) -> list[Sequence]:
    return [Sequence(f"s{i}", [1] * prompt, SamplingParams(), float(i), arrival_no=i) for i in range(n)]


# --- LazyHeap ------------------------------------------------------------------------------------


def test_keyed_once_a_sequence_pushed_again_keeps_its_place():
    q = LazyHeap(key=arrival_key)
    a, b, c = seqs(3)
    for s in (c, a, b):
        q.push(s)
    gen = q.ordered()
    assert next(gen) is a
    a.state = RUNNING  # admitted: its entry goes stale
    assert next(gen) is b
    gen.close()  # b is still waiting: put back; a is dropped
    assert list(q.ordered()) == [b, c] and len(q) == 2
    a.state = WAITING  # preempted: back in front of b, in its arrival place
    q.push(a)
    assert list(q.ordered()) == [a, b, c]


def test_peek_drops_stale_entries_and_counts_swapped_as_queued():
    q = LazyHeap(key=arrival_key)
    a, b = seqs(2)
    q.push(a)
    q.push(b)
    a.state = FINISHED
    b.state = SWAPPED
    assert q.peek() is b and len(q) == 1


def test_rekey_replaces_the_key_of_a_sequence_pushed_again_and_stays_small():
    q = LazyHeap(rekey=True)
    a, b = seqs(2)
    q.push(a, 10.0, 2)
    q.push(b, 5.0, 2)
    q.push(a, 1.0, 2)  # a preempted: its new key replaces the old one
    assert list(q.ordered()) == [a, b]
    gen = q.ordered()
    assert next(gen) is a
    a.state = RUNNING
    gen.close()
    assert list(q.ordered()) == [b]
    b.state = RUNNING
    for _ in range(1000):  # dead entries are compacted away
        q.push(a, 3.0, 1)
    a.state = WAITING
    assert q.num_entries <= 2 * 1 + 64 + 1 and list(q.ordered()) == [a]


def test_discard_forgets_a_sequence():
    q = LazyHeap(rekey=True)
    a, b = seqs(2)
    q.push(a, 1.0)
    q.push(b, 2.0)
    q.discard(a)
    assert list(q.ordered()) == [b]


def test_running_heap_peeks_the_worst_running_and_rebuilds_without_the_finished():
    q = LazyHeap(key=lambda s: -s.arrival_no, live=frozenset((RUNNING,)))
    many = seqs(300)
    for s in many:
        s.state = RUNNING
    for i, s in enumerate(many):
        q.push(s, num_live=min(i + 1, 3))
        if i >= 2:
            many[i - 2].state = FINISHED  # at most 2 run at once
    assert q.peek() is many[-1]
    assert q.num_entries <= 2 * 3 + 64 + 1  # the finished ones did not pile up
    many[-1].state = FINISHED
    assert q.peek() is many[-2]


def test_a_rebuild_while_ordered_is_suspended_keeps_the_taken_entries():
    q = LazyHeap(rekey=True)
    a, b = seqs(2)
    q.push(a, 1.0)
    q.push(b, 2.0)
    gen = q.ordered()
    assert next(gen) is a
    b.state = RUNNING
    for _ in range(100):
        q.push(b, 2.0, num_live=1)  # rebuilds while a is taken
    b.state = WAITING
    gen.close()
    assert list(q.ordered()) == [a, b]


# --- queued_in_order ------------------------------------------------------------------------------


class CountingQueue:
    """An ordered view of a dict (like `ctx.waiting`) that counts the items its iterations touched."""

    def __init__(self, items: list[Sequence]) -> None:
        self.d = dict.fromkeys(items)
        self.touched = 0

    def __iter__(self):
        for s in self.d:
            self.touched += 1
            yield s

    def __len__(self) -> int:
        return len(self.d)

    def __reversed__(self):
        return reversed(self.d)


def test_walks_queues_in_order_one_after_the_other():
    a, b, c, d = seqs(4)
    assert list(queued_in_order({c: None}.keys(), {a: None, b: None, d: None}.keys())) == [c, a, b, d]
    assert list(queued_in_order({}.keys(), {}.keys())) == []


def test_copies_only_as_far_as_the_consumer_pulls():
    q = CountingQueue(seqs(4000))
    gen = queued_in_order(q)
    first = next(gen)
    assert first.request_id == "s0"
    assert q.touched <= FIRST_CHUNK  # not the 4,000 a copy of the queue reads


def test_the_queue_may_change_while_the_walk_is_suspended():
    items = seqs(40)
    waiting = dict.fromkeys(items)
    late = seqs(1)[0]
    late.request_id = "late"
    got = []
    for s in queued_in_order(waiting.keys()):
        got.append(s)
        if int(s.request_id[1:]) % 2 == 0:
            del waiting[s]  # admitted
        if s is items[5]:
            waiting[late] = None  # a victim joins the back during the step: not yielded
    assert got == items


def test_a_sequence_removed_before_it_is_reached_is_not_yielded():
    items = seqs(30)
    waiting = dict.fromkeys(items)
    gen = queued_in_order(waiting.keys())
    assert next(gen) is items[0]
    del waiting[items[20]]  # admitted by another plugin's own queue
    rest = list(gen)
    assert items[20] not in rest and rest == [s for s in items[1:] if s is not items[20]]


class WalksWaitingItself:
    """A plugin whose admission generator walks the waiting queue while the scheduler admits."""

    name = "walks_waiting"

    @hookimpl
    def admission(self, ctx):
        return Candidates((s for s in queued_in_order(ctx.waiting) if s.tenant != "held"), head_of_line=False)


def test_a_plugin_walking_ctx_waiting_while_the_scheduler_admits_does_not_fail():
    engine = make_engine(plugins=[WalksWaitingItself()], max_num_seqs=4)
    for i in range(12):
        engine.add_request(request(f"r{i}", 8, 2, tenant="held" if i == 0 else "default"))
    engine.step()
    running = [s.request_id for s in engine.scheduler.running]
    assert running == ["r1", "r2", "r3", "r4"]  # r0 is held back by the plugin, the rest in order


def test_the_default_admission_under_decode_first_admits_swapped_then_waiting_in_order():
    engine = make_engine(policy="decode_first", max_num_seqs=2, preemption_mode="swap", swap_space_blocks=64)
    for i in range(6):
        engine.add_request(request(f"r{i}", 8, 3))
    run_to_end(engine)
    admitted = [rid for plan in engine.executor.plans for rid in plan.admitted]
    assert admitted == [f"r{i}" for i in range(6)]  # arrival order, each once (nothing preempted)


# --- last_admitted --------------------------------------------------------------------------------


def test_last_admitted_with_and_without_a_rank():
    a, b, c = seqs(3)
    for no, s in zip((3, 1, 2), (a, b, c)):
        s.admitted_seq_no = no
        s.state = RUNNING
    assert last_admitted([a, b, c]) is a
    assert last_admitted([a, b, c], rank=lambda s: s is not a) is c  # the last of the top rank
    assert last_admitted([]) is None
    ctx = types.SimpleNamespace(running=[a, b, c])
    assert last_admitted_victim(ctx, b) is a
    waiting = seqs(1)[0]
    assert last_admitted_victim(ctx, waiting) is None  # a waiting request preempts nobody


# --- PromptsInFlight -------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [4, 16])
def test_prompts_in_flight_count_the_blocks_still_to_come_and_drop_the_others(block_size):
    ctx = types.SimpleNamespace(blocks_needed=lambda n: -(-n // block_size))
    prefilling, decoding, preempted = seqs(3, prompt=40)
    for s in (prefilling, decoding, preempted):
        s.state = RUNNING
    prefilling.num_computed_tokens = 10
    prefilling.block_table = list(range(ctx.blocks_needed(10)))
    decoding.token_ids.append(5)
    decoding.num_computed_tokens = 40
    tracker = PromptsInFlight()
    tracker.admitted([prefilling, decoding, preempted])  # decoding: never tracked
    preempted.state = WAITING
    assert list(tracker) == [prefilling]  # preempted: dropped
    expected = ctx.blocks_needed(40) - ctx.blocks_needed(10)
    assert missing_blocks(ctx, prefilling) == expected == tracker.blocks_to_come(ctx)
    prefilling.num_computed_tokens = 39
    prefilling.token_ids.append(5)
    prefilling.num_computed_tokens = 40  # decodes now
    assert tracker.blocks_to_come(ctx) == 0 and list(tracker) == []
