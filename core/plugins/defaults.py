"""The defaults every engine registers first (lowest precedence), so that a policy only implements
the hooks it cares about.

- `admission`: swapped, then waiting sequences, each in the order they got there (head-of-line),
  walked lazily (`queued_in_order`: no copy of the queues);
- `select_victim`: for a running requester, the running sequence admitted last; never preempts a
  running sequence for a waiting one;
- `split_budget`: decodes first (one token each), the rest of the budget to prefill, chunks capped
  at `max_prefill_chunk` when the step starts with more than one request (`EngineConfig.chunk_cap`);
- `order_running`: admission order;
- `num_draft_tokens`: `max_drafts` for every decode (speculative decoding's fixed `k`);
- `sample`: stand-in tokens in simulation (skipping tokens a wrapper banned); otherwise, on
  `ctx.adjusted_logits(logits)`, `metroline.core.requests.sampling.Sampler` (greedy,
  temperature, top-k/top-p/min-p, penalties, seeds; vectorised when the logits are a tensor).
"""

from __future__ import annotations

from typing import Any

from ..requests.sequence import Sequence
from ..step.context import StepContext
from .budget import Split
from .hookspecs import hookimpl
from .queue_order import queued_in_order
from .victims import last_admitted_victim


def stand_in_token(seq: Sequence) -> int:
    """A deterministic token for simulation: distinct across sequences and positions, never 0."""
    return 1 + (seq.arrival_no * 7919 + seq.index * 104729 + len(seq.token_ids) * 31) % 30000


def _allowed_stand_in(ctx: StepContext, seq: Sequence) -> int:
    """`stand_in_token(seq)`, or the next token up that no wrapper banned for `seq` this step."""
    tok = stand_in_token(seq)
    banned = ctx.banned_tokens(seq)
    while tok in banned:
        tok += 1
    return tok


class DefaultPolicy:
    name = "defaults"
    options_internal = True
    """Its constructor's `sampler_class` comes from the executor, not from a user: `metroline
    plugins` lists no options for it."""

    def __init__(self, sampler_class: Any = None) -> None:
        self._sampler: Any = None
        self._sampler_class = sampler_class

    @hookimpl(trylast=True)
    def admission(self, ctx: StepContext) -> Any:
        return queued_in_order(ctx.swapped, ctx.waiting)

    @hookimpl(trylast=True)
    def select_victim(self, ctx: StepContext, requester: Sequence) -> Sequence | None:
        return last_admitted_victim(ctx, requester)

    @hookimpl(trylast=True)
    def split_budget(self, ctx: StepContext, budget: int, num_decoding: int, num_prefilling: int,
                     num_waiting: int) -> Split:
        decode = min(budget, num_decoding)
        return Split(decode, budget - decode, ctx.config.chunk_cap(num_decoding + num_prefilling + num_waiting))

    @hookimpl(trylast=True)
    def order_running(self, running: list[Sequence]) -> list[Sequence]:
        return running

    @hookimpl(trylast=True)
    def num_draft_tokens(self, decodes: list[Sequence], max_drafts: int) -> list[int]:
        return [max_drafts] * len(decodes)

    @hookimpl(trylast=True)
    def sample(self, ctx: StepContext, seqs: list[Sequence], logits: Any, eos_token_id: int | None) -> list[int]:
        if logits is None:
            if ctx._masks is None or not ctx._masks.banned:  # the hot path: no wrapper banned a token
                return [stand_in_token(s) for s in seqs]
            return [_allowed_stand_in(ctx, s) for s in seqs]
        logits = ctx.adjusted_logits(logits)  # the bans and biases of the wrappers above
        if self._sampler is None:
            from ..requests.sampling import Sampler

            cls = self._sampler_class
            if cls is None and hasattr(logits, "dim"):
                cls = _tensor_sampler_without_sampler_class()
            self._sampler = (cls or Sampler)(ctx.config.seed)
        return self._sampler.sample(seqs, logits, eos_token_id)


def _tensor_sampler_without_sampler_class() -> Any:
    """The torch sampler for an executor that returns logits tensors but names no `sampler_class`
    (before 0.2.0 the core sampled tensors itself): kept working, with a deprecation warning."""
    import importlib
    import warnings

    from .deprecations import MetrolineDeprecationWarning

    warnings.warn(
        "the executor returns logits tensors but has no sampler_class: set sampler_class = "
        "metroline.executors.torch.sampling.TorchSampler on it (the fallback will be removed in 0.3.0)",
        MetrolineDeprecationWarning, stacklevel=4,
    )
    return importlib.import_module("metroline.executors.torch.sampling").TorchSampler
