"""What stacking `decode_first` on the default admission costs: Engine.step time per step with
4,000 requests waiting.

Issue 10 reported that stacking `decode_first` on the default policy doubled the step time at
4,000 waiting: `decode_first` answers no `admission`, so the engine's built-in default admission
(`metroline.core.plugins.defaults`) ordered the queues, and it copied both of them every step. It now walks them
lazily (`core.plugins.queue_order.queued_in_order`).

Workload: `--running` requests (default 16) in steady decode (64-token prompts, outputs that
outlast the run) and `--waiting` (default 4,000) behind them, which cannot be admitted (every slot
is taken): each step serves the decodes and asks the admission hook for candidates, as a loaded
server does. Nothing is preempted (the pool holds every running request to its last token).

Rows:
- `default`: the configuration's default policy, `fcfs` (its own lazy arrival heap);
- `default + decode_first`: `fcfs` with `decode_first` stacked on it;
- `decode_first on the built-in defaults`: `--policy decode_first`, where the admission is the
  built-in default one: the row of the issue.

Timed: `Engine.step` on the simulated executor, the thread's CPU time (`time.thread_time`),
garbage collector off, after warm-up steps; median and mean per step. The target: each stacked row
within 10% of `default`.

Run:  python bench/stacked_admission.py [--running 16] [--waiting 4000] [--steps 500]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time

PROMPT = 64
BLOCK_SIZE = 16
WARMUP_STEPS = 100

ROWS = (
    ("default", "fcfs", []),
    ("default + decode_first", "fcfs", ["decode_first"]),
    ("decode_first on the built-in defaults", "decode_first", []),
)


def step_times(policy: str, plugins: list[str], running: int, waiting: int, steps: int) -> list[float]:
    """Seconds of CPU time of each of `steps` timed `Engine.step` calls."""
    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.step.engine import Engine

    output = WARMUP_STEPS + steps + 16
    per_request = math.ceil((PROMPT + output) / BLOCK_SIZE) + 1
    config = EngineConfig(
        policy=policy, plugins=plugins, max_num_seqs=running, max_num_batched_tokens=8192,
        num_blocks=running * per_request, block_size=BLOCK_SIZE, max_model_len=PROMPT + output,
    )
    engine = Engine(config, retain_finished=False)
    sampling = SamplingParams(max_new_tokens=output, ignore_eos=True, temperature=0.0)
    for i in range(running + waiting):
        prompt = [(i * 7919 + j * 31) % 29_000 + 1000 for j in range(PROMPT)]
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling=sampling))
    for _ in range(WARMUP_STEPS):
        engine.step()
    assert engine.scheduler.total_preemptions == 0 and len(engine.scheduler.waiting) == waiting
    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            t0 = time.thread_time()
            engine.step()
            times.append(time.thread_time() - t0)
    finally:
        gc.enable()
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, default=16, help="requests decoding (the slots), default 16")
    ap.add_argument("--waiting", type=int, default=4000, help="requests waiting behind them, default 4000")
    ap.add_argument("--steps", type=int, default=500, help="timed steps per row, default 500")
    args = ap.parse_args(argv)
    print(f"{args.running} running (steady decode) + {args.waiting} waiting; Engine.step, CPU time, "
          f"{args.steps} steps after {WARMUP_STEPS} warm-up steps")
    base = None
    for label, policy, plugins in ROWS:
        times = step_times(policy, plugins, args.running, args.waiting, args.steps)
        median, mean = statistics.median(times) * 1e6, statistics.fmean(times) * 1e6
        if base is None:
            base, ratio = median, ""
        else:
            ratio = f"{median / base - 1:+.1%} vs default"
        print(f"{label:<40} {median:8.1f} us/step median {mean:8.1f} mean   {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
