"""`adaptive_speculation`: fewer draft tokens as the batch grows, and for requests whose drafts fail.

Speculation trades compute for steps: a decode that carries `k` drafts costs the target `1 + k`
tokens of work to advance by its accepted drafts plus one. At batch 1 a decode step is bound by
reading the weights, and the drafts ride along almost free; as the batch grows the step becomes
bound by compute and every rejected draft is work that delays everyone (and takes budget a
prefill could have used). So, with `speculative_config` set (it stacks on any policy):

- the batch: `by_batch_size`, a table of `[batch size, most drafts]` rows (vLLM's draft count by
  batch size): from that many running decodes on, each carries at most that many drafts. The
  default, for `num_speculative_tokens = K`: all `K` below 8 decodes, `ceil(K / 2)` from 8, 1
  from 32, none from 64 on.
- the request: its acceptance so far, `a = (accepted + prior * prior_rate) / (drafted + prior)`
  (`seq.num_accepted_tokens`, `seq.num_draft_tokens`; the prior keeps a new request at
  `prior_rate`). Draft `j` is accepted with probability about `a ** j`; it is drafted only while
  that is at least `min_gain`, so a request whose drafts keep failing gets none, and one whose
  drafts pass gets the batch's most.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, field_validator

from metroline.api import PluginOptions, Sequence, hookimpl, take_options


def default_table(max_drafts: int) -> list[list[int]]:
    """The default `by_batch_size` for `max_drafts` (see the module docstring)."""
    return [[1, max_drafts], [8, max(1, -(-max_drafts // 2))], [32, 1], [64, 0]]


class AdaptiveSpeculation:
    """`adaptive_speculation`: answers `num_draft_tokens` from the batch size and each request's
    measured acceptance (see the module docstring). Options: `AdaptiveSpeculation.Options`."""

    name = "adaptive_speculation"

    class Options(PluginOptions):
        """`[plugin_options.adaptive_speculation]`."""

        by_batch_size: list[list[int]] | None = Field(
            default=None,
            description="rows [batch size, most drafts], batch sizes increasing: from that many decodes on, "
            "at most that many drafts each (None: the default table for num_speculative_tokens)",
        )
        min_gain: float = Field(
            default=0.25, gt=0, le=1, allow_inf_nan=False,
            description="draft j only while the request's acceptance ** j is at least this",
        )
        prior_rate: float = Field(default=0.7, gt=0, lt=1, allow_inf_nan=False,
                                  description="a new request's assumed acceptance rate")
        prior: float = Field(default=4.0, ge=0, allow_inf_nan=False,
                             description="how many draft tokens the prior weighs as")

        @field_validator("by_batch_size")
        @classmethod
        def _table(cls, rows: list[list[int]] | None) -> list[list[int]] | None:
            if rows is None:
                return None
            if not rows:
                raise ValueError("by_batch_size needs at least one row")
            last = 0
            for row in rows:
                if len(row) != 2 or row[0] < 1 or row[1] < 0:
                    raise ValueError(f"by_batch_size row {row}: expected [batch size >= 1, drafts >= 0]")
                if row[0] <= last:
                    raise ValueError(f"by_batch_size: batch sizes must increase, {row[0]} after {last}")
                last = row[0]
            return rows

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options = take_options(self, args, kwargs)
        self._table: list[list[int]] | None = self.options.by_batch_size
        self._log_gain = math.log(self.options.min_gain)

    def drafts_for_batch(self, batch: int, max_drafts: int) -> int:
        """The most drafts a decode carries in a batch of `batch` decodes."""
        table = self._table if self._table is not None else default_table(max_drafts)
        most = max_drafts
        for size, drafts in table:
            if batch < size:
                break
            most = drafts
        return min(most, max_drafts)

    def drafts_for(self, seq: Sequence, most: int) -> int:
        """At most `most` drafts for `seq`, as its acceptance so far earns (see the module docstring)."""
        o = self.options
        rate = (seq.num_accepted_tokens + o.prior * o.prior_rate) / (seq.num_draft_tokens + o.prior)
        if rate >= 1.0:
            return most
        if rate <= 0.0:
            return 0
        return min(most, int(self._log_gain / math.log(rate) + 1e-9))

    @hookimpl
    def num_draft_tokens(self, decodes: list[Sequence], max_drafts: int) -> list[int]:
        most = self.drafts_for_batch(len(decodes), max_drafts)
        if most == 0:
            return [0] * len(decodes)
        return [self.drafts_for(s, most) for s in decodes]
