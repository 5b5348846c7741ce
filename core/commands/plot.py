"""`metroline plot FILE... [--out DIR]`: PNG plots from result documents already written with
`--json` (`core/ab_report/result_plots.py`), nothing run again."""

from __future__ import annotations

import argparse
from typing import Any


def add_plot_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `plot` command and its flags to the CLI's subparsers `sub`."""
    p = sub.add_parser("plot", help="draw PNG plots from result documents written with --json (run, compare, "
                       "compare --seeds, sweep), without running anything again")
    p.add_argument("files", nargs="+", metavar="FILE", help="result documents (JSON) written by --json")
    p.add_argument("--out", metavar="DIR", default=".",
                   help="the folder the PNG files go to, named after each document (default: the working directory)")
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    """Draw each file's plots; print the path of each PNG written."""
    from ..ab_report.result_plots import plot_file

    for source in args.files:
        for path in plot_file(source, args.out):
            print(path)
    return 0
