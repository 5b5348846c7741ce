"""`DraftModelDrafter`: vLLM's `draft_model` method, a smaller causal LM on the target's paged KV pool.

The draft model runs on metroline's paged attention with KV tensors of its own shape (its layers,
KV heads, head size) but the pool's blocks: block `b` of the draft's KV holds the same token
positions as block `b` of the target's, through the same block tables. So the draft's KV is in the
pool's accounting (`TorchExecutor.kv_bytes_per_token` counts both models' bytes per token, and the
pool's block count sizes both), is freed with its blocks when a request finishes, is aborted or is
preempted, is copied by copy-on-write and moved by swaps (`run_block_ops`, with the target's), and
is shared with prefix hits: the draft keeps no state per request.

It keeps one invariant: the draft's KV holds every position the target's does. Every step, its
first forward mirrors the target's (the same prefill chunks and decodes, at the same slots), with
a drafting decode bringing only its newest token, whose row proposes draft 1; forward `j` feeds
draft `j - 1` and proposes draft `j`; one more forward writes the last draft's KV (logits
unused), so the draft's KV covers the `1 + k` positions the target verifies. The rejected
positions are rolled back with the target's (the same slots). The drafts are the draft model's
greedy choices, deterministic, so accepting while the target's sampled token agrees is exact
speculative sampling (`metroline.core.step.speculation`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...core.requests.sequence import Sequence
from ...core.step.plan import StepPlan
from . import attention, linear, support
from .kv_cache import PagedKVCache, kv_bytes_per_token
from .packing import pack


def draft_kv_bytes_per_token(model: Any) -> int:
    """Bytes of the draft model's KV per token (what a pool block holds for it per slot)."""
    num_layers, num_kv_heads, head_dim = support.kv_shape(model.config)
    return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, next(model.parameters()).dtype)


class DraftModelDrafter:
    """A draft model's greedy drafts, its KV in the target's pool blocks (see the module docstring).

    `model`: a Hugging Face causal LM of an architecture the torch executor runs (the support
    matrix; it may be the target model itself), with at least the target's vocabulary."""

    def __init__(self, model: Any, target: Any) -> None:
        cfg = model.config
        try:
            support.check_class(type(model), cfg)
            support.check_config(cfg)
            self.num_layers, self.num_kv_heads, self.head_dim = support.kv_shape(cfg)
        except support.UnsupportedModel as e:
            raise support.UnsupportedModel(f"speculative_config.model: {e}") from None
        if cfg.vocab_size < target.vocab_size:
            raise ValueError(
                f"speculative_config.model: the draft model's vocabulary ({cfg.vocab_size}) is smaller "
                f"than the target's ({target.vocab_size}); it must share the target's tokenizer"
            )
        model.set_attn_implementation(attention.register())
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.ops = attention.attention_ops(self.device)
        try:
            support.probe(model, self.num_layers, self.num_kv_heads, self.head_dim, self.ops)
        except support.UnsupportedModel as e:
            raise support.UnsupportedModel(f"speculative_config.model: {e}") from None
        if linear.available(self.device, self.dtype):
            linear.install(model)
        self.max_model_len = support.context_limit(cfg)[0]
        self.vocab_size = target.vocab_size
        self.target_max_len = target.max_model_len
        self.kv_bytes_per_token = draft_kv_bytes_per_token(model)
        self.kv: PagedKVCache | None = None

    def bind(self, config: Any) -> None:
        """Allocate the draft's KV for the engine's pool: `config.num_blocks` blocks (and the swap
        space's host blocks), the target's block ids."""
        longest = min(config.max_model_len, self.target_max_len or config.max_model_len)
        if self.max_model_len is not None and longest > self.max_model_len:
            raise ValueError(
                f"speculative_config.model: the draft model's context ({self.max_model_len} tokens) is shorter "
                f"than the target's sequences may grow ({longest}: max_model_len and the target's context); "
                f"lower max_model_len or pick another draft model"
            )
        self.kv = None
        self.kv = PagedKVCache(self.num_layers, config.num_blocks, config.block_size, self.num_kv_heads,
                               self.head_dim, self.dtype, self.device, config.swap_space_blocks)

    def run_block_ops(self, block_ops: list[tuple[int, int, int]]) -> None:
        """The step's copies and swaps, on the draft's KV (the target's run the same ones)."""
        self.kv.run_block_ops(block_ops)

    def propose(self, plan: StepPlan) -> dict[Sequence, list[int]]:
        """Write the draft's KV for the step's tokens and return each drafting decode's drafts
        (exactly its `k` of `plan.drafts`)."""
        drafting = plan.drafts
        entries, rows, row = [], [], 0
        for seq, n in plan.scheduled.items():
            first = seq.num_computed_tokens
            tokens = seq.token_ids[first:first + (1 if seq in drafting else n)]
            entries.append((tokens, first, seq.block_table))
            row += len(tokens)
            if seq in drafting:
                rows.append(row - 1)
        out: dict[Sequence, list[int]] = {s: [] for s in drafting}
        proposed = self._forward(entries, plan.block_size, rows)
        for seq, tok in zip(drafting, proposed):
            out[seq].append(tok)
        step = 1
        while True:  # feed draft `step` of every sequence that has it; propose where more are due
            feeding = [s for s, k in drafting.items() if k >= step]
            if not feeding:
                return out
            entries = [([out[s][-1]], s.num_computed_tokens + step, s.block_table) for s in feeding]
            wanted = [(i, s) for i, s in enumerate(feeding) if drafting[s] > step]
            proposed = self._forward(entries, plan.block_size, [i for i, _ in wanted])
            for (_, seq), tok in zip(wanted, proposed):
                out[seq].append(tok)
            step += 1

    def _forward(self, entries: list, block_size: int, rows: list[int]) -> list[int]:
        """One packed forward of the draft model; the greedy token of each row in `rows`."""
        packed = pack(entries, block_size, self.device, self.kv.k_layers, self.kv.v_layers, self.ops)
        keep = torch.tensor(rows or [0], dtype=torch.int64, device=self.device)
        with attention.active_step(packed.meta), linear.active():
            logits = self.model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False,
                                logits_to_keep=keep).logits[0]
        return logits[:, : self.vocab_size].argmax(-1).tolist() if rows else []
