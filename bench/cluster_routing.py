"""Routers compared on a simulated cluster, over seeds, with paired intervals and verdicts (the
statistics of `metroline compare --seeds`: `core/results/stats.py`).

1. `prefix`: 4 replicas, `prefix_aware` against `round_robin`: prefix hit rate and mean TTFT.
2. `pools`: 4 replicas, `length_pools` (pools short=3, long=1, `--threshold`) against one mixed
   pool behind `least_outstanding_tokens`: the p99 TTFT of the short requests (prompt at most
   `--threshold` tokens) and of all requests.

Each seed redraws the workload (`--seed` as in `metroline run`); both arms of a seed replay the
same draw. Every replica: the default engine (fcfs) with `--num-blocks`, simulated with the
`--cost-model` (default roofline, as `metroline run`).

Run:  python bench/cluster_routing.py prefix --workload mooncake --max-requests 1000 --seeds 5 \\
          --num-blocks 16384 --max-model-len 131072
      python bench/cluster_routing.py pools --workload azure-code --seeds 5 --threshold 2048
"""

from __future__ import annotations

import argparse

from metroline.core.cluster.simulation import run_cluster
from metroline.core.config import EngineConfig
from metroline.core.results.stats import paired_difference
from metroline.core.results.summaries import distribution
from metroline.core.workloads.build import build_workload
from metroline.executors.registry import make_executor


COST_MODEL = ["roofline"]  # as `metroline run`; --cost-model


def sim():
    return make_executor("sim", cost_model=COST_MODEL[0])


def short_p99(engines, threshold: int) -> float:
    ttft = [r.first_token_s - r.arrival_s for e in engines for r in e.metrics.requests
            if r.first_token_s is not None and r.prompt_tokens <= threshold]
    return distribution(ttft)["p99"]


def show(name: str, direction: str, a: list[float], b: list[float], scale: float, unit: str) -> None:
    d = paired_difference(a, b, direction)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"  {name:<22} {mean(a) * scale:10.3f} {unit:<3} -> {mean(b) * scale:10.3f} {unit:<3} "
          f"diff {d.difference.estimate * scale:+.3f} [{d.difference.low * scale:+.3f}, "
          f"{d.difference.high * scale:+.3f}]  {d.verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", choices=("prefix", "pools"))
    ap.add_argument("--workload", default="mooncake")
    ap.add_argument("--max-requests", type=int)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--num-blocks", type=int, default=16384)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--threshold", type=int, default=2048)
    ap.add_argument("--cost-model", default="roofline", help="the simulator's cost model (as metroline run's)")
    args = ap.parse_args()
    COST_MODEL[0] = args.cost_model
    config = EngineConfig(num_blocks=args.num_blocks, max_model_len=args.max_model_len)
    runs: dict[str, list] = {}
    for seed in range(args.seeds):
        wl = build_workload(args.workload, seed=seed, max_requests=args.max_requests, rate_scale=args.rate_scale)
        if args.experiment == "prefix":
            arms = {"round_robin": dict(replicas=4, router="round_robin"),
                    "prefix_aware": dict(replicas=4, router="prefix_aware")}
        else:
            arms = {"mixed": dict(replicas=4, router="least_outstanding_tokens"),
                    "length_pools": dict(pools={"short": 3, "long": 1}, router="length_pools",
                                         router_options={"threshold": args.threshold})}
        for label, kw in arms.items():
            doc, engines = run_cluster(wl, config, sim, **kw)
            s = doc["summary"]
            runs.setdefault(label, []).append({
                "hit": s["prefix_hit_rate"] or 0.0, "ttft_mean": s["ttft_s"]["mean"], "ttft_p99": s["ttft_s"]["p99"],
                "short_p99": short_p99(engines, args.threshold), "completed": s["completed"],
            })
            print(f"seed {seed} {label:<13} completed {s['completed']}  prefix hits {s['prefix_hit_rate'] or 0:.1%}  "
                  f"TTFT mean {s['ttft_s']['mean'] * 1e3:.1f} ms  p99 {s['ttft_s']['p99'] * 1e3:.1f} ms  "
                  f"short p99 {runs[label][-1]['short_p99'] * 1e3:.1f} ms", flush=True)
    (a_label, a), (b_label, b) = runs.items()
    print(f"\n{args.workload}, {args.seeds} seeds: {a_label} -> {b_label} (paired mean difference, 95% interval)")
    col = lambda runs, k: [r[k] for r in runs]  # noqa: E731
    if args.experiment == "prefix":
        show("prefix hit rate", "higher", col(a, "hit"), col(b, "hit"), 100, "%")
        show("TTFT mean", "lower", col(a, "ttft_mean"), col(b, "ttft_mean"), 1e3, "ms")
        show("TTFT p99", "lower", col(a, "ttft_p99"), col(b, "ttft_p99"), 1e3, "ms")
    else:
        show(f"short (<= {args.threshold}) p99", "lower", col(a, "short_p99"), col(b, "short_p99"), 1e3, "ms")
        show("TTFT p99 (all)", "lower", col(a, "ttft_p99"), col(b, "ttft_p99"), 1e3, "ms")
        show("TTFT mean (all)", "lower", col(a, "ttft_mean"), col(b, "ttft_mean"), 1e3, "ms")


if __name__ == "__main__":
    main()
