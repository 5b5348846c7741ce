"""Deterministic stand-in models for the sampling tests: executors that return real logits tensors
computed from each sequence's tokens (so the engine's real sampler and detokenizer run on them),
and a small byte-level BPE tokenizer trained offline."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from metroline.core.step.plan import StepPlan, StepResult
from metroline.executors.torch.sampling import TorchSampler


class _Clocked:
    name = "stand-in"
    sampler_class = TorchSampler  # logits tensors: the torch sampler samples them

    def __init__(self, vocab_size: int, tokenizer: Any = None, eos_token_id: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self._clock = 0.0

    def now(self) -> float:
        return self._clock

    def idle_until(self, t: float) -> None:
        self._clock = max(self._clock, t)

    def describe(self) -> dict:
        return {"name": self.name, "cost_model": None}

    def execute(self, plan: StepPlan) -> StepResult:
        self._clock += 0.01
        seqs = plan.sample_seqs
        if not seqs:
            return StepResult(self._clock, torch.empty(0, self.vocab_size))
        return StepResult(self._clock, self.logits(seqs))


class LinearModel(_Clocked):
    """Next-token logits = W[last token] + U[number of tokens % 8], with W and U fixed random
    matrices: a real (tiny) computation on the token history, row by row, so a sequence's logits
    never depend on the rest of the batch."""

    name = "linear"

    def __init__(self, vocab_size: int = 64, seed: int = 0, **kw: Any) -> None:
        super().__init__(vocab_size, **kw)
        gen = torch.Generator().manual_seed(seed)
        self.w = 2.0 * torch.randn(vocab_size, vocab_size, generator=gen)
        self.u = torch.randn(8, vocab_size, generator=gen)

    def logits(self, seqs: list) -> torch.Tensor:
        last = torch.tensor([s.token_ids[-1] for s in seqs])
        pos = torch.tensor([len(s.token_ids) % 8 for s in seqs])
        return self.w[last] + self.u[pos]


class ScriptedModel(_Clocked):
    """Greedy-friendly logits that spell `script` (token ids) after any prompt, then EOS: the
    logit of the script's next token is 10, every other one 0."""

    name = "scripted"

    def __init__(self, script: list[int], tokenizer: Any, eos_token_id: int) -> None:
        super().__init__(len(tokenizer), tokenizer=tokenizer, eos_token_id=eos_token_id)
        self.script = script

    def logits(self, seqs: list) -> torch.Tensor:
        out = torch.zeros(len(seqs), self.vocab_size)
        for i, s in enumerate(seqs):
            k = len(s.token_ids) - s.num_prompt_tokens
            out[i, self.script[k] if k < len(self.script) else self.eos_token_id] = 10.0
        return out


CORPUS = ["the cat sat on the mat.", "the dog sat on the log.", "a cat and a dog met on a mat."]
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@lru_cache(maxsize=1)
def bpe_tokenizer() -> Any:
    """A byte-level BPE tokenizer (transformers' `PreTrainedTokenizerFast`) trained on `CORPUS`:
    its words are whole tokens, characters outside the corpus (é, emoji) are byte tokens; `<eos>`
    is id 0. It has a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast
