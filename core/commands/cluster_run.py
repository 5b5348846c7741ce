"""`metroline run --replicas N --router NAME`: the workload on a simulated cluster (`core/cluster/`)."""

from __future__ import annotations

import argparse
from typing import Any

REFUSED_WITH_REPLICAS = ("outputs", "report", "steps_csv")


def run_cluster_command(args: argparse.Namespace, config: Any, run: dict[str, Any], workload: Any, executor: Any,
                        manifest: Any, spec: Any) -> int:
    """Run the workload on the cluster `spec` (the `[cluster]` table and `--replicas`, `--pools`,
    `--router`); print the cluster's summary table, one line per replica and each canary's
    comparison; write `--json` and `--requests-csv` (every replica's requests)."""
    from ..cluster.simulation import run_cluster
    from ..results import files as result_files
    from ..results import report
    from .options import make_executor, measurement

    for flag in REFUSED_WITH_REPLICAS:
        if getattr(args, flag, None):
            raise ValueError(f"--{flag.replace('_', '-')} is not available with a cluster (--replicas, --pools, "
                             "[cluster]); use --json or --requests-csv")
    spec.plan(config)  # a bad pool config is reported before any replica is built
    executors = iter([executor])
    vocab = getattr(executor, "vocab_size", None)
    doc, engines = run_cluster(
        workload, config, lambda: next(executors, None) or make_executor(run), spec=spec,
        oracle_lengths=bool(run.get("oracle_lengths")), window_s=run.get("window", 60.0), measure=measurement(run),
        **({"vocab_size": vocab} if vocab else {}),
    )
    for engine in engines:
        engine.close()
    report.print_summary_table(doc)
    print(format_cluster(doc), end="")
    from ..results.deadlines import deadline_line

    line = deadline_line(doc.get("deadlines"))
    if line is not None:
        print(line)
    if manifest is not None:
        doc["manifest"] = manifest
    if args.json:
        result_files.write_json(args.json, doc)
    if args.requests_csv:
        result_files.write_requests_csv(args.requests_csv, [r for e in engines for r in e.metrics.requests])
    return 0


def format_cluster(doc: dict[str, Any]) -> str:
    """The cluster's lines under the summary table: the router, one line per replica, each canary."""
    from ..results.canary import format_canary
    from .canary_report import canary_name

    c = doc["cluster"]
    lines = [f"cluster: {c['replicas']} replicas, router {c['router']}, {c['refused']} refused by the router"]
    for r in doc["replicas"]:
        s = r["summary"]
        ttft = (s["ttft_s"] or {}).get("mean")
        hit = s["prefix_hit_rate"]
        arm = f" {r['arm']}" if r.get("arm") else ""
        lines.append(
            f"  {r['name']:>12} pool {r['pool']:<8}{arm:<9} {r['policy']:<14} routed {r['routed']:>6}  completed "
            f"{s['completed']:>6}  mean TTFT {'-' if ttft is None else f'{ttft:.3f} s'}  prefix hits "
            f"{'-' if hit is None else f'{hit:.1%}'}")
    text = "\n".join(lines) + "\n"
    for pool, canary in (doc.get("canary") or {}).items():
        text += format_canary(canary_name(pool, canary), canary["comparison"])
    return text
