"""`metroline check-plugin SPEC`: the plugin conformance suite (`metroline.testing.check_plugin`)
from the command line, on the author's tenants (`--tenants`) and workload (`--workload`).

It prints the report (the runs, the requests that ran differently without the plugin, each hook of
the plugin with its calls and changed answers, then the warnings and deprecated uses) and exits 0;
a broken contract (or, with `--strict`, a hook that never ran or never changed an answer, a plugin
that changed no request's run, a deprecated name or module path) prints the failures and exits 1.
A router runs on a simulated cluster (`--replicas`, `--pools`), a sampler also on the torch
executor when torch is installed (see `metroline.testing`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_check_plugin_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `check-plugin` command and its flags to the CLI's subparsers `sub`."""
    p = sub.add_parser(
        "check-plugin",
        help="run the plugin conformance suite on a plugin and report the hooks it never ran or that never changed "
        "an answer",
    )
    p.add_argument("spec", help="the plugin: a shipped name, an entry point or a dotted path pkg.mod:Obj")
    p.add_argument("--tenants", metavar="A,B,...",
                   help="comma-separated tenant names given to the suite's requests in turn "
                   "(default: the suite's own, alpha, beta, gamma, burst)")
    p.add_argument("--workload", metavar="NAME_OR_FILE",
                   help="your own workload, run after the suite's with its own tenants: a built-in name or a "
                   ".toml/.json spec, .csv or .jsonl trace (default: none)")
    p.add_argument("--base", default="fcfs",
                   help="the policy a plugin that does not answer admission is stacked on (default: fcfs)")
    p.add_argument("--options", metavar="JSON", help='the plugin\'s options as a JSON object, e.g. \'{"limit": 4}\' '
                   "(default: none)")
    p.add_argument("--mode", action="append", choices=("recompute", "swap"),
                   help="preemption mode to run, repeatable (default: both)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the suite's workloads and runs (default: 0)")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="a router: the cluster it is checked on, N replicas of the default pool, r0..r{N-1} "
                   "(default: 3)")
    p.add_argument("--pools", metavar="POOL=N,...",
                   help="a router: the cluster's pools instead, e.g. short=2,long=1 (replicas short-0, short-1, long-0)")
    p.add_argument("--strict", action="store_true",
                   help="fail when a hook of the plugin was never called or never changed an answer, when no request "
                   "ran differently without it, or when it uses a deprecated name or module path "
                   "(default: only a warning)")
    return p


def cmd_check_plugin(args: argparse.Namespace) -> int:
    """Run `check_plugin` with the command's flags; print the report; 0 when it passed, 1 if not."""
    from ...testing import ConformanceError, check_plugin

    options = json.loads(args.options) if args.options else {}
    if not isinstance(options, dict):
        raise ValueError(f"--options must be a JSON object, got {args.options!r}")
    cluster: Any = args.replicas
    if args.pools:
        from ..cluster.spec import parse_pools

        cluster = {"pools": {pool: {"replicas": n} for pool, n in (parse_pools(args.pools) or {}).items()}}
    tenants = None
    if args.tenants is not None:
        tenants = [t.strip() for t in args.tenants.split(",") if t.strip()]
    try:
        report = check_plugin(
            args.spec, options=options, base=args.base, modes=tuple(args.mode or ("recompute", "swap")),
            seed=args.seed, tenants=tenants, workload=args.workload, strict=args.strict, cluster=cluster,
        )
    except ConformanceError as exc:
        print(exc)
        return 1
    print(report)
    return 0
