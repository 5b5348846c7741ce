"""The split comparison's calibration near and past capacity: A/A false-verdict rates per metric and
overall, and the power on a halved `max_num_seqs`, from saved draws that can be judged again.

Each draw is a simulated pool of 2 replicas, one per arm, 50% of the traffic each (`[cluster]`
canary, interleaved, no twin), on its own resample of a trace; the arms' completed requests
(arrival, TTFT, TPOT, end-to-end) are saved, one JSON line per draw, so the comparison
(`metroline.core.results.canary.compare_arms`, what a serving front and `canary-report` compute)
can be judged again after a change without simulating again. Variants: `aa` (both arms fcfs in a
random order of service, `tests/aa_plugins.py`, salts differ: every verdict is false) and `half`
(the canary's `max_num_seqs` halved: a real effect).

Run:  python bench/canary_split_aa.py collect --workload ../shared/traces/azure_conv_2023.csv \\
          --max-requests 800 --rate-scale 1.0 --max-num-seqs 8 --variant aa --seeds 0:100 --out aa800.jsonl
      python bench/canary_split_aa.py judge aa800.jsonl half800.jsonl ...
(`collect` appends; several processes may collect disjoint seed ranges into their own files; `judge`
keeps one draw per variant, size and seed, the size a row's `max_requests` or else its two arms'
requests together.) Figures and the design they measure: docs/guide/replicas-and-routing.md,
"Near and past capacity".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # aa_plugins

from metroline.core.cluster import document  # noqa: E402
from metroline.core.results.aa import wilson  # noqa: E402
from metroline.core.results.canary import CANARY_METRICS, ArmSamples, compare_arms  # noqa: E402

_FIELDS = ("arrival", "ttft", "e2e", "tpot", "tpot_arrival")


def collect(args: argparse.Namespace) -> None:
    from metroline.core.cluster.simulation import run_cluster
    from metroline.core.cluster.spec import ClusterSpec
    from metroline.core.config import EngineConfig
    from metroline.core.workloads.build import build_workload
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor

    captured: list[tuple[ArmSamples, ArmSamples]] = []
    judged = document.compare_arms

    def keep(b: ArmSamples, c: ArmSamples, **kw: object) -> dict:  # the split's arms, as the document sees them
        captured.append((b, c))
        return judged(b, c, **kw)

    document.compare_arms = keep
    first, stop = (int(x) for x in args.seeds.split(":"))
    for seed in range(first, stop):
        canary = {"half": {"max_num_seqs": args.max_num_seqs // 2}, "aa": {"plugin_salt": 2 * seed + 2}}[args.variant]
        spec = ClusterSpec.model_validate({"pools": {"p": {"replicas": 2, "canary": {
            "replicas": 1, "percent": 50.0, "seed": seed, "twin": False, "config": canary}}}})
        config = EngineConfig(max_num_seqs=args.max_num_seqs, plugin_salt=2 * seed + 1,
                              plugins=["aa_plugins:RandomOrder"] if args.variant == "aa" else [])
        workload = build_workload(args.workload, seed=seed, rate_scale=args.rate_scale, max_requests=args.max_requests)
        captured.clear()
        run_cluster(workload, config, None, spec=spec,
                    executor_of=lambda plan: SimulatedExecutor(make_cost_model(args.cost_model)))
        b, c = captured[-1]
        row = {"seed": seed, "variant": args.variant, "max_requests": args.max_requests, "rate_scale": args.rate_scale,
               "max_num_seqs": args.max_num_seqs,
               **{arm: {f: getattr(s, f).tolist() for f in _FIELDS} for arm, s in (("b", b), ("c", c))}}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def _arm(d: dict) -> ArmSamples:
    arm = ArmSamples([])
    for f in _FIELDS:
        setattr(arm, f, np.array(d[f], dtype=float))
    return arm


def judge(args: argparse.Namespace) -> None:
    draws: dict[tuple, dict] = {}
    for path in args.files:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            size = row.get("max_requests") or len(row["b"]["arrival"]) + len(row["c"]["arrival"])
            draws[row["variant"], size, row["seed"]] = row
    groups: dict[tuple, list[dict]] = {}
    for (variant, size, _), row in sorted(draws.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0, kv[0][2])):
        groups.setdefault((variant, size), []).append(row)
    for (variant, size), rows in groups.items():
        want = None if variant == "aa" else "worse"
        results = [compare_arms(_arm(r["b"]), _arm(r["c"])) for r in rows]
        windows = sorted({c["windows"] for c in results})
        none = sum(c["verdict"] is None for c in results)
        what = "false verdicts (better or worse)" if want is None else "called worse (power)"
        print(f"{variant}, {size} requests a draw, {len(rows)} draws: {what}; windows {windows}, "
              f"no verdict (too short) in {none}")
        for key in [m for m, _, _ in CANARY_METRICS] + ["overall"]:
            verdicts = [(c["metrics"].get(key) or {}).get("verdict") if key != "overall" else c["verdict"]
                        for c in results]
            k = sum((v in ("better", "worse")) if want is None else v == want for v in verdicts)
            low, high = wilson(k, len(rows))
            print(f"  {key:<10} {k:>3}/{len(rows)} {k / len(rows):6.1%} [{low:5.1%}, {high:5.1%}]")
        if want is not None:
            better = {key: sum((c["metrics"].get(key) or {}).get("verdict") == "better" for c in results)
                      for key, _, _ in CANARY_METRICS}
            print(f"  called better: overall {sum(c['verdict'] == 'better' for c in results)}/{len(rows)}; per metric "
                  + ", ".join(f"{k} {v}" for k, v in better.items()))
        models = sorted({str(c.get("interval_model")) for c in results})
        print(f"  interval model: {', '.join(models)}")
        example = results[0].get("window_reason")
        if example:
            print(f"  e.g. seed {rows[0]['seed']}: {example}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--workload", required=True)
    c.add_argument("--max-requests", type=int, default=800)
    c.add_argument("--rate-scale", type=float, default=1.0)
    c.add_argument("--max-num-seqs", type=int, default=8)
    c.add_argument("--cost-model", default="roofline")
    c.add_argument("--variant", choices=("aa", "half"), default="aa")
    c.add_argument("--seeds", default="0:100", help="FIRST:STOP")
    c.add_argument("--out", required=True)
    j = sub.add_parser("judge")
    j.add_argument("files", nargs="+")
    args = ap.parse_args()
    collect(args) if args.command == "collect" else judge(args)


if __name__ == "__main__":
    main()
