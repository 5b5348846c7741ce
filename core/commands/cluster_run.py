"""`metroline run --replicas N --router NAME`: the workload on a simulated cluster (`core/cluster/`)."""

from __future__ import annotations

import argparse
from typing import Any

REFUSED_WITH_REPLICAS = ("outputs", "report", "requests_csv", "steps_csv")


def parse_pools(text: str | None) -> dict[str, int] | None:
    """`short=3,long=1` -> {"short": 3, "long": 1} (None for None)."""
    if not text:
        return None
    pools: dict[str, int] = {}
    for part in text.split(","):
        name, sep, count = part.strip().partition("=")
        if not sep or not name or not count.strip().isdigit():
            raise ValueError(f"--pools: expected POOL=N,... (e.g. short=3,long=1), got {part!r}")
        pools[name.strip()] = int(count)
    return pools


def parse_router_options(items: list[str] | None) -> dict[str, Any]:
    """`["threshold=2048", "seed=1"]` -> {"threshold": 2048, "seed": 1}: ints and floats parsed."""
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--router-option: expected KEY=VALUE, got {item!r}")
        parsed: Any = value
        for kind in (int, float):
            try:
                parsed = kind(value)
                break
            except ValueError:
                continue
        options[key.strip()] = parsed
    return options


def run_cluster_command(args: argparse.Namespace, config: Any, run: dict[str, Any], workload: Any, executor: Any,
                        manifest: Any) -> int:
    """Run the workload on `--replicas` (or `--pools`) engines behind `--router`; print the cluster's
    summary table and one line per replica; write `--json`."""
    from ..cluster.router import DEFAULT_ROUTER
    from ..cluster.simulation import run_cluster
    from ..results import files as result_files
    from ..results import report
    from .options import make_executor, measurement

    for flag in REFUSED_WITH_REPLICAS:
        if getattr(args, flag, None):
            raise ValueError(f"--{flag.replace('_', '-')} is not available with --replicas/--pools yet; use --json")
    if measurement(run) is not None:
        raise ValueError("--warmup/--horizon are not available with --replicas/--pools yet")
    pools = parse_pools(args.pools)
    if pools and args.replicas:
        raise ValueError("give --replicas N or --pools POOL=N,..., not both")
    executors = iter([executor])
    vocab = getattr(executor, "vocab_size", None)
    doc, engines = run_cluster(
        workload, config, lambda: next(executors, None) or make_executor(run), replicas=args.replicas or 1,
        pools=pools, router=args.router or DEFAULT_ROUTER, router_options=parse_router_options(args.router_option),
        oracle_lengths=bool(run.get("oracle_lengths")), window_s=run.get("window", 60.0),
        **({"vocab_size": vocab} if vocab else {}),
    )
    for engine in engines:
        engine.close()
    report.print_summary_table(doc)
    c = doc["cluster"]
    print(f"cluster: {c['replicas']} replicas, router {c['router']}, {c['refused']} refused by the router")
    for r in doc["replicas"]:
        s = r["summary"]
        ttft = (s["ttft_s"] or {}).get("mean")
        hit = s["prefix_hit_rate"]
        print(f"  {r['name']:>10} pool {r['pool']:<8} routed {r['routed']:>6}  completed {s['completed']:>6}  "
              f"mean TTFT {'-' if ttft is None else f'{ttft:.3f} s'}  prefix hits "
              f"{'-' if hit is None else f'{hit:.1%}'}")
    if manifest is not None:
        doc["manifest"] = manifest
    if args.json:
        result_files.write_json(args.json, doc)
    return 0
