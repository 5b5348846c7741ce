"""Speculative decoding in the simulator: which drafts are accepted, and what drafting costs.

`AcceptanceModel` decides how many of a sequence's `k` drafts the target accepts: draft `j` of a
run (the one for output position `p`) is accepted when the ones before it were and a uniform draw
keyed on (seed, request id, sample index, `p`) falls below the request's acceptance probability at
that place in the run (`SpeculativeConfig.acceptance_rate`, a per-request Beta draw, the workload's
`metadata["acceptance_rate"]`, or `acceptance_by_position`). The draws depend on neither the
batch nor `k`, so two runs of a workload (an A/B of policies or of speculation settings) see the
same acceptances: paired comparisons.

`draft_time` is the drafter's time in a step: for a draft model, one forward per draft position
over the decodes drafting that far, each costed by the run's own cost model as a decode step of
those sequences, times `draft_cost_ratio`; n-gram lookup costs nothing (ratio 0).
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from ..core.requests.sampling import _mix64
from ..core.requests.sequence import Sequence
from ..core.speculative_config import SpeculativeConfig
from ..core.step.plan import StepPlan

_TWO_64 = float(1 << 64)


class AcceptanceModel:
    """Seeded acceptance of drafts, fixed per request and position (see the module docstring)."""

    __slots__ = ("config", "seed", "_rates")

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.seed = _mix64(config.seed & ((1 << 64) - 1))
        self._rates: dict[tuple[str, int], float] = {}

    def _key(self, seq: Sequence) -> int:
        return _mix64(self.seed ^ zlib.crc32(seq.request_id.encode()) ^ (seq.index << 32))

    def rate(self, seq: Sequence) -> float:
        """The request's acceptance probability (the same for every run with this config)."""
        given = seq.metadata.get("acceptance_rate")
        if isinstance(given, (int, float)) and not isinstance(given, bool) and 0 <= given <= 1:
            return float(given)
        c = self.config.acceptance_concentration
        mean = self.config.acceptance_rate
        if c is None or mean in (0.0, 1.0):
            return mean
        key = (seq.request_id, seq.index)
        rate = self._rates.get(key)
        if rate is None:
            rate = self._rates[key] = random.Random(self._key(seq)).betavariate(mean * c, (1 - mean) * c)
        return rate

    def accepted(self, seq: Sequence, k: int) -> int:
        """How many of `seq`'s `k` drafts this step (its next output positions) are accepted."""
        by_pos = self.config.acceptance_by_position
        rate = self.rate(seq) if by_pos is None else 0.0
        key = self._key(seq)
        first = len(seq.token_ids)  # the position of the first draft
        for j in range(k):
            p = rate if by_pos is None else by_pos[min(j, len(by_pos) - 1)]
            if _mix64(key ^ _mix64(first + j)) / _TWO_64 >= p:
                return j
        return k


def draft_time(plan: StepPlan, cost_model: Any, ratio: float) -> float:
    """Seconds the draft model's forwards take for `plan`'s drafts (0 when `ratio` is 0)."""
    if not ratio or not plan.drafts:
        return 0.0
    total = 0.0
    remaining = dict(plan.drafts)
    while remaining:
        forward = StepPlan(plan.step, plan.block_size)  # one decode token per drafting sequence
        for seq in remaining:
            forward.scheduled[seq] = 1
            forward.decodes.add(seq)
            forward.num_context_tokens += seq.num_computed_tokens + 1
        forward.num_decode_tokens = len(remaining)
        total += cost_model.step_time(forward)
        remaining = {s: k - 1 for s, k in remaining.items() if k > 1}
    return ratio * total
