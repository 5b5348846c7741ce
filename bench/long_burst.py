"""A long-prompt burst into a server decoding chats: does the budget split stall the decodes?

Workload: the built-in `long-burst` (600 chats of 256 prompt / 256 output tokens, tenant "chat",
poisson 20 req/s, plus 16 prompts of 8,192 tokens, tenant "burst", all at t = 10 s), and the same
chats without the burst (items of tenant "chat" only). `--rate-scale 5.5` offers the chats at 1.1x
capacity (256 slots / (256 output tokens x 0.01 s) = 100 req/s); the burst then comes at 10/5.5 s.

Settings (engine defaults, `steps` cost model, 0.01 s a step): a 2,048-token step budget, 256
slots, 8,192 blocks of 16 tokens. The burst is 131,072 prompt tokens = 64 full budgets, so a
split that lets prefill take whole steps stops every decode for about 64 steps (0.64 s) where the
chats otherwise get a token every step. `decode_first` runs with its default 512-token chunk cap.

A stall is one long gap per decoding chat: out of the 255 gaps of each chat, well under 1 %, so
the pooled p99 inter-token latency cannot see it. The table shows it where it is: the largest
gap (`itl max`), the chat gaps of 10 steps or more, and the steps where requests were decoding
and none got a token (`zero-dec`).

With `--cost-model roofline` (the default of `metroline run`: llama-3-8b on an A100) a step's time
grows with its tokens: a full 2,048-token prefill step takes about 0.15 s against a decode step's
0.01-0.02 s, and a long gap is one of at least 10 x the chats' median inter-token latency.

Run:  python bench/long_burst.py [--rate-scale 5.5] [--seed 0] [--cost-model roofline]
"""

from __future__ import annotations

import argparse

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.workloads.build import Workload, build_workload
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

CASES = (
    ("no burst", "default", []),
    ("no burst", "decode_first", ["decode_first"]),
    ("no burst", "prefill_first", ["prefill_first"]),
    ("burst", "default", []),
    ("burst", "decode_first", ["decode_first"]),
    ("burst", "prefill_first", ["prefill_first"]),
)


def chats_only(workload: Workload) -> Workload:
    """The same workload without the burst: its items of tenant "chat"."""
    return Workload(f"{workload.name} (chats only)", [it for it in workload.items if it.tenant == "chat"],
                    workload.description, dict(workload.params))


STEP_S = 0.01


def run_case(workload: Workload, plugins: list[str], policy: str = "fcfs", cost_model: str = "steps") -> dict:
    """Run one case (engine defaults); return the chats' ITL figures and the run's stall counters."""
    config = EngineConfig(policy=policy, plugins=plugins)
    params = {"step_time": STEP_S} if cost_model == "steps" else {}
    doc, engine = run_workload(workload, config, SimulatedExecutor(make_cost_model(cost_model, **params)))
    chat = doc["tenants"]["chat"]
    long_gap = 10 * (STEP_S if cost_model == "steps" else chat["itl_s"]["p50"])
    long_gaps = sum(
        1
        for r in engine.metrics.requests
        if r.tenant == "chat"
        for a, b in zip(r.token_times, r.token_times[1:])
        if b - a >= long_gap - 1e-9
    )
    return {
        "itl_p50": chat["itl_s"]["p50"],
        "itl_p99": chat["itl_s"]["p99"],
        "itl_max": chat["itl_s"]["max"],
        "long_gaps": long_gaps,
        "zero_decode_steps": doc["summary"]["zero_decode_steps"],
        "preemptions": doc["summary"]["preemptions"],
        "chat_ttft_p99": chat["ttft_s"]["p99"],
        "burst_ttft_p99": doc["tenants"]["burst"]["ttft_s"]["p99"] if "burst" in doc["tenants"] else None,
        "steps": doc["summary"]["steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cost-model", choices=("steps", "roofline"), default="steps",
                        help=f"steps ({STEP_S} s a step, the default here) or roofline (llama-3-8b on an A100)")
    args = parser.parse_args()

    burst = build_workload("long-burst", seed=args.seed, rate_scale=args.rate_scale)
    workloads = {"burst": burst, "no burst": chats_only(burst)}
    model = f"steps cost model ({STEP_S} s)" if args.cost_model == "steps" else "roofline llama-3-8b on A100"
    print(f"long-burst seed {args.seed}, rate_scale {args.rate_scale}, {model}, "
          "fcfs, engine defaults (budget 2048, 256 slots, 8192 blocks)")
    header = (f"{'workload':<9} {'split':<14} {'itl p50 ms':>10} {'itl p99 ms':>10} {'itl max ms':>10} "
              f"{'long gaps':>14} {'zero-dec':>8} {'preempt':>7} {'chat ttft p99 s':>15} "
              f"{'burst ttft p99 s':>16} {'steps':>6}")
    print(header)
    print("-" * len(header))
    for wname, split, plugins in CASES:
        r = run_case(workloads[wname], plugins, cost_model=args.cost_model)
        burst_ttft = "-" if r["burst_ttft_p99"] is None else f"{r['burst_ttft_p99']:.3f}"
        print(f"{wname:<9} {split:<14} {1e3 * r['itl_p50']:>10.1f} {1e3 * r['itl_p99']:>10.1f} "
              f"{1e3 * r['itl_max']:>10.1f} {r['long_gaps']:>14} {r['zero_decode_steps']:>8} "
              f"{r['preemptions']:>7} {r['chat_ttft_p99']:>15.3f} {burst_ttft:>16} {r['steps']:>6}")


if __name__ == "__main__":
    main()
