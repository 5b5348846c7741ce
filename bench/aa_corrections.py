"""The false-verdict rates of one `compare --aa` under every correction (maxt, holm, none), from
the runs its `--json` kept: the same A/A tables, their verdicts recomputed under each correction
(`metroline.core.results.aa`), so the corrections are compared on identical draws.

Run:  PYTHONPATH=tests metroline compare --aa fcfs+aa_plugins:RandomOrder --seeds 10 --trials 20 \\
          --jobs 1 --workload ../shared/traces/azure_code_2023.csv --max-requests 120 \\
          --rate-scale 0.52 --json aa_azure.json
      python bench/aa_corrections.py aa_azure.json
"""

from __future__ import annotations

import argparse
import json

from metroline.core.results.aa import aa_tables, false_verdict_rates
from metroline.core.results.min_effect import CORRECTIONS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", help="the --json document of a `compare --aa` run")
    args = p.parse_args()
    with open(args.json) as f:
        doc = json.load(f)
    docs, trials = doc["runs"], doc["aa"]["tables"]
    seeds = doc["manifest"]["seeds"]["workload"]
    labels = ("a", "b")
    min_effect = doc["comparisons"][0].get("min_effect")
    rates = {c: false_verdict_rates(aa_tables(docs, labels, seeds, trials, min_effect, c), "b") for c in CORRECTIONS}
    first = rates["maxt"]
    workload = docs[0].get("workload", {})
    print(f"{workload.get('name') or workload.get('path') or args.json}: {trials} A/A tables of {first['seeds']} "
          f"paired draws; verdicts also need the minimum effect")
    print(f"{'correction':<12}{'tables with a false verdict':>34}  per-metric false rates (of {trials} tables)")
    for c, r in rates.items():
        low, high = r["table_rate_interval"]
        per = sorted(((m["rate"], m["label"]) for m in r["per_metric"].values()), reverse=True)
        worst = ", ".join(f"{label} {rate:.0%}" for rate, label in per if rate > 0) or "all 0%"
        print(f"{c:<12}{r['tables_with_false_verdict']:>14}/{trials} = {r['table_rate']:5.1%} [{low:.1%}, {high:.1%}]  {worst}")
    print(f"uncorrected intervals alone (no minimum effect): {first['tables_with_false_verdict_uncorrected']}/{trials} "
          f"= {first['table_rate_uncorrected']:.1%}; per metric: "
          + ", ".join(f"{m['label']} {m['rate_uncorrected']:.0%}" for m in first["per_metric"].values() if m["rate_uncorrected"]))


if __name__ == "__main__":
    main()
