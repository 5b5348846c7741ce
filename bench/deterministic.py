"""The deterministic mode's throughput cost on the torch executor: output tokens per second of the
same workload with and without `deterministic = true`, on SmolLM2-135M (or `--model`).

Workload: `--requests` requests (default 32), greedy, EOS off, random prompts of 32..`--prompt-len`
tokens and `--max-new` output tokens (default 32), all arriving at once, fcfs, chunked prefill of
the default 2,048-token budget. Each mode first runs a short warm-up (not timed). The table gives
wall seconds, the process's CPU seconds over the same interval, output tokens per wall second and
per CPU second, and the mode's cost (the slowdown, by wall and by CPU time: on a machine shared
with other work the CPU figures are the ones to read). `--rounds N` runs the two modes N times,
alternating which goes first, and gives each round's figures and the medians (the cost is the
ratio of the medians). Token counts are checked (every request produced `--max-new` tokens).
The script re-executes itself with the allocator settings of `MALLOC_ENV` when they are missing.

Run:  python bench/deterministic.py [--model smollm2] [--dtype float32] [--threads N] [--requests 32] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

NUM_BLOCKS = 1024
"""KV blocks of 16 tokens per engine: room for 64 requests of 256 tokens (with 4,096, allocated anew
by every engine under `MALLOC_ENV`, a 3-round run reached 8.2 GB and was killed for memory)."""
MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000",
              "MALLOC_TOP_PAD_": "536870912"}


def requests(n: int, prompt_len: int, max_new: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"request_id": str(i), "prompt_token_ids": [rng.randrange(vocab) for _ in range(rng.randint(32, prompt_len))],
             "sampling": {"max_new_tokens": max_new, "temperature": 0.0, "ignore_eos": True}} for i in range(n)]


def timed(ex, reqs: list[dict], deterministic: bool, warm_up: bool = True) -> tuple[float, float, int]:
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine

    if warm_up:
        eng = Engine(EngineConfig(num_blocks=NUM_BLOCKS, block_size=16, deterministic=deterministic), ex)
        eng.generate(reqs[:2])
    eng = Engine(EngineConfig(num_blocks=NUM_BLOCKS, block_size=16, deterministic=deterministic), ex)
    wall, cpu = time.perf_counter(), time.process_time()
    results = eng.generate(reqs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(len(s.output_token_ids) for seqs in results.values() for s in seqs)
    return wall, cpu, tokens


def main() -> None:
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    import statistics

    import torch

    from metroline.executors.torch import TorchExecutor

    if args.threads:
        torch.set_num_threads(args.threads)
    ex = TorchExecutor.from_options(model=args.model, dtype=args.dtype, device="cpu")
    reqs = requests(args.requests, args.prompt_len, args.max_new, ex.vocab_size)
    print(f"{args.model} {args.dtype}, {torch.get_num_threads()} threads, {args.requests} requests, prompts "
          f"32..{args.prompt_len} tokens, {args.max_new} output tokens each, {args.rounds} round(s)")
    print(f"{'round':<7}{'mode':<15}{'wall s':>9}{'cpu s':>9}{'tokens/s':>10}{'tokens/cpu s':>14}")
    walls: dict[str, list[float]] = {"default": [], "deterministic": []}
    cpus: dict[str, list[float]] = {"default": [], "deterministic": []}
    for r in range(args.rounds):
        for deterministic in ((False, True) if r % 2 == 0 else (True, False)):
            wall, cpu, tokens = timed(ex, reqs, deterministic, warm_up=r == 0)
            assert tokens == args.requests * args.max_new, tokens
            name = "deterministic" if deterministic else "default"
            walls[name].append(wall)
            cpus[name].append(cpu)
            print(f"{r + 1:<7}{name:<15}{wall:>9.2f}{cpu:>9.2f}{tokens / wall:>10.1f}{tokens / cpu:>14.1f}", flush=True)
    tokens = args.requests * args.max_new
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    for name in ("default", "deterministic"):
        print(f"{'median':<7}{name:<15}{wall[name]:>9.2f}{cpu[name]:>9.2f}{tokens / wall[name]:>10.1f}"
              f"{tokens / cpu[name]:>14.1f}")
    print(f"cost: {wall['deterministic'] / wall['default']:.2f}x slower by wall time, "
          f"{cpu['deterministic'] / cpu['default']:.2f}x by CPU time, in the deterministic mode")


if __name__ == "__main__":
    main()
