"""Incremental detokenisation: a sequence's output text, grown one token at a time, and its stop
strings, matched across token boundaries.

Decoding each new token alone gives the wrong text (a BPE token may be half of a UTF-8 character;
a SentencePiece token's leading space depends on what comes before). As vLLM does, each step
decodes a short window of the newest tokens twice, with and without the new one, and appends the
difference; text that ends in an incomplete character (U+FFFD) waits for the next token. The
window starts a few prompt tokens back, so the first output token sees its left context.
"""

from __future__ import annotations

from typing import Any

from .sequence import Sequence

CONTEXT_TOKENS = 5
"""Prompt tokens decoded before the first output token (its left context)."""


class DetokState:
    """A sequence's detokenised output so far (`text`) and the token window of the next decode."""

    __slots__ = ("text", "prefix_offset", "read_offset")

    def __init__(self, num_prompt_tokens: int) -> None:
        self.text = ""
        self.prefix_offset = max(num_prompt_tokens - CONTEXT_TOKENS, 0)
        self.read_offset = num_prompt_tokens


class Detokenizer:
    """Keeps `seq.detok` (a `DetokState`) up to date as tokens are appended to `seq.token_ids`.

    `tokenizer`: anything with Hugging Face's `decode(ids, skip_special_tokens=...)`. Special
    tokens (EOS, chat markers) are left out of the text.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens

    def append(self, seq: Sequence, stop: tuple[str, ...] = ()) -> bool:
        """Detokenise the newest token of `seq`; when one of the `stop` strings now appears in the
        text, cut the text where the earliest one begins and return True."""
        state = seq.detok
        if state is None:
            state = seq.detok = DetokState(seq.num_prompt_tokens)
        ids = seq.token_ids
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix = decode(ids[state.prefix_offset:state.read_offset], skip_special_tokens=skip)
        full = decode(ids[state.prefix_offset:], skip_special_tokens=skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False
        new_text = full[len(prefix):]
        state.prefix_offset = state.read_offset
        state.read_offset = len(ids)
        old_len = len(state.text)
        state.text += new_text
        if not stop:
            return False
        cut = find_stop(state.text, stop, old_len)
        if cut is None:
            return False
        state.text = state.text[:cut]
        return True


def find_stop(text: str, stop: tuple[str, ...], old_len: int) -> int | None:
    """Where the earliest of the `stop` strings begins in `text`, given that none was in
    `text[:old_len]`; None if none is there."""
    best = None
    for s in stop:
        i = text.find(s, max(0, old_len - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best
