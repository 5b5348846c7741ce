"""The power of `compare --seeds`'s controlled verdicts on planted effects: tables of K paired
draws, each with three arms (`compare_arms`): the baseline (fcfs), the same engine with every step
3% slower (`cost_params = {slowdown = 1.03}`), and the same engine with `max_num_seqs` halved.
For each planted arm it prints the share of tables in which its E2E mean, and any metric, was
called worse, and in which any metric got a verdict at all (better or worse: halving
`max_num_seqs` is a trade, smaller batches make TPOT and E2E better while requests queue longer),
with Holm's control over the table's verdicts and without it (from each interval), and per metric
the tables with each verdict and the median p-value and relative change.

Run:  python bench/verdict_power.py --workload ../shared/traces/azure_code_2023.csv \\
          --max-requests 300 --rate-scale 0.52 --tables 10 --seeds 10
"""

from __future__ import annotations

import argparse
import statistics

from metroline.api import Arm, compare_arms
from metroline.core.config import EngineConfig
from metroline.core.workloads.build import build_workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--jobs", type=int, default=None)
    args = p.parse_args()
    arms = [Arm(name="base"), Arm(name="slow3%", cost_params={"slowdown": 1.03}),
            Arm(name="half_seqs", config={"max_num_seqs": args.max_num_seqs // 2})]
    counts = {a.name: {"e2e": 0, "e2e_raw": 0, "any": 0, "any_raw": 0, "verdict": 0, "verdict_raw": 0}
              for a in arms[1:]}
    per_metric: dict[str, dict[str, list]] = {a.name: {} for a in arms[1:]}
    for t in range(args.tables):
        seeds = [t * args.seeds + i for i in range(args.seeds)]
        draws = [build_workload(args.workload, seed=s, rate_scale=args.rate_scale, max_requests=args.max_requests)
                 for s in seeds]
        table = compare_arms(arms, draws, seeds, config=EngineConfig(max_num_seqs=args.max_num_seqs), jobs=args.jobs)
        for name, c in counts.items():
            entries = {k: e["vs_baseline"] for k, e in table["comparison"]["policies"][name].items() if e["vs_baseline"]}
            e2e = entries["summary.e2e_s.mean"]
            c["e2e"] += e2e["verdict"] == "worse"
            c["e2e_raw"] += e2e["verdict_uncorrected"] == "worse"
            c["any"] += any(e.get("verdict") == "worse" for e in entries.values())
            c["any_raw"] += any(e.get("verdict_uncorrected") == "worse" for e in entries.values())
            c["verdict"] += any(e.get("verdict") in ("better", "worse") for e in entries.values())
            c["verdict_raw"] += any(e.get("verdict_uncorrected") in ("better", "worse") for e in entries.values())
            for key, e in entries.items():
                if e.get("verdict") is not None:
                    per_metric[name].setdefault(key, []).append(e)
        print(f"table {t + 1}/{args.tables} done", flush=True)
    n = args.tables
    print(f"{args.workload}: {n} tables of {args.seeds} paired draws, {args.max_requests} requests, rate scale "
          f"{args.rate_scale}, max_num_seqs {args.max_num_seqs}")
    for name, c in counts.items():
        print(f"  {name:<10} E2E mean worse: {c['e2e']}/{n} (Holm + min effect), {c['e2e_raw']}/{n} (uncorrected); "
              f"any metric worse: {c['any']}/{n}, {c['any_raw']}/{n} uncorrected; any verdict (better or worse): "
              f"{c['verdict']}/{n}, {c['verdict_raw']}/{n} uncorrected")
        for key, es in per_metric[name].items():
            if all(e["difference"]["low"] == e["difference"]["high"] == 0 for e in es):
                continue
            tally = {v: sum(e["verdict"] == v for e in es) for v in ("better", "worse")}
            raw = {v: sum(e["verdict_uncorrected"] == v for e in es) for v in ("better", "worse")}
            rel = [e["relative"]["estimate"] for e in es if e["relative"]]
            print(f"    {key:<34} better {tally['better']}/{n} ({raw['better']} uncorrected), worse "
                  f"{tally['worse']}/{n} ({raw['worse']}), median p {statistics.median(e['p_value'] for e in es):.3g}"
                  + (f", median change {statistics.median(rel):+.1%}" if rel else ""))


if __name__ == "__main__":
    main()
