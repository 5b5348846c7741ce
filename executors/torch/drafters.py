"""The torch executor's drafters for speculative decoding: what proposes a step's draft tokens.

`NgramDrafter` is vLLM's `ngram` method (prompt lookup, `metroline.executors.ngram`).
`DraftModelDrafter` (`metroline.executors.torch.draft_model`) is its `draft_model` method: a
smaller causal LM with the target's tokenizer proposes its greedy continuation, `k` tokens, its KV
in the target's paged pool. Both drafts are deterministic, so sampling the target at each position and accepting while it agrees is exact
speculative sampling (`metroline.core.step.speculation`).
"""

from __future__ import annotations

from typing import Any

from ...core.requests.sequence import Sequence
from ...core.speculative_config import SpeculativeConfig
from ...core.step.plan import StepPlan
from ..ngram import ngram_propose
from .draft_model import DraftModelDrafter


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier match of the context's suffix."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def bind(self, config: Any) -> None:
        """Nothing to allocate: lookup keeps no KV."""

    def run_block_ops(self, block_ops: list[tuple[int, int, int]]) -> None:
        """Nothing to move: lookup keeps no KV."""

    def propose(self, plan: StepPlan) -> dict[Sequence, list[int]]:
        """Each drafting decode's lookup drafts (up to its `k`; none in a step without drafts)."""
        return {seq: ngram_propose(seq.token_ids, k, self.min_n, self.max_n) for seq, k in plan.drafts.items()}


def make_drafter(config: SpeculativeConfig | None, target: Any, draft_model: Any = None) -> Any:
    """The drafter `config` names for the torch executor `target` (None without speculation);
    `draft_model`: a loaded draft model to use instead of loading `config.model`."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramDrafter(config)
    if draft_model is None:
        draft_model = load_draft_model(config, target)
    return DraftModelDrafter(draft_model, target)


def load_draft_model(config: SpeculativeConfig, target: Any) -> Any:
    """`config.model` loaded with the target's dtype on its device."""
    from . import attention
    from .loader import load

    return load(config.model, target.dtype, target.device, attention.register())[0]
