"""Scheduler overhead: microseconds per step and per request actually scheduled in the timed steps.

Workloads (`--workload`):
- `anchor` (default; the setting vLLM's figure is quoted for): 16-token prompts, 256-token
  outputs, N running (`--running`, default 256) plus 3,840 waiting; each request that finishes is
  replaced by a new one, so the queue stays N + 3,840 long and the timed steps include the waves
  of admissions (prefill steps) as well as the decodes.
- `decode`: N running requests in steady decode (64-token prompts, outputs that outlast the run)
  and 4,096 waiting behind them: admission looks at the queue every step and admits nothing.

The KV pool holds every running request to its last token (`running * ceil((prompt + output) /
block_size)` blocks plus one block per request), so nothing is preempted; the bench counts the
preemptions in the timed steps and refuses to print a figure if there were any.

What is timed (the thread's CPU time around each call, `time.thread_time`, so that other
processes on a shared machine do not count; `--clock wall` for `time.perf_counter`; garbage
collector off; one figure per step):
- `Engine.step`: the whole step on the simulated executor (`steps` cost model): reap of ended
  requests, `Scheduler.schedule` (budget split, order, block allocation, admission), the
  executor's cost model and clock, commit of computed blocks to the prefix index, the `sample`
  hook, token append, stop checks, metrics recording, observer hooks.
- `schedule()`: `Scheduler.schedule` alone (the rest of the step runs outside the timer).
Outside the timed region: submitting replacement requests (pydantic validation, as a server's
front end does) and reading the step's counts.

The figure per scheduled request is (sum of the timed seconds) / (sum of the requests scheduled in
those same steps). With `--vllm` (default: when vLLM is importable here, or `--vllm-python` names
an interpreter that has it, e.g. /work/vllm-venv/bin/python) it also drives vLLM's v1 `Scheduler`
on the same workload with a fake model runner (one sampled token per request that reached the end
of its known tokens), timing `schedule()` + `update_from_output()` per step, and prints both.

Run:  MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 \\
      MALLOC_TOP_PAD_=536870912 python bench/scheduler_overhead.py [--workload anchor] \\
      [--running 256] [--policy fcfs] [--steps 1024] [--vllm-python /work/vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = {
    # name: (prompt tokens, output tokens, waiting, replace finished requests)
    "anchor": (16, 256, 3840, True),
    "decode": (64, None, 4096, False),
}
BLOCK_SIZE = 16
MAX_BATCHED_TOKENS = 8192
WARMUP_STEPS = 300
CLOCK = time.thread_time  # --clock wall: time.perf_counter


def sizes(workload: str, running: int, steps: int) -> tuple[int, int, int, bool, int, int]:
    """(prompt, output, waiting, replace, max_model_len, num_blocks) of a workload: the pool holds
    every running request to its last token, plus a block each."""
    prompt, output, waiting, replace = WORKLOADS[workload]
    if output is None:  # outlasts warm-up and both timed phases
        output = WARMUP_STEPS + 2 * steps + 64
    per_request = math.ceil((prompt + output) / BLOCK_SIZE) + 1
    return prompt, output, waiting, replace, prompt + output, running * per_request


def prompt_of(i: int, n: int) -> list[int]:
    """Unique prompt tokens of request `i` (no prefix is shared between requests)."""
    return [(i * 7919 + j * 31) % 29_000 + 1000 + (j == 0) * (i % 1000) for j in range(n)]


# ----------------------------------------------------------------------------------------------
# metroline


def metroline_figures(args: argparse.Namespace) -> dict:
    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.results.metrics import NUM_SEQS, PREEMPTIONS
    from metroline.core.step.engine import Engine

    prompt, output, waiting, replace, max_len, num_blocks = sizes(args.workload, args.running, args.steps)
    config = EngineConfig(
        policy=args.policy, plugins=args.plugin, max_num_seqs=args.running,
        max_num_batched_tokens=MAX_BATCHED_TOKENS, num_blocks=num_blocks, block_size=BLOCK_SIZE,
        max_model_len=max_len,
    )
    engine = Engine(config, retain_finished=False)
    sampling = SamplingParams(max_new_tokens=output, ignore_eos=True, temperature=0.0)
    submitted = 0

    def submit(count: int) -> None:
        nonlocal submitted
        for _ in range(count):
            engine.add_request(Request(
                request_id=f"r{submitted}", prompt_token_ids=prompt_of(submitted, prompt), sampling=sampling,
            ))
            submitted += 1

    submit(args.running + waiting)
    steps, records = engine.metrics.steps, engine.metrics.requests

    def run(n: int, timed_call) -> tuple[list[float], int, int]:
        times, scheduled, preempted = [], 0, 0
        for _ in range(n):
            finished = len(records)
            seconds, num_seqs, num_preempted = timed_call()
            times.append(seconds)
            scheduled += num_seqs
            preempted += num_preempted
            if replace:
                submit(len(records) - finished)
        return times, scheduled, preempted

    def whole_step() -> tuple[float, int, int]:
        t0 = CLOCK()
        engine.step()
        t1 = CLOCK()
        if engine.last_plan_empty:
            return t1 - t0, 0, 0
        row = steps[-1]
        return t1 - t0, row[NUM_SEQS], row[PREEMPTIONS]

    scheduler, executor = engine.scheduler, engine.executor
    reaper = getattr(engine, "_reaper", None)  # an older tree (a before/after pair) reaps in Engine._reap
    reap = reaper.reap if reaper is not None else engine._reap

    def schedule_only() -> tuple[float, int, int]:
        reap()
        start = executor.now()
        t0 = CLOCK()
        plan = scheduler.schedule(start)
        t1 = CLOCK()
        result = executor.execute(plan)
        scheduler.commit(plan)
        engine._sample(plan, result.logits, result.time, None)
        engine._record_step(plan, result.time, start)
        engine.plugins.hook.on_step_end(ctx=scheduler.ctx, plan=plan)
        return t1 - t0, len(plan.scheduled), len(plan.preempted)

    run(WARMUP_STEPS, whole_step)
    gc.collect()
    gc.disable()
    try:
        sched = run(args.steps, schedule_only)
        step = run(args.steps, whole_step)
    finally:
        gc.enable()
    return {"schedule()": sched, "Engine.step": step}


# ----------------------------------------------------------------------------------------------
# vLLM v1 (run in an interpreter that has vllm installed; imports nothing from metroline)


def vllm_figures(args: argparse.Namespace) -> dict:
    import types

    import torch
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    prompt, output, waiting, replace, max_len, num_blocks = sizes(args.workload, args.running, args.steps)
    scheduler_config = SchedulerConfig(
        max_num_seqs=args.running, max_num_batched_tokens=MAX_BATCHED_TOKENS, max_model_len=max_len,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = num_blocks
    config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    # the scheduler reads a handful of model facts; a text-only decoder model
    config.model_config = types.SimpleNamespace(
        uses_mrope=False, is_encoder_decoder=False, max_model_len=max_len, runner_type="generate",
        is_diffusion=False, supports_multimodal_inputs=False, multimodal_config=None,
        return_sampling_mask=False, skip_tokenizer_init=True,
    )
    kv = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.float16))],
    )
    scheduler = Scheduler(config, kv, StructuredOutputManager(config), block_size=BLOCK_SIZE, log_stats=False)
    sampling = SamplingParams(max_tokens=output, ignore_eos=True, temperature=0.0)
    submitted = 0

    def submit(count: int) -> None:
        nonlocal submitted
        for _ in range(count):
            scheduler.add_request(Request(f"r{submitted}", prompt_of(submitted, prompt), sampling, None))
            submitted += 1

    submit(args.running + waiting)
    total = args.running + waiting

    def one_step() -> tuple[float, int, int]:
        t0 = CLOCK()
        out = scheduler.schedule()
        t1 = CLOCK()
        # the fake model runner: one token for each request whose computed tokens reach its known tokens
        ids = list(out.num_scheduled_tokens)
        requests = scheduler.requests
        sampled = [[7] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                          sampled_token_ids=sampled)
        t2 = CLOCK()
        scheduler.update_from_output(out, runner_output)
        t3 = CLOCK()
        return (t1 - t0) + (t3 - t2), len(ids), len(out.preempted_req_ids or ())

    def run(n: int) -> tuple[list[float], int, int]:
        times, scheduled, preempted = [], 0, 0
        for _ in range(n):
            seconds, num, pre = one_step()
            times.append(seconds)
            scheduled += num
            preempted += pre
            if replace:
                submit(total - len(scheduler.requests))
        return times, scheduled, preempted

    run(WARMUP_STEPS)
    gc.collect()
    gc.disable()
    try:
        step = run(args.steps)
    finally:
        gc.enable()
    import vllm

    return {f"vLLM {vllm.__version__} schedule()+update_from_output()": step}


def vllm_in(python: str | None, args: argparse.Namespace) -> dict | None:
    """vLLM's figures from this interpreter when it has vllm, else from `python`, else None."""
    if importlib.util.find_spec("vllm") is not None:
        return vllm_figures(args)
    if not python or not os.path.exists(python):
        return None
    cmd = [python, os.path.abspath(__file__), "--vllm-only", "--clock", args.clock, "--workload", args.workload,
           "--running", str(args.running), "--steps", str(args.steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    if done.returncode != 0:
        print(f"vLLM run failed ({python}):\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------


def report(name: str, figures: tuple[list[float], int, int]) -> str:
    times, scheduled, preempted = figures
    if preempted:
        return f"{name:<48} INVALID: {preempted} preemptions in the timed steps (the pool is too small)"
    us = [t * 1e6 for t in times]
    per_step = scheduled / len(times)
    return (f"{name:<48} {statistics.median(us):8.1f} us/step median  {sum(us) / len(us):8.1f} mean"
            f"  {per_step:6.1f} scheduled/step  {sum(us) / scheduled:6.2f} us per scheduled request")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="anchor")
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--plugin", action="append", default=[])
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1024, help="timed steps per figure")
    ap.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure vLLM's v1 scheduler when it is available (default: yes)")
    ap.add_argument("--vllm-python", default=os.environ.get("METROLINE_VLLM_PYTHON", "/work/vllm-venv/bin/python"),
                    help="an interpreter with vllm installed, used when this one has none")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: this thread's CPU time (default; immune to other processes); wall: perf_counter")
    ap.add_argument("--vllm-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.vllm_only:
        print(json.dumps(vllm_figures(args)))
        return
    prompt, output, waiting, replace, _, num_blocks = sizes(args.workload, args.running, args.steps)
    figures = metroline_figures(args)
    print(f"workload={args.workload}: {args.running} running + {waiting} waiting, {prompt}-token prompts, "
          f"{output}-token outputs{', finished requests replaced' if replace else ''}; {num_blocks} blocks of "
          f"{BLOCK_SIZE}; {args.steps} timed steps after {WARMUP_STEPS} warm-up steps")
    print(f"policy={'+'.join([args.policy, *args.plugin])}; clock: {args.clock}")
    for name, fig in figures.items():
        print(report(f"metroline {name}", fig))
    if args.vllm:
        theirs = vllm_in(args.vllm_python, args)
        if theirs is None:
            print("vLLM: not installed here (pass --vllm-python PATH to an interpreter that has it)")
        for name, fig in (theirs or {}).items():
            print(report(name, tuple(fig)))


if __name__ == "__main__":
    main()
