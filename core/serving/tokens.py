"""Text in and out of the server: the model's tokenizer when the executor has one, and stand-ins
for the simulated executor.

In simulation there is no vocabulary: a prompt's tokens are its UTF-8 bytes (so its length in
tokens is its length in bytes), and an output token is rendered as its id after a space (the
output text of tokens 17, 4 is `" 17 4"`). The stand-in tokens of a request depend only on that
request's own tokens (`ContentTokens`), as greedy tokens of a real model do, so a request gets the
same tokens whatever else the server is running.
"""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import hookimpl
from ..requests.sequence import Sequence


class StandInTokenizer:
    """The simulated executor's tokenizer: bytes in, ids rendered as text out."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join([f" {i}" for i in ids])

    def chat_prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        text = "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"
        return self.encode(text)


class HFTokenizer:
    """A Hugging Face tokenizer: its chat template, and decoding without special tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.eos_token_id = getattr(tokenizer, "eos_token_id", None)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        conv = [{"role": r, "content": c} for r, c in messages]
        ids = self.tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)


def tokenizer_for(executor: Any) -> Any:
    """The executor's tokenizer (`executor.tokenizer`) wrapped for the server (a stand-in one as
    it is), else stand-ins."""
    tok = getattr(executor, "tokenizer", None)
    if tok is None:
        return StandInTokenizer()
    return tok if isinstance(tok, StandInTokenizer) else HFTokenizer(tok)


class ContentTokens:
    """Stand-in tokens that depend only on the sequence's own tokens and its sample index (so the
    `n` samples of one request differ, and the first is what the request gets with `n = 1`).
    Simulation only: it answers `sample` when there are no logits, and defers to the other
    samplers otherwise."""

    name = "content_tokens"

    @hookimpl
    def sample(self, seqs: list[Sequence], logits: Any) -> list[int] | None:
        if logits is not None:
            return None
        out = []
        for seq in seqs:
            ids = seq.token_ids
            h = len(ids) + 7919 * seq.index
            for t in ids[-4:]:
                h = ((h * 1_000_003) ^ t) & 0xFFFFFFFF
            out.append(1 + h % 30000)
        return out
