"""`metroline replay FILE`: rerun the command a result document's manifest records and say
whether the result matches (see `metroline.core.experiments.replay_check`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def cmd_replay(args: argparse.Namespace, rerun: Callable[[list[str], Path], None]) -> int:
    """Exit status 0 when the rerun's result is identical (the environment may differ), 1 when not."""
    from ..experiments.replay_check import replay_file

    outcome = replay_file(args.file, rerun)
    print(outcome.describe(args.file))
    return 0 if outcome.result_identical else 1
