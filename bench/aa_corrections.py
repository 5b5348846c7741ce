"""The false-verdict rates of one `compare --aa` under every correction (maxt, holm, none), from
the runs its `--json` kept: the same A/A tables, their verdicts recomputed under each correction
(`metroline.core.results.aa`), so the corrections are compared on identical draws; and how many
tables' smallest adjusted p-value falls below 0.05, 0.1, 0.2 and 0.5, against the share an exact
procedure gives (a check of calibration finer than the count of false verdicts, 0 to 2 of 20).

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
    tables = {c: aa_tables(docs, labels, seeds, trials, min_effect, c) for c in CORRECTIONS}
    rates = {c: false_verdict_rates(t, "b") for c, t in tables.items()}
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

    print("calibration: tables whose smallest adjusted p-value is <= x (an exact procedure: about x of them; "
          "the interval and minimum effect not required)")
    for c in ("maxt", "holm"):
        smallest = [min((e["vs_baseline"]["p_adjusted"] for e in t["policies"]["b"].values()
                         if e["vs_baseline"] and e["vs_baseline"].get("p_adjusted") is not None), default=1.0)
                    for t in tables[c]]
        print(f"  {c:<5} " + ", ".join(f"<= {x:g}: {sum(p <= x for p in smallest)}/{trials}" for x in (0.05, 0.1, 0.2, 0.5)))


if __name__ == "__main__":
    main()
