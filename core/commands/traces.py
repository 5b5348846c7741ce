"""`metroline traces fetch [NAME...]` and `metroline traces list`: the public traces the built-in
trace workloads replay, downloaded with their checksums checked (`core/workloads/trace_fetch.py`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_traces_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `traces` command, with `fetch` and `list`, to the CLI's subparsers `sub`."""
    from ..workloads.trace_fetch import SOURCES

    p = sub.add_parser("traces", help="download the public traces (Azure 2023 conversation and code, Mooncake) "
                       "with their checksums checked, or list them")
    verbs = p.add_subparsers(dest="traces_command", required=True, metavar="{fetch,list}")
    fetch = verbs.add_parser("fetch", help="download traces into the traces folder, each checked against its sha256")
    fetch.add_argument("names", nargs="*", metavar="NAME",
                       help=f"the traces to fetch, by workload name (default: all of {', '.join(SOURCES)})")
    fetch.add_argument("--traces-dir", metavar="PATH",
                       help="the folder to save them in (default: $METROLINE_TRACES, else ./traces, where the "
                       "trace workloads look by themselves)")
    fetch.add_argument("--mirror", metavar="URL",
                       help="fetch URL/FILE for each trace instead of its published URL (a local copy or mirror; "
                       "the checksums are checked all the same; default: the published URLs)")
    fetch.add_argument("--force", action="store_true",
                       help="download a trace again when its file is present with another checksum (default: stop "
                       "with an error)")
    lister = verbs.add_parser("list", help="the traces, their URLs, checksums and whether the traces folder has them")
    lister.add_argument("--traces-dir", metavar="PATH", help="the folder to look in (default: as for fetch)")
    return p


def cmd_traces(args: argparse.Namespace) -> int:
    """`fetch`: one line per event on stderr, the saved paths on stdout, exit 0 (errors raise
    `WorkloadError`, which the CLI prints as one line, exit 2). `list`: one line per trace."""
    from ..workloads.trace_fetch import SOURCES, default_folder, fetch, sha256_of

    folder = default_folder(args.traces_dir)
    if args.traces_command == "list":
        for source in SOURCES.values():
            path = folder / source.file
            state = ("absent" if not path.exists()
                     else "present, sha256 ok" if sha256_of(path) == source.sha256 else "present, sha256 differs")
            print(f"{source.name:<11} {source.rows:>6,} requests  {path}: {state}\n"
                  f"{'':<11} {source.url}\n{'':<11} sha256 {source.sha256}")
        return 0
    names = args.names or list(SOURCES)
    paths = fetch(names, folder, mirror=args.mirror, force=args.force,
                  say=lambda line: print(line, file=sys.stderr, flush=True))
    for path in paths:
        print(path)
    return 0
