"""`TorchExecutor`: a Hugging Face causal LM running metroline's step plans on paged KV.

A step's block ops (copy-on-write copies, swaps) run first, in plan order; then its prefill chunks
and decodes run as one packed forward (batch 1, explicit positions, no padding), and the LM head
runs only on the last token of each sequence in `plan.sample_seqs`. On CPU in float32 the model's
linear layers run through oneDNN on prepacked weights during a step for calls of enough rows (the
crossover with torch's own kernel measured once per machine and cached: `linear.py`; the model object
is otherwise unchanged and keeps serving `generate` with torch's own kernels). Under
`EngineConfig.deterministic` the forward runs with every weight product and attention tile on a
fixed number of rows and with row-by-row sampling (`invariant_step`), so a request's tokens and
logprobs do not depend on its companions.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from ...core.step.plan import StepPlan, StepResult
from ..base import ExecutorStats
from . import attention, invariant_step, linear, support
from .draft_model import draft_kv_bytes_per_token
from .drafters import load_draft_model, make_drafter
from .kv_cache import PagedKVCache, kv_bytes_per_token
from .packing import pack
from .invariant_sampling import RowwiseTorchSampler
from .sampling import TorchSampler

CPU_KV_BUDGET = 1 << 30
"""Default KV budget on CPU (bytes): at most this, and at most a quarter of the machine's memory."""
CUDA_KV_FRACTION = 0.85
"""Default KV budget on CUDA: this fraction of the device memory free once the model is loaded."""


class TorchExecutor:
    """Runs step plans on `model` (a transformers causal LM) on the wall clock.

    The engine calls `bind(config)` once: it allocates the KV blocks the engine's pool describes
    (`num_blocks` of `block_size` tokens, plus `swap_space_blocks` host blocks). `kv_memory`
    (bytes) is the budget `suggest_num_blocks` sizes the pool from when no block count is given.
    """

    name = "torch"
    sample_mode = torch.inference_mode
    """The mode the engine calls the `sample` hook in: the logits are inference tensors, so a
    wrapper that masks them in place (the pre-0.2 way; `ctx.ban_tokens` is the portable one) may."""
    """The default `sample` hook's sampler for this executor's logits tensors."""

    def __init__(
        self, model: Any, tokenizer: Any = None, *, source: str = "model", kv_memory: int | None = None
    ) -> None:
        cfg = model.config
        support.check_class(type(model), cfg)
        support.check_config(cfg)
        model.set_attn_implementation(attention.register())
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = source
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.num_layers, self.num_kv_heads, self.head_dim = support.kv_shape(cfg)
        self.num_heads = cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size
        # the model's context (sliding-window layers mask what they must not see: the window is no
        # limit), shorter only where a length-dependent rope would change its factors
        self.max_model_len, self.max_model_len_reason = support.context_limit(cfg)
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = cfg.eos_token_id
        self.eos_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
        self.kv_bytes_per_token = kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)
        self.kv_memory = kv_memory
        self.ops = attention.attention_ops(self.device)
        support.probe(model, self.num_layers, self.num_kv_heads, self.head_dim, self.ops)
        self.onednn_linears = linear.install(model) if linear.available(self.device, self.dtype) else 0
        if self.onednn_linears:
            linear.calibrate(model)
        self.kv: PagedKVCache | None = None
        self.deterministic = False
        self._invariance_checked = False  # `invariant_step.check_invariance` passed (run once, at the first bind)
        self.drafter: Any = None
        self.draft_model: Any = None  # the draft model of `speculative_config.method = "draft_model"`
        self._draft_source: str | None = None  # what `draft_model` was loaded from (None: given)
        self.stats = ExecutorStats()
        self._t0 = time.perf_counter()

    @property
    def sampler_class(self) -> type[TorchSampler]:
        """The default `sample` hook's sampler for this executor's logits tensors (row by row in
        the deterministic mode)."""
        return RowwiseTorchSampler if self.deterministic else TorchSampler

    @classmethod
    def from_options(
        cls, model: str = "smollm2", dtype: str | None = None, device: str | None = None,
        kv_memory_gb: float | None = None, threads: int | None = None, **unknown: Any,
    ) -> TorchExecutor:
        """Load `model` (a folder, a .gguf or a known name) with `dtype` on `device`, computing
        with `threads` CPU threads (None: `threads.default_threads()`, set before the model loads)."""
        if unknown:
            raise ValueError(f"torch executor: unknown option(s) {', '.join(sorted(unknown))}")
        from . import loader, threads as cpu_threads

        cpu_threads.apply(threads)

        dev = loader.resolve_device(device)
        dt = loader.resolve_dtype(dtype, dev)
        hf_model, tokenizer, folder = loader.load(model, dt, dev, attention.register())
        budget = None if kv_memory_gb is None else int(kv_memory_gb * (1 << 30))
        try:
            return cls(hf_model, tokenizer, source=model, kv_memory=budget)
        except support.UnsupportedModel as e:
            raise support.UnsupportedModel(f"--model: {e}") from None

    # --- the KV pool -------------------------------------------------------------------------

    def kv_budget(self) -> int:
        """The bytes of KV to allocate: `kv_memory` if given, else a device-dependent default."""
        if self.kv_memory is not None:
            return self.kv_memory
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * CUDA_KV_FRACTION)
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 4 * CPU_KV_BUDGET
        return min(CPU_KV_BUDGET, total // 4)

    def prepare_speculation(self, config: Any) -> None:
        """Load the draft model `config` (a `SpeculativeConfig`, or None) names, unless it is the
        one loaded (or one was given as `draft_model`), so that its KV can be counted."""
        if config is None or config.method != "draft_model":
            return
        if self.draft_model is None or (self._draft_source is not None and self._draft_source != config.model):
            self.draft_model = load_draft_model(config, self)
            self._draft_source = config.model

    def pool_bytes_per_token(self, speculative_config: Any = None) -> int:
        """Bytes one slot of a pool block takes: the target's KV and, with a draft model, the
        draft's (`metroline.executors.torch.draft_model`: its KV lives in the same blocks)."""
        if speculative_config is None or speculative_config.method != "draft_model":
            return self.kv_bytes_per_token
        self.prepare_speculation(speculative_config)
        return self.kv_bytes_per_token + draft_kv_bytes_per_token(self.draft_model)

    def suggest_num_blocks(self, block_size: int, speculative_config: Any = None) -> int:
        """How many blocks of `block_size` tokens the KV budget holds, with a draft model's KV
        counted when `speculative_config` names one (`pool_bytes_per_token`)."""
        return max(1, self.kv_budget() // (self.pool_bytes_per_token(speculative_config) * block_size))

    def bind(self, config: Any) -> None:
        """Allocate the KV blocks for an engine's pool (replacing any earlier allocation); the
        clock starts at 0 here. With `config.deterministic`, two more blocks past the pool's: one
        for what the padding rows of `invariant_step` write, and the last, never written, the
        zeros its attention reads in place of keys past a row's position."""
        self.kv = None
        deterministic = bool(getattr(config, "deterministic", False))
        if deterministic:  # (EngineConfig refuses it with speculation)
            self._invariant_ops = invariant_step.attention_ops(self.device)
            if not self._invariance_checked:
                invariant_step.check_invariance(self.model, self._invariant_ops, self.num_layers, self.num_kv_heads,
                                                self.head_dim)
                self._invariance_checked = True
        self.deterministic = deterministic
        self.kv = PagedKVCache(
            self.num_layers, config.num_blocks + 2 * self.deterministic, config.block_size, self.num_kv_heads,
            self.head_dim, self.dtype, self.device, config.swap_space_blocks,
        )
        self.drafter = None
        spec = getattr(config, "speculative_config", None)
        if spec is not None:
            self.prepare_speculation(spec)
            self.drafter = make_drafter(spec, self, self.draft_model)
            self.drafter.bind(config)
        self.stats = ExecutorStats()
        self._t0 = time.perf_counter()

    def close(self) -> None:
        """Free the KV blocks, the draft model's with them (and the CUDA cache)."""
        self.kv = None
        self.drafter = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- the clock and the step --------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def idle_until(self, t: float) -> None:
        wait = t - self.now()
        if wait > 0:
            time.sleep(wait)
            self.stats.record_idle(wait)

    def execute(self, plan: StepPlan) -> StepResult:
        if self.kv is None:
            raise RuntimeError("TorchExecutor.execute before bind(config): no KV blocks allocated")
        start = self.now()
        with torch.inference_mode():
            if plan.block_ops:
                self.kv.run_block_ops(plan.block_ops)
                if self.drafter is not None:
                    self.drafter.run_block_ops(plan.block_ops)
            # a draft model writes its KV for every step's tokens, drafting or not
            drafts = self.drafter.propose(plan) if self.drafter is not None and plan.scheduled else None
            logits = self._forward(plan, drafts) if plan.scheduled else None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = self.now()
        self.stats.record(plan, end - start)
        if plan.drafts:  # the rows after the sampled ones verify the drafts
            n = len(plan.sample_seqs)
            return StepResult(end, logits[:n], draft_tokens=drafts, draft_logits=logits[n:])
        return StepResult(end, logits)

    def _forward(self, plan: StepPlan, drafts: dict | None = None) -> torch.Tensor:
        """The packed forward; a drafting sequence's tokens are its newest and its `drafts`, and
        the rows kept are each sample sequence's last known token, then each draft (in order).
        In the deterministic mode (which refuses speculation), `invariant_step` runs the forward."""
        if self.deterministic:
            return invariant_step.forward_tiles(self.model, plan, self.kv, self._invariant_ops,
                                                self.kv.num_blocks - 2)
        entries = []
        last_row: dict[Any, int] = {}
        row = 0
        for seq, n in plan.scheduled.items():
            first = seq.num_computed_tokens
            proposed = drafts.get(seq) if drafts else None
            tokens = seq.token_ids[first:first + n] if proposed is None else [seq.token_ids[first], *proposed]
            entries.append((tokens, first, seq.block_table))
            last_row[seq] = row + len(tokens) - 1 if proposed is None else row
            row += len(tokens)
        packed = pack(entries, plan.block_size, self.device, self.kv.k_layers, self.kv.v_layers, self.ops)
        rows = [last_row[s] for s in plan.sample_seqs]
        if drafts:
            rows += [last_row[s] + 1 + j for s, d in drafts.items() for j in range(len(d))]
        keep = torch.tensor(rows, dtype=torch.int64, device=self.device)
        with attention.active_step(packed.meta), linear.active():
            out = self.model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False,
                             logits_to_keep=keep)
        return out.logits[0].float()

    def plugins(self) -> list[Any]:
        """The plugins this executor brings (`Engine` stacks them): structured outputs on its
        logits (`plugins_contrib/structured_output.py`), built with its tokenizer, vocabulary and
        EOS token; llguidance is imported only when a request asks for one."""
        from ...plugins_contrib.structured_output import StructuredOutputSampler

        return [StructuredOutputSampler(self.tokenizer, self.vocab_size, self.eos_token_id)]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "cost_model": None,
            "model": self.source,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "attention": self.ops.__name__.rsplit(".", 1)[-1],
            "linear": "onednn" if self.onednn_linears else "torch",
            "linear_onednn_min_rows": linear.min_rows() if self.onednn_linears else None,
            "threads": torch.get_num_threads() if self.device.type == "cpu" else None,
            "deterministic": self.deterministic,
            **self.stats.as_dict(),
        }


def from_options(**options: Any) -> TorchExecutor:
    """The `torch` entry point of the `metroline.executors` group."""
    return TorchExecutor.from_options(**options)
