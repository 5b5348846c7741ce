"""What `run`, `compare` and `sweep` add to their result: the manifest (`metroline.core.experiments.manifest`), the
load check's warnings (`metroline.core.experiments.load_check`: the load, speculation at a load where it costs
TTFT) and the `--report` folder (`core/ab_report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def check_report_folder(args: argparse.Namespace) -> None:
    """Refuse, before a run, a `--report` that is a file, or one whose parent folder is missing."""
    folder = getattr(args, "report", None)
    if folder is None:
        return
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--report: {folder} is a file, not a folder")
    if not path.parent.is_dir():
        raise ValueError(f"--report: {folder}: the folder {path.parent} does not exist")
    try:
        import matplotlib  # noqa: F401 - refused now rather than after the runs
    except ImportError:
        raise ValueError("--report: the plots need matplotlib: pip install 'metroline[report]'") from None


def manifest_for(args: argparse.Namespace, config: Any, run: dict[str, Any], workload: Any,
                 configs: list[Any] | None = None) -> dict[str, Any]:
    """The manifest of the command `args` ran (see `metroline.core.experiments.manifest`)."""
    from ..experiments.manifest import argv_of, build_manifest

    return build_manifest(argv_of(args), config, run, workload, configs=configs,
                          config_file=getattr(args, "config", None))


def warn(check: dict[str, Any] | None) -> None:
    """Print the load check's warning, if it has one, on stderr."""
    if check and check.get("message"):
        print(f"metroline: {check['message']}", file=sys.stderr)



def warn_speculation(config: Any, doc: dict[str, Any], stats: dict[str, Any], label: str = "") -> str | None:
    """Print (on stderr) and return the load check's speculation warning for a run of `config`
    with speculative decoding (`load_check.speculation_message`); None without one."""
    if getattr(config, "speculative_config", None) is None:
        return None
    from ..experiments.load_check import speculation_message

    adaptive = "adaptive_speculation" in [*config.plugins, *str(config.policy).split("+")]
    message = speculation_message(stats, doc.get("summary") or {}, label, adaptive)
    if message:
        print(f"metroline: {message}", file=sys.stderr)
    return message
