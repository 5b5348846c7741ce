"""The power of `compare --seeds`'s controlled verdicts on planted effects: tables of K paired
draws, each with three arms (`compare_arms`): the baseline (fcfs), the same engine with every step
3% slower (`cost_params = {slowdown = 1.03}`), and the same engine with `max_num_seqs` halved.
For each planted arm and each correction (`--correction`: maxt, holm, none; every correction on
the same tables) it prints the share of tables in which its E2E mean, and any metric, was called
worse, and in which any metric got a verdict at all (better or worse: halving `max_num_seqs` is a
trade, smaller batches make TPOT and E2E better while requests queue longer), and per metric the
tables with each verdict under each correction, the median p-value and max-T adjusted p-value, and
the median relative change. `--json FILE` keeps the tables' runs; `--from-json FILE` recomputes the
verdicts from such a file without running anything.

Run:  python bench/verdict_power.py --workload ../shared/traces/azure_code_2023.csv \\
          --max-requests 120 --rate-scale 0.52 --max-num-seqs 32 --tables 5 --seeds 10 --jobs 1
"""

from __future__ import annotations

import argparse
import json
import statistics

from metroline.api import Arm, compare_arms
from metroline.core.config import EngineConfig
from metroline.core.results.min_effect import CORRECTIONS
from metroline.core.results.paired import paired_comparison
from metroline.core.workloads.build import build_workload


def run_tables(args: argparse.Namespace) -> dict:
    """Run the tables: {"args": the workload settings, "tables": [{"seeds", "runs"}]}."""
    arms = [Arm(name="base"), Arm(name="slow3%", cost_params={"slowdown": 1.03}),
            Arm(name="half_seqs", config={"max_num_seqs": args.max_num_seqs // 2})]
    saved = {"args": {k: getattr(args, k) for k in ("workload", "max_requests", "rate_scale", "seeds", "max_num_seqs")},
             "tables": []}
    for t in range(args.tables):
        seeds = [t * args.seeds + i for i in range(args.seeds)]
        draws = [build_workload(args.workload, seed=s, rate_scale=args.rate_scale, max_requests=args.max_requests)
                 for s in seeds]
        table = compare_arms(arms, draws, seeds, config=EngineConfig(max_num_seqs=args.max_num_seqs), jobs=args.jobs)
        saved["tables"].append({"seeds": seeds, "runs": table["runs"]})
        print(f"table {t + 1}/{args.tables} done", flush=True)
    return saved


def comparisons(saved: dict) -> list[dict[str, dict]]:
    """Each table's comparison under every correction: [{correction: comparison}]."""
    out = []
    for table in saved["tables"]:
        by_arm: dict[str, list] = {}
        for doc in table["runs"]:
            by_arm.setdefault(doc["arm"], []).append(doc)
        out.append({c: paired_comparison(by_arm, table["seeds"], "base", correction=c) for c in CORRECTIONS})
    return out


def report(saved: dict) -> None:
    tables = comparisons(saved)
    a, n = saved["args"], len(tables)
    print(f"{a['workload']}: {n} tables of {a['seeds']} paired draws, {a['max_requests']} requests, rate scale "
          f"{a['rate_scale']}, max_num_seqs {a['max_num_seqs']}; verdicts also need the minimum effect")
    for name in [arm for arm in tables[0]["maxt"]["policies"] if arm != "base"]:
        print(f"  {name}")
        for c in CORRECTIONS:
            entries = [{k: e["vs_baseline"] for k, e in t[c]["policies"][name].items() if e["vs_baseline"]} for t in tables]
            e2e = sum(t["summary.e2e_s.mean"]["verdict"] == "worse" for t in entries)
            worse = sum(any(e.get("verdict") == "worse" for e in t.values()) for t in entries)
            any_verdict = sum(any(e.get("verdict") in ("better", "worse") for e in t.values()) for t in entries)
            applied = {t[c]["error_control"] for t in tables}
            print(f"    {c:<5} (applied: {', '.join(sorted(applied))}): E2E mean worse {e2e}/{n}, any metric worse "
                  f"{worse}/{n}, any verdict {any_verdict}/{n}")
        for key in tables[0]["maxt"]["policies"][name]:
            per = {c: [t[c]["policies"][name][key]["vs_baseline"] for t in tables] for c in CORRECTIONS}
            es = per["maxt"]
            if any(e is None or e.get("verdict") is None for e in es):
                continue
            if all(e["difference"]["low"] == e["difference"]["high"] == 0 for e in es):
                continue
            tally = "; ".join(f"{c} " + "/".join(f"{sum(e['verdict'] == v for e in per[c])} {v}" for v in ("better", "worse"))
                              for c in CORRECTIONS)
            rel = [e["relative"]["estimate"] for e in es if e["relative"]]
            print(f"      {key:<34} {tally}; median p {statistics.median(e['p_value'] for e in es):.3g}, max-T "
                  f"{statistics.median(e['p_adjusted'] for e in es):.3g}, Holm "
                  f"{statistics.median(e['p_adjusted'] for e in per['holm']):.3g}"
                  + (f", median change {statistics.median(rel):+.1%}" if rel else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload")
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--json", help="write the tables' runs here")
    p.add_argument("--from-json", help="recompute the verdicts from the runs of an earlier --json; run nothing")
    args = p.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
    else:
        if not args.workload:
            p.error("--workload: give a trace or workload (or --from-json FILE)")
        saved = run_tables(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(saved, f)
    report(saved)


if __name__ == "__main__":
    main()
