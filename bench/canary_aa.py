"""Is a simulated canary's verdict calibrated? A/A false-verdict rates per metric and overall, and
the power on planted effects, over many draws of a real trace.

Each draw is a pool of 2 replicas, one per arm, 50% of the traffic each (`[cluster]` canary,
interleaved), on its own resample of the trace (`--resample redraw`). Variants:

- `aa`: both arms fcfs with random order of service (`tests/aa_plugins.py`'s `RandomOrder`), the
  canary with another `plugin_salt`: the arms differ only in private randomness, so every verdict
  is false (with a deterministic policy the twin comparison is identical and checks nothing);
- `half`: the canary with `max_num_seqs` halved (a real effect: fewer requests run at once);
- `slow3`: the canary's every step 3% slower (`cost_params slowdown=1.03`).

For each it prints the share of draws with each verdict, per metric and overall, for the canary's
`comparison` (against its twin: the baseline engine replayed on the canary's own requests,
`metroline.core.cluster.twins`) and its `split_comparison` (against the baseline arm's other
requests, the only comparison a serving front can make), with 95% Wilson intervals.

Run:  python bench/canary_aa.py --workload ../shared/traces/azure_code_2023.csv --max-requests 200 \\
          --rate-scale 0.8 --max-num-seqs 8 --draws 100 --power-draws 20
and, for the power of a longer canary:
      python bench/canary_aa.py --workload ../shared/traces/azure_code_2023.csv --max-requests 1000 \\
          --rate-scale 0.8 --max-num-seqs 8 --variants half,slow3 --power-draws 10
(`--save FILE` keeps each draw as it ends; `--tables-from FILE...` prints the tables of saved draws.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # aa_plugins: a plugin with private randomness

from metroline.core.cluster.simulation import run_cluster  # noqa: E402
from metroline.core.cluster.spec import CANARY, ClusterSpec  # noqa: E402
from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.results.aa import wilson  # noqa: E402
from metroline.core.results.canary import CANARY_METRICS  # noqa: E402
from metroline.core.workloads.build import build_workload  # noqa: E402
from metroline.executors.cost_models import make_cost_model  # noqa: E402
from metroline.executors.simulated import SimulatedExecutor  # noqa: E402

RANDOM_ORDER = "aa_plugins:RandomOrder"


def trial(args: argparse.Namespace, seed: int, variant: str) -> dict:
    """The canary section of one draw's cluster document."""
    canary_config = {"half": {"max_num_seqs": args.max_num_seqs // 2}, "aa": {"plugin_salt": 2 * seed + 2}}.get(variant, {})
    spec = ClusterSpec.model_validate({"pools": {"p": {"replicas": 2, "canary": {
        "replicas": 1, "percent": 50.0, "seed": seed, "config": canary_config}}}})
    plugins = [RANDOM_ORDER] if variant == "aa" else []
    config = EngineConfig(max_num_seqs=args.max_num_seqs, plugins=plugins, plugin_salt=2 * seed + 1)

    def executor(plan):
        slow = variant == "slow3" and plan.arm == CANARY
        return SimulatedExecutor(make_cost_model(args.cost_model, **({"slowdown": 1.03} if slow else {})))

    workload = build_workload(args.workload, seed=seed, rate_scale=args.rate_scale, max_requests=args.max_requests)
    doc, _ = run_cluster(workload, config, None, spec=spec, executor_of=executor)
    return doc["canary"]["p"]


def rates(sections: list[dict], key: str, verdict: str | None) -> dict[str, tuple[int, int]]:
    """metric (and `overall`) -> (draws with the verdict, draws); verdict None: any better/worse."""
    def hit(v: str | None) -> bool:
        return v in ("better", "worse") if verdict is None else v == verdict

    out = {m: (sum(hit(s[key]["metrics"][m]["verdict"]) for s in sections), len(sections)) for m, _, _ in CANARY_METRICS}
    out["overall"] = (sum(hit(s[key]["verdict"]) for s in sections), len(sections))
    return out


def show(title: str, table: dict[str, dict[str, tuple[int, int]]]) -> None:
    print(title)
    cols = list(table)
    print(f"  {'metric':<10}" + "".join(f"{c:>30}" for c in cols))
    for m in table[cols[0]]:
        cells = []
        for c in cols:
            k, n = table[c][m]
            low, high = wilson(k, n)
            cells.append(f"{k:>3}/{n} {k / n:6.1%} [{low:5.1%}, {high:5.1%}]")
        print(f"  {m:<10}" + "".join(f"{x:>30}" for x in cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--max-requests", type=int, default=300)
    p.add_argument("--rate-scale", type=float, default=0.8)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--cost-model", default="roofline")
    p.add_argument("--draws", type=int, default=100, help="A/A draws")
    p.add_argument("--power-draws", type=int, default=30, help="draws of each planted effect")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--variants", default="aa,half,slow3")
    p.add_argument("--save", help="append each draw's canary section to this JSON-lines file as it ends")
    p.add_argument("--tables-from", nargs="+", metavar="FILE",
                   help="run nothing: print the tables of the draws saved in these files (--save)")
    args = p.parse_args()
    results: dict[str, list[dict]] = {}
    if args.tables_from:
        for path in args.tables_from:
            for line in Path(path).read_text().splitlines():
                row = json.loads(line)
                results.setdefault(row["variant"], []).append(row["canary"])
    for variant in [] if args.tables_from else args.variants.split(","):
        n = args.draws if variant == "aa" else args.power_draws
        start = time.perf_counter()
        results[variant] = []
        for s in range(args.first_seed, args.first_seed + n):
            results[variant].append(trial(args, s, variant))
            if args.save:
                with open(args.save, "a") as f:
                    f.write(json.dumps({"variant": variant, "seed": s, "canary": results[variant][-1]}) + "\n")
        print(f"{variant}: {n} draws in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"{args.workload}: {args.max_requests} requests a draw, rate scale {args.rate_scale}, 2 replicas (one per "
          f"arm, 50% each), max_num_seqs {args.max_num_seqs}, {args.cost_model}; cells: draws with the verdict "
          "[95% Wilson interval]")
    if "aa" in results:
        show("A/A (random order of service, salts differ): false verdicts (better or worse)",
             {"twin (comparison)": rates(results["aa"], "comparison", None),
              "split (split_comparison)": rates(results["aa"], "split_comparison", None)})
    for variant, label in (("half", "max_num_seqs halved"), ("slow3", "every step 3% slower")):
        if variant in results:
            show(f"{label}: called worse (power)",
                 {"twin (comparison)": rates(results[variant], "comparison", "worse"),
                  "split (split_comparison)": rates(results[variant], "split_comparison", "worse")})
            better = rates(results[variant], "comparison", "better")["overall"][0]
            rel = sorted(s["comparison"]["metrics"]["ttft_mean"]["relative"]["estimate"] for s in results[variant])
            print(f"  twin: overall better in {better} draws; the draws' TTFT mean change (canary / twin - 1): "
                  f"median {rel[len(rel) // 2]:+.1%}, range [{rel[0]:+.1%}, {rel[-1]:+.1%}]")


if __name__ == "__main__":
    main()
