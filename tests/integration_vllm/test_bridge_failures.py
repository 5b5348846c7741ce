"""Failures scoped to their cause inside vLLM, and `MetrolineAsyncScheduler`, at the schedule level:
vLLM's real scheduler classes driven step by step as vLLM's engine core drives them
(`bench/vllm_engine_loop.py`: synchronously, or with the batch queue of `--async-scheduling`),
with the referee harness's fake model runner and step clock.

- A request the plugins refuse, or whose own plugin call raises (`check_request`, `on_arrival`,
  `estimate_output_tokens` asked in the step's admission), ends with vLLM's finish reason 'error'
  and no token, the error logged naming the plugin, the hook and the request; every other request
  is scheduled step for step as vLLM's own scheduler schedules the workload without it, and gets
  its whole output; no KV block stays held.
- A plugin error of no one request (`select_victim` raising, `admission` raising in the middle of
  vLLM's step, `on_tokens` raising) fails exactly the requests it left in doubt; the others
  complete.
- `MetrolineAsyncScheduler` with its default stack schedules every step as vLLM's `AsyncScheduler`.

Needs vLLM (skipped without it)."""

from __future__ import annotations

import importlib.util
import logging
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm")

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
_spec = importlib.util.spec_from_file_location("vllm_engine_loop", BENCH / "vllm_engine_loop.py")
loop = importlib.util.module_from_spec(_spec)
sys.modules["vllm_engine_loop"] = loop  # its dataclass looks its module up
_spec.loader.exec_module(loop)
vb = loop.vb

from metroline.core.workloads.items import Workload, WorkloadItem  # noqa: E402
from metroline.integrations.vllm import MetrolineAsyncScheduler, MetrolineScheduler  # noqa: E402
from metroline.tests.integration_vllm import faulty_plugins  # noqa: E402

FAULTY = "metroline.tests.integration_vllm.faulty_plugins:Faulty"
ASKS = "metroline.tests.integration_vllm.faulty_plugins:AsksEstimates"
VICTIM = "metroline.tests.integration_vllm.faulty_plugins:VictimRaises"
TOKENS = "metroline.tests.integration_vllm.faulty_plugins:TokensRaise"
ADMISSION = "metroline.tests.integration_vllm.faulty_plugins:AdmissionRaises"
BAD = 3  # the request that fails in the workload below

ENGINE = {"num_blocks": 64, "block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 128,
          "max_model_len": 4096, "step_time": 0.01, "policy": "fcfs", "max_prefill_chunk": None,
          "max_prefill_chunk_adaptive": False, "enable_prefix_caching": False}


def workload(n: int = 10, skip: int | None = None) -> Workload:
    """n requests arriving 5 ms apart (prompts 20-200 tokens, outputs 6-30 tokens), without request
    `skip` (the others keep their places)."""
    items = [WorkloadItem(0.005 * i, ((("u", 7, i), 20 + (i * 37) % 180),), 6 + (i * 11) % 25)
             for i in range(n)]
    return Workload("failures", [it for i, it in enumerate(items) if i != skip])


@pytest.fixture(scope="module")
def model_dir():
    with tempfile.TemporaryDirectory() as tmp:
        yield vb.tiny_model_dir(tmp)


@pytest.fixture
def bridge_log():
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(logging.ERROR)
    logger = logging.getLogger("vllm.metroline")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def renamed(trace: list, skip: int) -> list:
    """`trace` of the workload without request `skip`, its request ids as in the whole workload;
    empty steps dropped."""
    def rid(r: str) -> str:
        return str(int(r) + (int(r) >= skip))

    return [([(rid(r), n) for r, n in sched], sorted(rid(r) for r in pre)) for sched, pre in trace if sched or pre]


def nonempty(trace: list) -> list:
    return [step for step in trace if step[0] or step[1]]


def assert_clean(scheduler, engine: dict) -> None:
    """Nothing left: no request in vLLM or in the bridge, every KV block free."""
    assert scheduler.requests == {}
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == engine["num_blocks"]
    bridge = getattr(scheduler, "metroline", None)
    if bridge is not None:
        assert bridge.seqs == {} and not bridge.running and not bridge.waiting and not bridge.failed


def assert_whole(seen, work: Workload, failed: set[str]) -> None:
    """Requests in `failed` ended with 'error' short of their output; every other one got its
    whole output."""
    for i, item in enumerate(work.items):
        rid = str(i)
        if rid in failed:
            assert seen.finish[rid] == "error" and len(seen.tokens[rid]) < item.output_len, rid
        else:
            assert (seen.finish[rid], len(seen.tokens[rid])) == ("length", item.output_len), rid


def fail_bad(how: str):
    return lambda i, item: {"fail_in": how} if i == BAD else None


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("how, hook, stack", [
    ("refuse", "check_request", [FAULTY]),
    ("check_request", "check_request", [FAULTY]),
    ("on_arrival", "on_arrival", [FAULTY]),
    ("estimate_output_tokens", "estimate_output_tokens", [FAULTY, ASKS]),  # raised in the step's admission
])
def test_one_requests_plugin_error_ends_it_alone_and_the_others_are_vllms_schedule_without_it(
        how, hook, stack, asynchronous, model_dir, bridge_log):
    cls = MetrolineAsyncScheduler if asynchronous else MetrolineScheduler
    whole, without = workload(), workload(skip=BAD)
    want = loop.drive(loop.build(ENGINE, model_dir, asynchronous=asynchronous), without, 0.01, asynchronous)
    scheduler = loop.build(ENGINE, model_dir, cls, {"policy": "fcfs", "plugins": stack}, asynchronous)
    got = loop.drive(scheduler, whole, 0.01, asynchronous, extra_args=fail_bad(how))
    assert nonempty(got.trace) == renamed(want.trace, BAD)
    assert_whole(got, whole, {str(BAD)})
    assert got.tokens[str(BAD)] == []
    assert_clean(scheduler, ENGINE)
    if how == "refuse":
        assert f"metroline refused request {BAD}: faulty: this request is refused by the test" in bridge_log
    else:
        assert [m for m in bridge_log if f"plugin 'faulty', hook '{hook}', request '{BAD}': raised" in m], bridge_log


def test_a_select_victim_error_of_no_request_fails_the_running_requests_and_the_engine_serves_on(model_dir):
    engine = dict(ENGINE, num_blocks=24)  # tight: running requests run out of blocks
    faulty_plugins.RAISED.clear()
    scheduler = loop.build(engine, model_dir, MetrolineScheduler, {"policy": "fcfs", "plugins": [VICTIM]})
    work = workload(12)
    seen = loop.drive(scheduler, work, 0.01)
    raised = faulty_plugins.RAISED
    assert raised, "the pool is not tight enough to ask select_victim"
    in_doubt = {rid for _, running in raised for rid in running}
    assert_whole(seen, work, in_doubt)  # exactly those running when it raised fail
    assert len(in_doubt) < len(work.items)  # and the engine served the others to their end
    assert_clean(scheduler, engine)


def test_an_admission_error_of_no_request_in_vllms_step_fails_the_running_and_the_engine_serves_on(model_dir):
    faulty_plugins.RAISED.clear()
    scheduler = loop.build(ENGINE, model_dir, MetrolineScheduler, {"policy": "fcfs", "plugins": [ADMISSION]})
    work = workload()
    seen = loop.drive(scheduler, work, 0.01)
    [(_, running)] = faulty_plugins.RAISED
    assert len(running) >= 2  # one running before the step, one admitted by it
    assert_whole(seen, work, set(running))
    assert len(running) < len(work.items)
    assert_clean(scheduler, ENGINE)


def test_an_on_tokens_error_of_no_request_fails_that_steps_sampled_requests_only(model_dir):
    faulty_plugins.RAISED.clear()
    scheduler = loop.build(ENGINE, model_dir, MetrolineScheduler, {"policy": "fcfs", "plugins": [TOKENS]})
    work = workload()
    seen = loop.drive(scheduler, work, 0.01, extra_args=fail_bad("on_tokens"))
    [(_, sampled)] = faulty_plugins.RAISED
    assert str(BAD) in sampled and len(sampled) < len(work.items)
    assert_whole(seen, work, set(sampled))
    assert_clean(scheduler, ENGINE)


ASYNC_SEEDS = range(12)


@pytest.mark.parametrize("seed", ASYNC_SEEDS)
def test_the_async_bridge_schedules_every_step_as_vllms_async_scheduler(seed, model_dir):
    name, engine, work = vb.fuzz_cases(1, seed)[0]
    assert loop.async_identity(name, engine, work, model_dir) is None


def test_the_async_fuzz_covers_both_policies_preemption_and_chunk_caps(model_dir):
    cases = vb.fuzz_cases(len(ASYNC_SEEDS))
    assert {e["policy"] for _, e, _ in cases} == {"fcfs", "priority"}
    assert any(e["max_prefill_chunk"] for _, e, _ in cases)
    preempting = 0
    for _, engine, work in cases:
        seen = loop.drive(loop.build(engine, model_dir, asynchronous=True), work, engine["step_time"], True)
        preempting += any(pre for _, pre in seen.trace)
        assert set(seen.finish.values()) == {"length"}
    assert preempting >= 2
