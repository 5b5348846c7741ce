"""`Queues`: the scheduler's long-lived state: who runs, who waits, who is swapped out.

Every phase of the step (`metroline.core.step.admission`, `metroline.core.step.victim_loop`, the
fork in `metroline.core.step.scheduler`) moves sequences between these queues, and only through
`start_running` and `stop_running`, which keep `fork_slots` and the admission numbers right.
"""

from __future__ import annotations

from ..requests.sequence import RUNNING, Sequence
from .forking import unforked


class Queues:
    """The three queues of sequences (ordered dicts used as ordered sets: `running` in admission
    order, `waiting` and `swapped` in the order they got there), with

    - `fork_slots`: the running slots held for the children of running `n > 1` parents that have
      not forked yet (they count against `max_num_seqs` before they exist);
    - `admissions`: how many sequences were ever admitted (each admitted one gets the next number
      as `admitted_seq_no`).
    """

    __slots__ = ("running", "waiting", "swapped", "fork_slots", "admissions")

    def __init__(self) -> None:
        self.running: dict[Sequence, None] = {}
        self.waiting: dict[Sequence, None] = {}
        self.swapped: dict[Sequence, None] = {}
        self.fork_slots = 0
        self.admissions = 0

    def start_running(self, seq: Sequence) -> None:
        """`seq` (admitted, or a fresh child of a parent that forks) runs from now on."""
        seq.state = RUNNING
        self.running[seq] = None
        self.fork_slots += unforked(seq)
        self.admissions += 1
        seq.admitted_seq_no = self.admissions

    def stop_running(self, seq: Sequence) -> None:
        """`seq` leaves `running` (preempted, or reaped); the slots held for its children go."""
        del self.running[seq]
        self.fork_slots -= unforked(seq)

    def forked(self, parent: Sequence, children: list[Sequence]) -> None:
        """`parent` forked into `children` (already running): the slots held for them are taken."""
        self.fork_slots -= unforked(parent)
        parent.children = children
        for child in children:
            self.start_running(child)

    def slots_taken(self) -> int:
        """Running slots in use: the running sequences and the children still to be forked."""
        return len(self.running) + self.fork_slots
