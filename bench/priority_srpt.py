"""Figures for the `priority` and `srpt` policies (simulation, `steps` cost model, 0.01 s a step;
`--cost-model roofline`: the default cost model of `metroline run`, llama-3-8b on an A100).

1. SRPT against FCFS on the Azure conversation trace (`azure-conv`) at 1.1 x capacity, capacity =
   max_num_seqs / (mean output tokens x step time) for 32 slots (under roofline, where a step's
   time grows with its tokens: the request throughput of fcfs with every request arriving at
   once): mean E2E, with oracle lengths
   (`--oracle-lengths`), with learned per-tenant estimates, with the literal token count
   (`prefill_weight` 1.0) and with the starvation guard. The first 3000 requests (as in the test),
   and with `--full` the whole trace.
2. Two priority classes (the `chat` workload, seed 0: a fifth of the requests priority 0, the rest
   priority 1) at 1.1 x the capacity of 32 slots: the urgent class's p99 TTFT under FCFS and
   `priority` (with and without preemption for waiting requests, with aging).
3. The aging bound and the guard bound on the workloads of the tests (urgent / short requests that
   alone keep 4 slots busy): the worst wait of the starved class with and without aging / guard.

Each line also prints the equivalent `metroline run` command where there is one.

Run:  python bench/priority_srpt.py [--full] [--requests 3000] [--cost-model roofline]
"""

from __future__ import annotations

import argparse
import time

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.results.metrics import distribution
from metroline.core.workloads.build import Workload, WorkloadItem, build_workload
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

STEP = 0.01
COST_MODEL = ["steps"]  # --cost-model: the aging and guard bounds are in steps, so they keep it


def executor(cost_model: str | None = None) -> SimulatedExecutor:
    name = cost_model or COST_MODEL[0]
    return SimulatedExecutor(make_cost_model(name, **({"step_time": STEP} if name == "steps" else {})))


def run(workload: Workload, policy: str, options: dict | None = None, *, slots: int, oracle: bool = False,
        cost_model: str | None = None):
    config = EngineConfig(policy=policy, max_num_seqs=slots, plugin_options={policy: options or {}})
    t = time.perf_counter()
    doc, engine = run_workload(workload, config, executor(cost_model), oracle_lengths=oracle)
    return doc, engine.metrics.requests, time.perf_counter() - t


def rate_scale_for(source: str, slots: int, **kw) -> tuple[float, float, float]:
    """(rate_scale for 1.1 x capacity, capacity req/s, mean output tokens) of a workload."""
    workload = build_workload(source, **kw)
    items = workload.items
    mean_out = sum(it.output_len for it in items) / len(items)
    native = (len(items) - 1) / items[-1].arrival_s
    if COST_MODEL[0] == "steps":
        capacity = slots / (mean_out * STEP)
    else:  # saturated: every request at once
        doc, _, _ = run(build_workload(source, rate_scale=1e9, **kw), "fcfs", slots=slots)
        capacity = doc["summary"]["completed"] / doc["summary"]["duration_s"]
    return 1.1 * capacity / native, capacity, mean_out


def azure(max_requests: int | None, slots: int = 32) -> None:
    scale, capacity, mean_out = rate_scale_for("azure-conv", slots, max_requests=max_requests)
    workload = build_workload("azure-conv", max_requests=max_requests, rate_scale=scale)
    n = len(workload)
    print(f"\n## azure-conv, {n} requests, {slots} slots: mean output {mean_out:.2f} tokens, capacity "
          f"{capacity:.3f} req/s, offered {1.1 * capacity:.3f} req/s (rate_scale {scale:.6f})")
    cli = (f"metroline run --workload azure-conv {'--max-requests %d ' % max_requests if max_requests else ''}"
           f"--rate-scale {scale:.6f} --max-num-seqs {slots} --cost-model {COST_MODEL[0]}")
    runs = [
        ("fcfs", "fcfs", {}, False, ""),
        ("srpt, oracle lengths", "srpt", {}, True, " --oracle-lengths"),
        ("srpt, learned estimates", "srpt", {}, False, ""),
        ("srpt, oracle, prefill_weight 1.0", "srpt", {"prefill_weight": 1.0}, True, " --oracle-lengths"),
        ("srpt, oracle, max_wait_s 60", "srpt", {"max_wait_s": 60.0}, True, " --oracle-lengths"),
    ]
    base = None
    print(f"{'policy':<34} {'E2E mean':>9} {'/ fcfs':>7} {'E2E p99':>9} {'queue max':>10} {'wall s':>7}")
    for label, policy, options, oracle, flag in runs:
        doc, _, wall = run(workload, policy, options, slots=slots, oracle=oracle)
        s = doc["summary"]
        e2e = s["e2e_s"]["mean"]
        base = base or e2e
        print(f"{label:<34} {e2e:9.3f} {e2e / base:7.3f} {s['e2e_s']['p99']:9.3f} {s['queue_s']['max']:10.3f} {wall:7.1f}")
        opts = ", ".join(f"{k} = {v}" for k, v in options.items())
        note = f"  --config FILE  (FILE: [plugin_options.srpt] {opts})" if options else ""
        print(f"    {cli} --policy {policy}{flag}{note}")


def two_classes(slots: int = 32) -> None:
    scale, capacity, mean_out = rate_scale_for("chat", slots, seed=0)
    workload = build_workload("chat", seed=0, rate_scale=scale)
    print(f"\n## chat (seed 0), two classes, {slots} slots: mean output {mean_out:.3f} tokens, capacity "
          f"{capacity:.3f} req/s, offered {1.1 * capacity:.3f} req/s (rate_scale {scale:.6f}), "
          f"{sum(it.priority == 0 for it in workload)} urgent of {len(workload)}")
    print(f"{'policy':<36} {'urgent TTFT p99':>16} {'/ fcfs':>7} {'urgent mean':>12} {'prio-1 p99':>11} {'preempt':>8}")
    base = None
    for label, policy, options in (
        ("fcfs", "fcfs", {}),
        ("priority (preempt_threshold 1.0)", "priority", {}),
        ("priority, preempt_threshold None", "priority", {"preempt_threshold": None}),
        ("priority, aging_rate 0.5", "priority", {"aging_rate": 0.5}),
        ("priority, aging_rate 1.0", "priority", {"aging_rate": 1.0}),
    ):
        doc, records, _ = run(workload, policy, options, slots=slots)
        urgent = distribution(r.first_token_s - r.arrival_s for r in records if r.priority == 0)
        low = distribution(r.first_token_s - r.arrival_s for r in records if r.priority == 1)
        base = base or urgent["p99"]
        print(f"{label:<36} {urgent['p99']:16.4f} {urgent['p99'] / base:7.4f} {urgent['mean']:12.4f} "
              f"{low['p99']:11.4f} {doc['summary']['preemptions']:8d}")
    print(f"    metroline run --workload chat --seed 0 --rate-scale {scale:.6f} --max-num-seqs {slots} "
          f"--cost-model {COST_MODEL[0]} --policy priority")


def starving(kind: str) -> Workload:
    """The tests' workloads: 4 requests of 10 output tokens every 0.1 s (half a step before 4 slots
    free up) for 10 s, plus three requests that starve without aging / the guard."""
    items = []
    for k in range(100):
        t = max(0.0, k * 10 * STEP - STEP / 2)
        items += [WorkloadItem(t, (((kind, k, j), 16),), 10, priority=0) for j in range(4)]
    for i, t in enumerate((0.523, 2.047, 4.061)):
        if kind == "urgent":
            items.append(WorkloadItem(t, ((("low", i), 16),), 10, priority=1))
        else:
            items.append(WorkloadItem(t, ((("long", i), 16),), 40))
    return Workload(f"starving-{kind}", items)


def bounds() -> None:
    print("\n## bounds (4 slots; see tests/test_policy_priority.py and tests/test_policy_srpt.py)")
    workload = starving("urgent")
    for rate in (0.0, 1.0):
        _, records, _ = run(workload, "priority", {"aging_rate": rate}, slots=4, cost_model="steps")
        waits = [r.first_scheduled_s - r.arrival_s for r in records if r.priority == 1]
        bound = "none" if rate == 0 else f"{1 / rate + 0.1 + STEP:.2f} s (D + H + step)"
        print(f"priority aging_rate {rate:<4}: priority-1 waits {', '.join(f'{w:.3f}' for w in waits)} s; bound {bound}")
    workload = starving("short")
    for guard in (None, 1.0):
        _, records, _ = run(workload, "srpt", {"max_wait_s": guard}, slots=4, oracle=True, cost_model="steps")
        waits = [r.first_scheduled_s - r.arrival_s for r in records if r.output_tokens == 40]
        bound = "none" if guard is None else f"{guard + STEP + 0.4:.2f} s (max_wait_s + step + H)"
        print(f"srpt max_wait_s {str(guard):<5}: long-request waits {', '.join(f'{w:.3f}' for w in waits)} s; bound {bound}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="azure-conv subset size (default 3000)")
    parser.add_argument("--full", action="store_true", help="also run the whole azure-conv trace")
    parser.add_argument("--cost-model", choices=("steps", "roofline"), default="steps",
                        help="steps (0.01 s a step, the default here) or roofline (llama-3-8b on an A100)")
    args = parser.parse_args()
    COST_MODEL[0] = args.cost_model
    print(f"cost model: {args.cost_model}")
    azure(args.requests)
    if args.full:
        azure(None)
    two_classes()
    bounds()


if __name__ == "__main__":
    main()
