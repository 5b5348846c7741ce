"""Scheduler overhead: microseconds per step and per scheduled request, in steady decode.

Setting (as in the issue): 256 running requests decoding, 4,096 waiting behind them (max_num_seqs
is 256, so admission looks at the queue every step and admits nothing). Prompts are 64 tokens,
outputs long enough that nobody finishes during the measurement.

Prints the cost of `Scheduler.schedule` alone (the decisions: budget split, ordering, block
allocation, admission), and of the whole `Engine.step` on the simulated executor (schedule, the
cost model, commit of computed blocks, sampling hook, token append, stop checks, metrics).

Run:  MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 \
      MALLOC_TOP_PAD_=536870912 python bench/scheduler_overhead.py [--policy fcfs] [--steps 2000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from metroline.core.config import EngineConfig
from metroline.core.engine import Engine
from metroline.core.request import Request, SamplingParams


def build(policy: str, plugins: list[str], running: int, waiting: int) -> Engine:
    config = EngineConfig(
        policy=policy, plugins=plugins, max_num_seqs=running, max_num_batched_tokens=16384,
        num_blocks=(running + waiting) * 8, block_size=16, max_model_len=100_000,
    )
    engine = Engine(config)
    sampling = SamplingParams(max_new_tokens=50_000, ignore_eos=True, temperature=0.0)
    for i in range(running + waiting):
        prompt = [(i * 131 + j) % 30_000 + 1 for j in range(64)]
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling=sampling, arrival_time=0.0))
    while len(engine.scheduler.running) < running or any(not s.is_decoding for s in engine.scheduler.running):
        engine.step()
    return engine


def measure(engine: Engine, steps: int) -> tuple[list[float], list[float], int]:
    scheduler, executor = engine.scheduler, engine.executor
    sched_us, step_us, scheduled = [], [], 0
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            # scheduler alone: schedule, then let the engine finish the step from that plan
            t0 = time.perf_counter()
            plan = scheduler.schedule(executor.now())
            t1 = time.perf_counter()
            result = executor.execute(plan)
            scheduler.commit(plan)
            outputs: list = []
            engine._sample(plan, result.logits, result.time, outputs)
            engine._record_step(plan, result.time, t0)
            engine._reap()
            sched_us.append((t1 - t0) * 1e6)
            scheduled += plan.num_seqs
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            step_us.append((time.perf_counter() - t0) * 1e6)
    finally:
        gc.enable()
    return sched_us, step_us, scheduled // steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--plugin", action="append", default=[])
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--waiting", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    engine = build(args.policy, args.plugin, args.running, args.waiting)
    assert len(engine.scheduler.running) == args.running and len(engine.scheduler.waiting) == args.waiting
    sched, step, per_step = measure(engine, args.steps)
    s_med, e_med = statistics.median(sched), statistics.median(step)
    print(f"policy={'+'.join([args.policy, *args.plugin])} running={args.running} waiting={args.waiting} "
          f"steps={args.steps} scheduled/step={per_step}")
    print(f"schedule():  {s_med:8.1f} us/step (median; p90 {statistics.quantiles(sched, n=10)[-1]:.1f})"
          f"  {s_med / per_step:6.2f} us per scheduled request")
    print(f"engine.step: {e_med:8.1f} us/step (median; p90 {statistics.quantiles(step, n=10)[-1]:.1f})"
          f"  {e_med / per_step:6.2f} us per scheduled request")


if __name__ == "__main__":
    main()
