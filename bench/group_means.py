"""Per policy (or arm) and per priority class (or tenant): the mean over the seeds of a
`metroline compare --seeds K --json FILE` document's group summaries.

`compare`'s table and verdicts are over whole runs; its JSON keeps each run's summaries per
priority class (`priorities`) and per tenant (`tenants`). This prints, for each group, the mean
over the draws of its request count, TTFT mean and p99, E2E mean and preemptions (no intervals:
a figure to read beside the table's verdicts, not a verdict).

Run:  .venv/bin/python bench/group_means.py FILE.json [--by priorities|tenants]
"""

from __future__ import annotations

import argparse
import json
import statistics


def group_means(doc: dict, by: str) -> list[tuple[str, str, dict[str, float]]]:
    """`(policy, group, {figure: mean over the runs})`, sorted by policy then group."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in doc["runs"]:
        for group, summary in (run.get(by) or {}).items():
            groups.setdefault((run["policy"], group), []).append(summary)
    out = []
    for (policy, group), summaries in sorted(groups.items()):
        def mean(get):
            return statistics.fmean(get(s) for s in summaries)

        out.append((policy, group, {
            "runs": len(summaries),
            "requests": mean(lambda s: s["requests"]),
            "ttft_mean_ms": 1000 * mean(lambda s: s["ttft_s"]["mean"]),
            "ttft_p99_ms": 1000 * mean(lambda s: s["ttft_s"]["p99"]),
            "e2e_mean_s": mean(lambda s: s["e2e_s"]["mean"]),
            "preemptions": mean(lambda s: s["preemptions"]),
        }))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a `metroline compare --seeds K --json` document")
    parser.add_argument("--by", choices=("priorities", "tenants"), default="priorities")
    args = parser.parse_args()
    with open(args.file, encoding="utf-8") as f:
        doc = json.load(f)
    label = {"priorities": "priority", "tenants": "tenant"}[args.by]
    print(f"| policy | {label} | runs | requests | "
          "TTFT mean (ms) | TTFT p99 (ms) | E2E mean (s) | preemptions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy, group, m in group_means(doc, args.by):
        print(f"| {policy} | {group} | {m['runs']} | {m['requests']:.1f} | {m['ttft_mean_ms']:.0f} | "
              f"{m['ttft_p99_ms']:.0f} | {m['e2e_mean_s']:.2f} | {m['preemptions']:.1f} |")


if __name__ == "__main__":
    main()
