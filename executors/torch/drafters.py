"""The torch executor's drafters for speculative decoding: what proposes a step's draft tokens.

`NgramDrafter` is vLLM's `ngram` method (prompt lookup, `metroline.executors.ngram`).
`DraftModelDrafter` is its `draft_model` method: a smaller Hugging Face causal LM with the target's
tokenizer proposes its greedy continuation, `k` tokens, from the sequence's whole context (plain
forwards of the model with its own attention, per sequence: its KV is recomputed, not paged, so it
is a reference drafter for correctness, not for speed). The draft model must not be the target
object itself (the target's attention is metroline's paged one). Both drafts are
deterministic, so sampling the target at each position and accepting while it agrees is exact
speculative sampling (`metroline.core.step.speculation`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.requests.sequence import Sequence
from ...core.speculative_config import SpeculativeConfig
from ...core.step.plan import StepPlan
from ..ngram import ngram_propose


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier match of the context's suffix."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, plan: StepPlan) -> dict[Sequence, list[int]]:
        return {seq: ngram_propose(seq.token_ids, k, self.min_n, self.max_n) for seq, k in plan.drafts.items()}


class DraftModelDrafter:
    """A draft model's greedy continuation of each drafting sequence (see the module docstring)."""

    def __init__(self, model: Any, vocab_size: int) -> None:
        self.model = model.eval()
        if model.config._attn_implementation not in ("eager", "sdpa"):
            model.set_attn_implementation("sdpa")
        self.device = next(model.parameters()).device
        if model.config.vocab_size < vocab_size:
            raise ValueError(
                f"speculative_config.model: the draft model's vocabulary ({model.config.vocab_size}) is smaller "
                f"than the target's ({vocab_size}); it must share the target's tokenizer"
            )
        self.vocab_size = vocab_size

    def propose(self, plan: StepPlan) -> dict[Sequence, list[int]]:
        out = {}
        with torch.inference_mode():
            for seq, k in plan.drafts.items():
                context, drafts = list(seq.token_ids), []
                for _ in range(k):
                    logits = self.model(input_ids=torch.tensor([context], device=self.device)).logits
                    tok = int(logits[0, -1, : self.vocab_size].argmax())
                    drafts.append(tok)
                    context.append(tok)
                out[seq] = drafts
        return out


def make_drafter(config: SpeculativeConfig | None, target: Any, draft_model: Any = None) -> Any:
    """The drafter `config` names for the torch executor `target` (None without speculation);
    `draft_model`: a loaded draft model to use instead of loading `config.model`."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramDrafter(config)
    if draft_model is None:
        from .loader import load

        draft_model = load(config.model, target.dtype, target.device, "sdpa")[0]
    return DraftModelDrafter(draft_model, target.vocab_size)
