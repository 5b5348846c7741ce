"""`Outcome`: how the admission of one candidate ended (`metroline.core.step.admission`)."""

from __future__ import annotations

from enum import Enum


class Outcome(Enum):
    """How the admission of one candidate (waiting or swapped) ended."""

    ADMITTED = "admitted"
    """It runs now (with its first tokens scheduled, unless a swapped one got its own blocks back
    but not the next token's)."""
    BLOCKED = "blocked"
    """It does not fit (its blocks, or no tokens for it): under head-of-line admission stops,
    otherwise the next candidate is tried."""
    STOP = "stop"
    """Nothing more can be admitted in this step (no slot the policy would free, or no prefill
    budget)."""


ADMITTED, BLOCKED, STOP = Outcome.ADMITTED, Outcome.BLOCKED, Outcome.STOP
