"""An observer plugin that counts preemption victims: how many, how many had been preempted
before, and the tokens they had computed when preempted (what a recompute throws away before the
prefix cache gives any of it back), printed to stderr when the process exits.

Run:  PYTHONPATH=bench metroline run ... --plugin victim_stats:VictimStats
"""

from __future__ import annotations

import atexit
import sys

from metroline.api import Sequence, hookimpl


class VictimStats:
    """Counts the sequences `on_preempted` reports (see the module docstring)."""

    name = "victim_stats"

    def __init__(self) -> None:
        self.victims = 0
        self.repeat_victims = 0
        self.lost_tokens = 0
        atexit.register(self.report)

    @hookimpl
    def on_preempted(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.victims += 1
            self.repeat_victims += s.num_preemptions >= 2  # counted already for this preemption
            self.lost_tokens += s.num_lost_tokens  # its computed tokens when preempted (an engine field)

    def report(self) -> None:
        print(f"victims {self.victims}, preempted before {self.repeat_victims}, "
              f"computed tokens thrown away {self.lost_tokens}", file=sys.stderr)
